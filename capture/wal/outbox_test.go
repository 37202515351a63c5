package wal_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/capture/wal"
)

// rowSink records the outbox events it is given, with their metadata.
type rowSink struct {
	mu  sync.Mutex
	got []rowMsg
}

type rowMsg struct {
	id, key, attempt, header string
	seq                      int64
}

func (s *rowSink) Publish(_ string, msgs ...*message.Message) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, m := range msgs {
		seq, err := strconv.ParseInt(m.Metadata.Get(outbox.MetadataSequence), 10, 64)
		if err != nil {
			return err
		}
		s.got = append(s.got, rowMsg{id: m.UUID, key: m.Metadata.Get(outbox.MetadataOrderingKey), attempt: m.Metadata.Get(outbox.MetadataAttempt), header: m.Metadata.Get("h"), seq: seq})
	}
	return nil
}

func (s *rowSink) Close() error { return nil }

func (s *rowSink) snapshot() []rowMsg {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]rowMsg(nil), s.got...)
}

// errorLines is a logger that counts Error lines containing a text.
type errorLines struct {
	watermill.NopLogger
	text string
	n    atomic.Int64
}

func (l *errorLines) Error(msg string, _ error, _ watermill.LogFields) {
	if strings.Contains(msg, l.text) {
		l.n.Add(1)
	}
}

func (l *errorLines) With(watermill.LogFields) watermill.LoggerAdapter { return l }

// writeEvents enqueues events from..from+n-1 over keys ordering keys (10 per statement).
func writeEvents(t testing.TB, pub *outbox.Publisher, from, n, keys int) {
	t.Helper()
	if err := enqueue(pub, from, n, keys); err != nil {
		t.Fatal(err)
	}
}

func enqueue(pub *outbox.Publisher, from, n, keys int) error {
	for i := from; i < from+n; i += 10 {
		var ins []outbox.EventInput
		for j := i; j < min(i+10, from+n); j++ {
			ins = append(ins, outbox.EventInput{Topic: "loan", Payload: map[string]int{"n": j}, OrderingKey: fmt.Sprintf("k%d", j%keys), Headers: map[string]string{"h": strconv.Itoa(j)}})
		}
		if _, err := pub.EnqueueMany(ctx, ins); err != nil {
			return err
		}
	}
	return nil
}

// checkRows checks what the sink got against the outbox table: every row delivered (0 lost),
// each key's rows first delivered in sequence order; it returns the duplicates.
func checkRows(t testing.TB, pool *pgxpool.Pool, got []rowMsg) (dups int) {
	t.Helper()
	rows, err := pool.Query(ctx, `SELECT "sequence", "id"::text, coalesce("ordering_key", '') FROM watermill_outbox ORDER BY "sequence"`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	want := map[int64]string{}
	for rows.Next() {
		var seq int64
		var id, key string
		if err := rows.Scan(&seq, &id, &key); err != nil {
			t.Fatal(err)
		}
		want[seq] = id
	}
	seen := map[int64]bool{}
	last := map[string]int64{}
	for _, m := range got {
		if want[m.seq] != m.id {
			t.Fatalf("sequence %d delivered with id %s, table has %q", m.seq, m.id, want[m.seq])
		}
		if seen[m.seq] {
			dups++
			continue
		}
		seen[m.seq] = true
		if m.seq < last[m.key] {
			t.Fatalf("key %s: sequence %d delivered after %d", m.key, m.seq, last[m.key])
		}
		last[m.key] = m.seq
	}
	if len(seen) != len(want) {
		t.Fatalf("%d of %d events delivered", len(seen), len(want))
	}
	var pending int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM watermill_outbox WHERE "published_at" IS NULL`).Scan(&pending); err != nil || pending != 0 {
		t.Fatalf("%d rows not marked published (%v)", pending, err)
	}
	return dups
}

// startOutbox runs an OutboxRelay with cfg until the test ends.
func startOutbox(t testing.TB, pool *pgxpool.Pool, cfg wal.OutboxConfig) *wal.OutboxRelay {
	t.Helper()
	r, err := wal.NewOutboxRelay(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	c, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(c) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return r
}

// waitMarked waits until every row of the outbox table is marked published.
func waitMarked(t testing.TB, pool *pgxpool.Pool) {
	t.Helper()
	waitFor(t, 30*time.Second, "the marks", func() bool {
		var pending int
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM watermill_outbox WHERE "published_at" IS NULL`).Scan(&pending)
		return pending == 0
	})
}

