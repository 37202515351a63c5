package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/watermill-outbox/outbox"
)

// replayDelivery is one message the test relay's handler received.
type replayDelivery struct {
	id, key, replayOf, replayID string
	seq                         int64
}

// replaySink consumes a subscription, acking everything except the events of key held while
// hold is set (nacked: they retry).
type replaySink struct {
	mu   sync.Mutex
	got  []replayDelivery
	hold bool
}

func (s *replaySink) run(msgs <-chan *message.Message) {
	for m := range msgs {
		key := m.Metadata.Get(outbox.MetadataOrderingKey)
		s.mu.Lock()
		if s.hold && key == "held" {
			s.mu.Unlock()
			m.Nack()
			continue
		}
		seq, _ := strconv.ParseInt(m.Metadata.Get(outbox.MetadataSequence), 10, 64)
		s.got = append(s.got, replayDelivery{id: m.UUID, key: key, replayOf: m.Metadata.Get(outbox.MetadataReplayOf), replayID: m.Metadata.Get(outbox.MetadataReplayID), seq: seq})
		s.mu.Unlock()
		m.Ack()
	}
}

func (s *replaySink) snapshot() []replayDelivery {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]replayDelivery(nil), s.got...)
}

func (s *replaySink) setHold(v bool) {
	s.mu.Lock()
	s.hold = v
	s.mu.Unlock()
}

// waitDeliveries waits until the sink holds n deliveries, failing after the deadline.
func waitDeliveries(t *testing.T, s *replaySink, n int, within time.Duration) []replayDelivery {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		got := s.snapshot()
		if len(got) >= n {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d deliveries after %s, want %d", len(got), within, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestReplayWithRelayRunning: a window of published events over many keys (10,000 over 100
// keys on PostgreSQL) is replayed while a relay runs throughout: the dry run's count equals
// what is written and delivered, each selected event is delivered exactly once more (a new id,
// MetadataReplayOf naming the original, MetadataReplayID the replay), each key's copies in
// the originals' order, after the key's events still pending at the replay (a key held behind
// a failing head), and the originals' rows are left as they were. Extra columns are copied;
// other topics and events published after the window are not selected.
func TestReplayWithRelayRunning(t *testing.T) {
	for _, b := range []struct {
		name string
		fn   func(*testing.T) *backend
		n    int
		keys int
	}{
		{"postgresql", pgBackend, 10000, 100},
		{"sqlite", sqliteBackend, 1000, 20},
		{"mariadb", mariaDBBackend, 2000, 40},
	} {
		t.Run(b.name, func(t *testing.T) {
			testReplay(t, b.fn(t), b.n, b.keys)
		})
	}
}

func testReplay(t *testing.T, b *backend, n, nkeys int) {
	n = b.scale(n, 5)
	colType := "TEXT"
	if b.dialect == outbox.DialectMySQL {
		colType = "VARCHAR(64)"
	}
	schema := b.table(t, func(c *outbox.SchemaConfig) { c.ExtraColumns = []outbox.Column{{Name: "tenant", Type: colType}} })
	cfg := fastCfg(schema)
	cfg.MaxAttempts = 1000
	cfg.RetryBase, cfg.RetryMax = 20*time.Millisecond, 50*time.Millisecond
	sub := b.newSub(t, cfg)
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	msgs, err := sub.Subscribe(rctx, "*")
	if err != nil {
		t.Fatal(err)
	}
	sink := &replaySink{}
	done := make(chan struct{})
	go func() { defer close(done); sink.run(msgs) }()
	defer func() { cancel(); <-done }()

	since := time.Now().Add(-time.Second)
	keys := make([]string, nkeys)
	for i := range keys {
		keys[i] = fmt.Sprintf("k%03d", i)
	}
	b.seed(t, schema, "r.a", n, keys)
	pub := b.publisher(t, outbox.PublisherConfig{Schema: schema})
	held, err := pub.EnqueueMany(ctx, []outbox.EventInput{
		{Topic: "r.b", Payload: map[string]int{"h": 1}, OrderingKey: "held", Headers: map[string]string{"h": "1"}, ExtraColumns: map[string]any{"tenant": "acme"}},
		{Topic: "r.b", Payload: map[string]int{"h": 2}, OrderingKey: "held", ExtraColumns: map[string]any{"tenant": "acme"}},
		{Topic: "other", Payload: map[string]int{"o": 1}, OrderingKey: "k000"},
	})
	if err != nil {
		t.Fatal(err)
	}
	first := waitDeliveries(t, sink, n+3, 2*time.Minute)
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) { // every delivery marked
		bl, err := sub.Backlog(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if bl.Pending == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("backlog %+v after every delivery", bl)
		}
	}
	origSeq := map[string]int64{}
	for _, d := range first {
		if d.replayOf != "" {
			t.Fatalf("an original carries %s: %+v", outbox.MetadataReplayOf, d)
		}
		origSeq[d.id] = d.seq
	}
	// The key's pending event at the replay: refused until released.
	sink.setHold(true)
	pending, err := pub.EnqueueMany(ctx, []outbox.EventInput{{Topic: "r.b", Payload: map[string]int{"h": 3}, OrderingKey: "held"}})
	if err != nil {
		t.Fatal(err)
	}
	until := time.Now()
	f := outbox.ReplayFilter{Since: since, Until: until, Topics: []string{"r.*"}}

	for _, c := range []struct {
		f    outbox.ReplayFilter
		want int64
	}{
		{f, int64(n + 2)},
		{outbox.ReplayFilter{Since: since, Until: until}, int64(n + 3)},
		{outbox.ReplayFilter{Since: since, Until: until, Topics: []string{"r.b"}}, 2},
		{outbox.ReplayFilter{Since: since, Until: until, Keys: []string{"k001", "held"}}, int64(n/nkeys + 2)},
		{outbox.ReplayFilter{Since: until, Until: until.Add(time.Hour)}, 0},
	} {
		res, err := sub.Replay(ctx, c.f, outbox.ReplayOptions{DryRun: true})
		if err != nil || res.Selected != c.want || res.Replayed != 0 || !res.Until.Equal(c.f.Until.Truncate(time.Microsecond)) {
			t.Fatalf("dry run %+v: %+v %v, want %d selected", c.f, res, err, c.want)
		}
	}
	dry, err := sub.Replay(ctx, f, outbox.ReplayOptions{DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sub.Replay(ctx, f, outbox.ReplayOptions{Expect: dry.Selected + 1}); !errors.As(err, new(*outbox.ReplayCountError)) {
		t.Fatalf("replay expecting another count: %v", err)
	}
	res, err := sub.Replay(ctx, f, outbox.ReplayOptions{Expect: dry.Selected})
	if err != nil || res.Selected != dry.Selected || res.Replayed != dry.Selected || res.ReplayID.Version() != 7 {
		t.Fatalf("replay: %+v %v, dry run %+v", res, err, dry)
	}
	// The pending event of "held" is still refused: its key's copies wait behind it.
	time.Sleep(200 * time.Millisecond)
	for _, d := range sink.snapshot()[len(first):] {
		if d.key == "held" {
			t.Fatalf("key held delivered %+v while its head was failing", d)
		}
	}
	sink.setHold(false)
	all := waitDeliveries(t, sink, len(first)+1+int(res.Replayed), 2*time.Minute)
	time.Sleep(300 * time.Millisecond) // nothing more comes
	if extra := len(sink.snapshot()) - len(all); extra != 0 {
		t.Fatalf("%d deliveries beyond the replay", extra)
	}

	copies := map[string]int{}
	lastOrig := map[string]int64{} // per key: the original sequence of its last copy delivered
	var heldOrder []string
	for _, d := range all[len(first):] {
		if d.key == "held" {
			heldOrder = append(heldOrder, d.replayOf)
		}
		if d.id == pending[0].ID.String() {
			continue
		}
		if d.replayOf == "" || d.replayID != res.ReplayID.String() {
			t.Fatalf("delivery after the replay without its headers: %+v", d)
		}
		if _, ok := origSeq[d.id]; ok {
			t.Fatalf("a copy carries an original's id: %+v", d)
		}
		o, ok := origSeq[d.replayOf]
		if !ok {
			t.Fatalf("copy of an unknown event: %+v", d)
		}
		if o <= lastOrig[d.key] {
			t.Fatalf("key %s: copy of sequence %d delivered after the copy of %d", d.key, o, lastOrig[d.key])
		}
		lastOrig[d.key] = o
		copies[d.replayOf]++
	}
	if len(copies) != n+2 {
		t.Fatalf("%d originals replayed, want %d", len(copies), n+2)
	}
	for id, c := range copies {
		if c != 1 {
			t.Fatalf("event %s delivered %d more times", id, c)
		}
	}
	if want := []string{"", held[0].ID.String(), held[1].ID.String()}; fmt.Sprint(heldOrder) != fmt.Sprint(want) {
		t.Fatalf("key held after the replay: %q, want the pending event, then the copies in order %q", heldOrder, want)
	}
	// The originals are as they were; every copy is published, extra columns and headers copied.
	if got := b.count(t, fmt.Sprintf(`SELECT count(*) FROM %q WHERE published_at IS NOT NULL AND attempts = 0`, schema.Table)); got != 2*(n+2)+1 {
		t.Fatalf("%d published rows without failures, want %d", got, 2*(n+2)+1)
	}
	if got := b.count(t, fmt.Sprintf(`SELECT count(*) FROM %q WHERE tenant = 'acme' AND ordering_key = 'held' AND published_at IS NOT NULL`, schema.Table)); got != 4 {
		t.Fatalf("%d rows of tenant acme, want the 2 originals and their 2 copies", got)
	}
	// A replay of a replay: the copies keep naming the first original.
	again, err := sub.Replay(ctx, outbox.ReplayFilter{Since: until, Keys: []string{"held"}}, outbox.ReplayOptions{})
	if err != nil || again.Selected != 3 || again.Replayed != 3 {
		t.Fatalf("replay of the copies of key held: %+v %v", again, err)
	}
	var heldAgain []string
	for _, d := range waitDeliveries(t, sink, len(all)+3, time.Minute)[len(all):] {
		if d.replayID != again.ReplayID.String() || d.key != "held" {
			t.Fatalf("second replay delivered %+v", d)
		}
		heldAgain = append(heldAgain, d.replayOf)
	}
	if want := []string{pending[0].ID.String(), held[0].ID.String(), held[1].ID.String()}; fmt.Sprint(heldAgain) != fmt.Sprint(want) {
		t.Fatalf("second replay of key held: %q, want %q", heldAgain, want)
	}

	hdrs := "headers"
	if b.dialect == outbox.DialectPostgreSQL {
		hdrs = "headers::text"
	}
	if got := b.count(t, fmt.Sprintf(`SELECT count(*) FROM %q WHERE %s LIKE '%%"h":"1"%%' OR %[2]s LIKE '%%"h": "1"%%'`, schema.Table, hdrs)); got != 3 {
		t.Fatalf("%d rows with header h=1, want the original and its two copies", got)
	}
}

// TestReplayBadInput: a bad filter or options is a *ConfigError before any SQL (the
// Subscriber's pool points at a closed port: any statement would fail otherwise).
func TestReplayBadInput(t *testing.T) {
	pool, err := pgxpool.New(ctx, "postgres://postgres@127.0.0.1:1/test?connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	sub, err := outbox.NewSubscriber(pool, outbox.SubscriberConfig{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	now := time.Now()
	long := string(make([]byte, 256))
	for _, c := range []struct {
		f     outbox.ReplayFilter
		o     outbox.ReplayOptions
		field string
	}{
		{outbox.ReplayFilter{}, outbox.ReplayOptions{}, "ReplayFilter.Since"},
		{outbox.ReplayFilter{Since: now, Until: now}, outbox.ReplayOptions{}, "ReplayFilter.Until"},
		{outbox.ReplayFilter{Since: now.Add(time.Hour)}, outbox.ReplayOptions{DryRun: true}, "ReplayFilter.Until"},
		{outbox.ReplayFilter{Since: now.Add(-time.Hour), Topics: []string{"a*b"}}, outbox.ReplayOptions{}, "ReplayFilter.Topics[0]"},
		{outbox.ReplayFilter{Since: now.Add(-time.Hour), Keys: []string{"k", ""}}, outbox.ReplayOptions{}, "ReplayFilter.Keys[1]"},
		{outbox.ReplayFilter{Since: now.Add(-time.Hour), Keys: []string{long}}, outbox.ReplayOptions{}, "ReplayFilter.Keys[0]"},
		{outbox.ReplayFilter{Since: now.Add(-time.Hour)}, outbox.ReplayOptions{BatchSize: outbox.MaxReplayBatch + 1}, "ReplayOptions.BatchSize"},
		{outbox.ReplayFilter{Since: now.Add(-time.Hour)}, outbox.ReplayOptions{Expect: -1}, "ReplayOptions.Expect"},
	} {
		_, err := sub.Replay(ctx, c.f, c.o)
		var ce *outbox.ConfigError
		if !errors.As(err, &ce) || ce.Field != c.field || !errors.Is(err, outbox.ErrConfig) {
			t.Errorf("Replay(%+v, %+v) = %v, want a *ConfigError on %s", c.f, c.o, err, c.field)
		}
	}
}