func newPublisher(t testing.TB, pool *pgxpool.Pool) *outbox.Publisher {
	t.Helper()
	pub, err := outbox.NewPublisher(pool, outbox.PublisherConfig{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return pub
}

// claims counts the polling relay's claims and the events they leased.
type claims struct{ calls, events atomic.Int64 }

func (c *claims) hook(i outbox.ClaimInfo) {
	c.calls.Add(1)
	c.events.Add(int64(i.Events))
}

// TestOutboxStreams: with the outbox-table mode running, 600 events over 20 keys are all
// delivered from the WAL — the polling relay runs no claim at all — each key's in sequence
// order, with the Subscriber's metadata (headers, sequence, attempt 1), and marked published
// in the table.
func TestOutboxStreams(t *testing.T) {
	_, pool := logicalPG(t)
	cfg := wal.OutboxConfig{StatusInterval: 50 * time.Millisecond, SweepInterval: time.Hour}
	if err := wal.SetupOutbox(ctx, pool, cfg); err != nil {
		t.Fatal(err)
	}
	sink := &rowSink{}
	var cl claims
	cfg.Destination = sink
	cfg.Relay.Hooks.OnClaim = cl.hook
	r := startOutbox(t, pool, cfg)
	waitFor(t, 30*time.Second, "the stream", func() bool { return r.Source().Stats().Connected })
	pub := newPublisher(t, pool)
	const n = 600
	writeEvents(t, pub, 0, n, 20)
	deadline := time.Now().Add(60 * time.Second)
	for len(sink.snapshot()) < n {
		if time.Now().After(deadline) {
			var pending, leased int
			_ = pool.QueryRow(ctx, `SELECT count(*), count(lease_until) FROM watermill_outbox WHERE published_at IS NULL`).Scan(&pending, &leased)
			t.Fatalf("%d of %d events delivered; stats %+v; %d rows pending, %d of them leased", len(sink.snapshot()), n, r.Source().Stats(), pending, leased)
		}
		time.Sleep(10 * time.Millisecond)
	}
	waitMarked(t, pool)
	got := sink.snapshot()
	if dups := checkRows(t, pool, got); dups != 0 || len(got) != n {
		t.Fatalf("%d delivered, %d duplicates; want %d, 0", len(got), dups, n)
	}
	for _, m := range got {
		if m.attempt != "1" || m.header == "" {
			t.Fatalf("metadata of sequence %d: attempt %q header %q", m.seq, m.attempt, m.header)
		}
	}
	if calls := cl.calls.Load(); calls != 0 {
		t.Fatalf("the polling relay ran %d claims, want 0", calls)
	}
	if st := r.Source().Stats(); st.Delivered != n || st.Parked != 0 || st.Fallbacks != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// TestOutboxDroppedSlot: the slot is dropped (walsender terminated, pg_drop_replication_slot)
// while writers write; the relay logs one Error line, counts one fallback, and delivers from
// the table by polling: the events written while the slot is gone are all delivered, 0 lost,
// each key's in sequence order. After SetupOutbox makes a new slot it streams again, and the
// events written then are delivered too.
func TestOutboxDroppedSlot(t *testing.T) {
	_, pool := logicalPG(t)
	cfg := wal.OutboxConfig{StatusInterval: 50 * time.Millisecond, SweepInterval: time.Hour, SlotRecheck: 200 * time.Millisecond,
		RetryBackoff: 20 * time.Millisecond, MaxBackoff: 100 * time.Millisecond}
	if err := wal.SetupOutbox(ctx, pool, cfg); err != nil {
		t.Fatal(err)
	}
	sink := &rowSink{}
	var cl claims
	logs := &errorLines{text: "outbox slot lost"}
	cfg.Destination = sink
	cfg.Logger = logs
	cfg.Relay.PollInterval = 50 * time.Millisecond
	cfg.Relay.Hooks.OnClaim = cl.hook
	r := startOutbox(t, pool, cfg)
	pub := newPublisher(t, pool)
	const keys, phase = 30, 300
	writeEvents(t, pub, 0, phase, keys)
	waitFor(t, 60*time.Second, "phase 1 streamed", func() bool { return len(sink.snapshot()) >= phase })
	streamed := cl.events.Load()

	// Writers run while the slot is dropped and while the relay polls.
	var wg sync.WaitGroup
	var werr error
	wg.Go(func() { werr = enqueue(pub, phase, phase, keys) })
	waitFor(t, 30*time.Second, "the slot dropped", func() bool {
		_, _ = pool.Exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL`, wal.DefaultOutboxSlot)
		_, err := pool.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, wal.DefaultOutboxSlot)
		return err == nil
	})
	wg.Wait()
	if werr != nil {
		t.Fatal(werr)
	}
	writeEvents(t, pub, 2*phase, phase, keys) // all of these while the slot is gone
	waitFor(t, 60*time.Second, "the fallback", func() bool { return r.Source().Stats().FromTable })
	waitFor(t, 60*time.Second, "phase 2 delivered from the table", func() bool { return len(checkSeen(sink.snapshot())) >= 3*phase })
	if cl.events.Load() == streamed {
		t.Fatal("nothing claimed from the table after the slot was dropped")
	}

	// A new slot: streaming resumes.
	if err := wal.SetupOutbox(ctx, pool, cfg); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "streaming again", func() bool { st := r.Source().Stats(); return !st.FromTable && st.Connected })
	before := r.Source().Stats().Delivered
	writeEvents(t, pub, 3*phase, phase, keys)
	waitFor(t, 60*time.Second, "phase 3 delivered", func() bool { return len(checkSeen(sink.snapshot())) >= 4*phase })
	waitMarked(t, pool)
	got := sink.snapshot()
	dups := checkRows(t, pool, got)
	st := r.Source().Stats()
	if st.Fallbacks != 1 || logs.n.Load() != 1 {
		t.Fatalf("%d fallbacks, %d Error lines; want 1, 1", st.Fallbacks, logs.n.Load())
	}
	if st.Delivered == before {
		t.Fatal("nothing streamed after the new slot")
	}
	t.Logf("%d events, %d deliveries, %d duplicates; %d claimed from the table, %d streamed", 4*phase, len(got), dups, cl.events.Load(), st.Delivered)
}

// checkSeen returns the distinct sequences delivered.
func checkSeen(got []rowMsg) map[int64]bool {
	seen := map[int64]bool{}
	for _, m := range got {
		seen[m.seq] = true
	}
	return seen
}

// failingSink refuses the events of one ordering key while refuse is set.
type failingSink struct {
	rowSink
	key    string
	refuse atomic.Bool
}

func (s *failingSink) Publish(topic string, msgs ...*message.Message) error {
	for _, m := range msgs {
		if s.refuse.Load() && m.Metadata.Get(outbox.MetadataOrderingKey) == s.key {
			return errors.New("destination refuses")
		}
	}
	return s.rowSink.Publish(topic, msgs...)
}

// TestOutboxFailureLeftToRelay: 30 events of keys k0-k2 are written before the slot exists,
// then 170 over k0-k9 while
// the destination refuses key k3. The old events are delivered by the polling relay's sweep
// windows (the stream holds their keys' new events behind them), the stream tries each k3 event
// MaxAttempts times at most, counts one attempt in the row and leaves it and the key's later
// events to the relay, while the other keys stream on; once the destination takes k3 again the
// relay delivers its events. Each key's events in sequence order, nothing lost.
func TestOutboxFailureLeftToRelay(t *testing.T) {
	_, pool := logicalPG(t)
	cfg := wal.OutboxConfig{StatusInterval: 50 * time.Millisecond, SweepInterval: 200 * time.Millisecond, MaxAttempts: 2, RetryBackoff: 10 * time.Millisecond}
	const n, keys, old = 200, 10, 30
	// Events older than the slot, of the same keys: the stream holds those keys' new events
	// behind them until a sweep window delivers them.
	pub := newPublisher(t, pool)
	writeEvents(t, pub, 0, old, 3) // keys k0-k2
	if err := wal.SetupOutbox(ctx, pool, cfg); err != nil {
		t.Fatal(err)
	}
	sink := &failingSink{key: "k3"}
	sink.refuse.Store(true)
	cfg.Destination = sink
	cfg.Relay = outbox.SubscriberConfig{MaxAttempts: 1000, RetryBase: 20 * time.Millisecond, RetryMax: 100 * time.Millisecond}
	r := startOutbox(t, pool, cfg)
	writeEvents(t, pub, old, n-old, keys)
	const k3 = (n - old) / keys // k3's events, all written after the slot
	waitFor(t, 60*time.Second, "the other keys", func() bool { return len(checkSeen(sink.snapshot())) >= n-k3 })
	waitFor(t, 30*time.Second, "a failed attempt on k3's head", func() bool {
		var attempts int
		_ = pool.QueryRow(ctx, `SELECT attempts FROM watermill_outbox WHERE ordering_key = 'k3' ORDER BY sequence LIMIT 1`).Scan(&attempts)
		return attempts >= 1
	})
	for _, m := range sink.snapshot() {
		if m.key == "k3" {
			t.Fatalf("k3 delivered while refused: %+v", m)
		}
	}
	sink.refuse.Store(false)
	waitFor(t, 60*time.Second, "k3's events", func() bool { return len(checkSeen(sink.snapshot())) >= n })
	waitMarked(t, pool)
	dups := checkRows(t, pool, sink.snapshot())
	st := r.Source().Stats()
	if st.Parked < k3 || st.Delivered == 0 {
		t.Fatalf("stats %+v: want ≥ %d left to the relay (k3's events), some streamed", st, k3)
	}
	t.Logf("%d events: %d streamed, %d left to the relay, %d duplicates", n, st.Delivered, st.Parked, dups)
}

// TestOutboxDeadLetterNoWindows: a key whose head is dead-lettered has a pending event
// behind it, which the polling relay cannot claim (the key is held). While the stream delivers
// everything else, no sweep window should open for it: a window runs the polling relay, whose
// claims race the stream for fresh rows.
func TestOutboxDeadLetterNoWindows(t *testing.T) {
	_, pool := logicalPG(t)
	cfg := wal.OutboxConfig{StatusInterval: 50 * time.Millisecond, SweepInterval: 100 * time.Millisecond, SweepAge: 50 * time.Millisecond}
	pub := newPublisher(t, pool)
	if _, err := pub.EnqueueMany(ctx, []outbox.EventInput{{Topic: "loan", Payload: 1, OrderingKey: "dl"}, {Topic: "loan", Payload: 2, OrderingKey: "dl"}}); err != nil {
		t.Fatal(err)
	}
	exec(t, pool, `UPDATE watermill_outbox SET dead_lettered_at = now() WHERE sequence = (SELECT min(sequence) FROM watermill_outbox)`)
	if err := wal.SetupOutbox(ctx, pool, cfg); err != nil {
		t.Fatal(err)
	}
	sink := &rowSink{}
	var cl claims
	cfg.Destination = sink
	cfg.Relay.Hooks.OnClaim = cl.hook
	r := startOutbox(t, pool, cfg)
	waitFor(t, 30*time.Second, "the stream", func() bool { return r.Source().Stats().Connected })
	const n = 200
	for i := 0; i < n; i += 10 {
		writeEvents(t, pub, i, 10, 10)
		waitFor(t, 30*time.Second, "the events written", func() bool { return len(checkSeen(sink.snapshot())) >= i+10 })
	}
	waitFor(t, 30*time.Second, "the events", func() bool { return len(checkSeen(sink.snapshot())) >= n })
	if c, e := cl.calls.Load(), cl.events.Load(); c != 0 {
		t.Fatalf("the polling relay ran %d claims (%d events) while the stream delivered %d events; want 0 claims", c, e, n)
	}
}

// TestOutboxStreamRefused: the relay's role may not start a WAL sender (no REPLICATION
// attribute), so the stream never starts (Run reconnects with backoff: not a lost slot); the
// slot itself is fine. The events written after Run started are delivered by sweep windows
// (before the fix: 0 of 50 after 20 s, the windows only looked at rows up to the table's top
// sequence at start).
func TestOutboxStreamRefused(t *testing.T) {
	srv, pool := logicalPG(t)
	cfg := wal.OutboxConfig{StatusInterval: 50 * time.Millisecond, SweepInterval: 200 * time.Millisecond, SweepAge: 100 * time.Millisecond,
		SlotRecheck: 200 * time.Millisecond, RetryBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond}
	if err := wal.SetupOutbox(ctx, pool, cfg); err != nil {
		t.Fatal(err)
	}
	exec(t, pool, `CREATE ROLE app LOGIN NOREPLICATION`,
		`GRANT ALL ON ALL TABLES IN SCHEMA public TO app`, `GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO app`)
	pc, err := pgxpool.ParseConfig(srv.DSN())
	if err != nil {
		t.Fatal(err)
	}
	pc.ConnConfig.User = "app"
	app, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(app.Close)
	sink := &rowSink{}
	cfg.Destination = sink
	cfg.Relay.PollInterval = 50 * time.Millisecond
	logs := &errorLines{text: "replication session ended"}
	cfg.Logger = logs
	r := startOutbox(t, app, cfg)
	// The sweeps have read the table's top sequence by now (its first check runs at once).
	waitFor(t, 30*time.Second, "the refused sessions", func() bool { return logs.n.Load() >= 5 })
	pub := newPublisher(t, pool)
	const n = 50
	writeEvents(t, pub, 0, n, 5)
	deadline := time.Now().Add(20 * time.Second)
	for len(checkSeen(sink.snapshot())) < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d events delivered after 20s; stats %+v", len(checkSeen(sink.snapshot())), n, r.Source().Stats())
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("delivered; stats %+v", r.Source().Stats())
	waitMarked(t, pool)
	checkRows(t, pool, sink.snapshot())
}

// slowSink takes every event after a delay, but refuses the events of key refuse.
type slowSink struct {
	rowSink
	delay  time.Duration
	refuse string
}

func (s *slowSink) Publish(topic string, msgs ...*message.Message) error {
	for _, m := range msgs {
		if m.Metadata.Get(outbox.MetadataOrderingKey) == s.refuse {
			return errors.New("destination refuses")
		}
	}
	time.Sleep(s.delay)
	return s.rowSink.Publish(topic, msgs...)
}

// TestOutboxSlowBatchKeepsItsLease: one transaction of 150 events of one key is one batch (a
// transaction is not split at BatchSize) whose delivery (150 × 20ms) outlives LeaseDuration
// (1s), while the destination refuses key "bad", whose event the polling relay retries in
// sweep windows. The stream renews the batch's leases while it delivers, so the windows' claims
// leave the batch alone: each event of the big transaction is delivered once, in sequence
// order. Without the renewal: 150 distinct of 150, 53 duplicates, 46 out-of-order deliveries.
func TestOutboxSlowBatchKeepsItsLease(t *testing.T) {
	_, pool := logicalPG(t)
	cfg := wal.OutboxConfig{StatusInterval: 50 * time.Millisecond, SweepInterval: 200 * time.Millisecond, SweepAge: 100 * time.Millisecond,
		LeaseDuration: time.Second, BatchSize: 100}
	pub := newPublisher(t, pool)
	if _, err := pub.Enqueue(ctx, outbox.EventInput{Topic: "loan", Payload: 1, OrderingKey: "bad"}); err != nil {
		t.Fatal(err)
	}
	if err := wal.SetupOutbox(ctx, pool, cfg); err != nil {
		t.Fatal(err)
	}
	sink := &slowSink{delay: 20 * time.Millisecond, refuse: "bad"}
	var cl claims
	cfg.Destination = sink
	cfg.Relay = outbox.SubscriberConfig{MaxAttempts: 1000, RetryBase: 20 * time.Millisecond, RetryMax: 50 * time.Millisecond}
	cfg.Relay.Hooks.OnClaim = cl.hook
	r := startOutbox(t, pool, cfg)
	waitFor(t, 30*time.Second, "the stream", func() bool { return r.Source().Stats().Connected })
	waitFor(t, 30*time.Second, "a retry of the refused event", func() bool {
		var attempts int
		_ = pool.QueryRow(ctx, `SELECT attempts FROM watermill_outbox WHERE ordering_key = 'bad'`).Scan(&attempts)
		return attempts >= 1
	})
	const n = 150
	var ins []outbox.EventInput
	for i := range n {
		ins = append(ins, outbox.EventInput{Topic: "loan", Payload: map[string]int{"n": i}, OrderingKey: "big"})
	}
	if _, err := pub.EnqueueMany(ctx, ins); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "the big transaction", func() bool {
		var pending int
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM watermill_outbox WHERE ordering_key = 'big' AND published_at IS NULL`).Scan(&pending)
		return pending == 0
	})
	var got []rowMsg
	for _, m := range sink.snapshot() {
		if m.key == "big" {
			got = append(got, m)
		}
	}
	dups, back := 0, 0
	seen := map[int64]bool{}
	var last int64
	for _, m := range got {
		if seen[m.seq] {
			dups++
		}
		seen[m.seq] = true
		if m.seq < last {
			back++
		}
		last = m.seq
	}
	st := r.Source().Stats()
	t.Logf("%d deliveries of %d events; %d duplicates; %d deliveries below an earlier one; relay claimed %d events in %d claims; stats %+v",
		len(got), n, dups, back, cl.events.Load(), cl.calls.Load(), st)
	if len(seen) != n || dups != 0 || back != 0 {
		t.Fatalf("key big: %d distinct of %d, %d duplicates, %d out-of-order deliveries; want %d, 0, 0", len(seen), n, dups, back, n)
	}
}

// hangSink never answers a Publish of key hang until the message's context ends (like an HTTP
// call without its own timeout); it takes every other event.
type hangSink struct{ rowSink }

func (s *hangSink) Publish(topic string, msgs ...*message.Message) error {
	for _, m := range msgs {
		if m.Metadata.Get(outbox.MetadataOrderingKey) == "hang" {
			<-m.Context().Done()
			return m.Context().Err()
		}
	}
	return s.rowSink.Publish(topic, msgs...)
}

// TestOutboxHungDeliveryTimesOut: the destination hangs on one event (key hang) until its
// message's context ends. The stream's DeliveryTimeout (1s here) ends each attempt, so the
// event is left to the polling relay after MaxAttempts and the other keys' events written
// after it are delivered within 15s. Without the timeout: 0 (in another run 30) of 50.
func TestOutboxHungDeliveryTimesOut(t *testing.T) {
	_, pool := logicalPG(t)
	cfg := wal.OutboxConfig{StatusInterval: 50 * time.Millisecond, SweepInterval: 200 * time.Millisecond, SweepAge: 100 * time.Millisecond}
	if err := wal.SetupOutbox(ctx, pool, cfg); err != nil {
		t.Fatal(err)
	}
	sink := &hangSink{}
	cfg.Destination = sink
	cfg.DeliveryTimeout = time.Second
	cfg.Relay.DeliveryTimeout = time.Second
	r := startOutbox(t, pool, cfg)
	waitFor(t, 30*time.Second, "the stream", func() bool { return r.Source().Stats().Connected })
	pub := newPublisher(t, pool)
	if _, err := pub.Enqueue(ctx, outbox.EventInput{Topic: "loan", Payload: 0, OrderingKey: "hang"}); err != nil {
		t.Fatal(err)
	}
	const n = 50
	writeEvents(t, pub, 0, n, 5)
	waitFor(t, 15*time.Second, fmt.Sprintf("the %d events of other keys", n), func() bool { return len(checkSeen(sink.snapshot())) >= n })
	if got := len(checkSeen(sink.snapshot())); got != n {
		t.Fatalf("%d distinct events of other keys delivered, want %d", got, n)
	}
}
