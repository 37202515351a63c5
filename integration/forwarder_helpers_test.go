package integration_test

// Shared harness of the forwarder_* and router_* integration tests: an outbox table with seeded
// events, a subscriber whose hooks count marks per event, and checks of what a broker-side
// Watermill subscriber received. Every name here starts with "fwd" (the integration package is
// shared with other tests).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/forwarder"
	"github.com/watermill-outbox/outbox/internal/pgtest"
)

// fwdEvent is one seeded event and what its delivery must look like.
type fwdEvent struct {
	id, topic, key string
	pos            int // position among its key's events, 0-based
	payload        map[string]any
	headers        map[string]string
}

// fwdEnv is one test's outbox table, its events and the relay's marks.
type fwdEnv struct {
	t      *testing.T
	pool   *pgxpool.Pool
	schema outbox.SchemaConfig
	events []*fwdEvent
	byID   map[string]*fwdEvent

	pos map[string]int // next position per ordering key

	mu        sync.Mutex
	delivered map[string]int // event id → OnDelivered calls
	failed    []outbox.FailedInfo
	dead      map[string]outbox.FailedInfo
	released  int                 // OnUnavailable calls (events released, no attempt counted)
	outages   []outbox.OutageInfo // OnOutage calls

	logger watermill.LoggerAdapter // the subscriber's logger (nil: none)
}

func fwdNewEnv(t *testing.T) *fwdEnv {
	t.Helper()
	pool := pgtest.Require(t)
	schema := outbox.SchemaConfig{Table: pgtest.Table(t)}
	if err := outbox.Migrate(context.Background(), pool, schema); err != nil {
		t.Fatal(err)
	}
	return &fwdEnv{t: t, pool: pool, schema: schema, byID: map[string]*fwdEvent{}, pos: map[string]int{},
		delivered: map[string]int{}, dead: map[string]outbox.FailedInfo{}}
}

// seed writes n events round-robin over keys ordering keys (keys = 0: unordered) in
// transactions of 100; topicOf gives the topic of the i-th key (or of event i when unordered).
func (e *fwdEnv) seed(n, keys int, topicOf func(k int) string) []*fwdEvent {
	e.t.Helper()
	var out []*fwdEvent
	pos := e.pos
	for start := 0; start < n; start += 100 {
		var batch []*fwdEvent
		err := pgx.BeginFunc(context.Background(), e.pool, func(tx pgx.Tx) error {
			pub, err := outbox.NewPublisher(tx, outbox.PublisherConfig{Schema: e.schema}, nil)
			if err != nil {
				return err
			}
			byTopic := map[string][]*message.Message{}
			var order []string
			for i := start; i < min(n, start+100); i++ {
				k, key := i, ""
				if keys > 0 {
					k = i % keys
					key = fmt.Sprintf("key-%02d", k)
				}
				ev := &fwdEvent{topic: topicOf(k), key: key, pos: pos[key],
					payload: map[string]any{"i": float64(i), "key": key, "pos": float64(pos[key])},
					headers: map[string]string{"trace-id": fmt.Sprintf("trace-%d", i), "source": "fwd-test"}}
				pos[key]++
				body, _ := json.Marshal(ev.payload)
				msg := outbox.NewMessage(body)
				for h, v := range ev.headers {
					msg.Metadata.Set(h, v)
				}
				if key != "" {
					outbox.SetOrderingKey(msg, key)
				}
				ev.id = msg.UUID
				if _, ok := byTopic[ev.topic]; !ok {
					order = append(order, ev.topic)
				}
				byTopic[ev.topic] = append(byTopic[ev.topic], msg)
				batch = append(batch, ev)
			}
			for _, tp := range order {
				if err := pub.Publish(tp, byTopic[tp]...); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			e.t.Fatal(err)
		}
		out = append(out, batch...)
	}
	for _, ev := range out {
		e.events = append(e.events, ev)
		e.byID[ev.id] = ev
	}
	return out
}

// add writes one event with the given payload fields (plus "key" and "pos").
func (e *fwdEnv) add(topic, key string, fields map[string]any) *fwdEvent {
	e.t.Helper()
	ev := &fwdEvent{topic: topic, key: key, pos: e.pos[key], payload: map[string]any{"key": key, "pos": float64(e.pos[key])},
		headers: map[string]string{"source": "fwd-test"}}
	for k, v := range fields {
		ev.payload[k] = v
	}
	e.pos[key]++
	body, _ := json.Marshal(ev.payload)
	msg := outbox.NewMessage(body)
	msg.Metadata.Set("source", "fwd-test")
	if key != "" {
		outbox.SetOrderingKey(msg, key)
	}
	pub, err := outbox.NewPublisher(e.pool, outbox.PublisherConfig{Schema: e.schema}, nil)
	if err == nil {
		err = pub.Publish(topic, msg)
	}
	if err != nil {
		e.t.Fatal(err)
	}
	ev.id = msg.UUID
	e.events = append(e.events, ev)
	e.byID[ev.id] = ev
	return ev
}

// subCfg is the fast subscriber config of these tests.
func (e *fwdEnv) subCfg() outbox.SubscriberConfig {
	return outbox.SubscriberConfig{
		Schema:          e.schema,
		PollInterval:    20 * time.Millisecond,
		BatchSize:       200,
		MaxRunPerKey:    20,
		RetryBase:       50 * time.Millisecond,
		RetryMax:        200 * time.Millisecond,
		MaxAttempts:     3,
		LeaseDuration:   20 * time.Second,
		DeliveryTimeout: 15 * time.Second,
		Concurrency:     50,
	}
}

// subscriber returns a Subscriber on the table with cfg (zero: subCfg) and hooks recording the
// marks.
func (e *fwdEnv) subscriber(cfg outbox.SubscriberConfig) *outbox.Subscriber {
	e.t.Helper()
	if cfg.Schema.Table == "" {
		cfg = e.subCfg()
	}
	cfg.Hooks = outbox.Hooks{
		OnDelivered: func(d outbox.DeliveredInfo) {
			e.mu.Lock()
			e.delivered[d.EventID]++
			e.mu.Unlock()
		},
		OnFailed: func(f outbox.FailedInfo) {
			e.mu.Lock()
			e.failed = append(e.failed, f)
			e.mu.Unlock()
		},
		OnDeadLettered: func(f outbox.FailedInfo) {
			e.mu.Lock()
			e.dead[f.EventID] = f
			e.failed = append(e.failed, f)
			e.mu.Unlock()
		},
		OnUnavailable: func(outbox.FailedInfo) {
			e.mu.Lock()
			e.released++
			e.mu.Unlock()
		},
		OnOutage: func(o outbox.OutageInfo) {
			e.mu.Lock()
			e.outages = append(e.outages, o)
			e.mu.Unlock()
		},
	}
	sub, err := outbox.NewSubscriber(e.pool, cfg, e.logger)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = sub.Close() })
	return sub
}

// run starts a Forwarder and closes it when the test ends.
func (e *fwdEnv) run(sub forwarder.Subscriber, pub message.Publisher, cfg forwarder.Config) *forwarder.Forwarder {
	e.t.Helper()
	f, err := forwarder.New(sub, pub, cfg, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- f.Run(context.Background()) }()
	select {
	case <-f.Running():
	case err := <-errc:
		e.t.Fatalf("forwarder did not start: %v", err)
	case <-time.After(10 * time.Second):
		e.t.Fatal("forwarder not running after 10s")
	}
	e.t.Cleanup(func() {
		if err := f.Close(); err != nil {
			e.t.Errorf("forwarder close: %v", err)
		}
		if err := <-errc; err != nil {
			e.t.Errorf("forwarder run: %v", err)
		}
	})
	return f
}

// count runs a count(*) query with the table name as %q.
func (e *fwdEnv) count(where string) int {
	e.t.Helper()
	var n int
	q := fmt.Sprintf(`SELECT count(*) FROM %q WHERE %s`, e.schema.Table, where)
	if err := e.pool.QueryRow(context.Background(), q).Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n
}

// waitSettled polls until the published and dead-lettered row counts are the given values
// and the hooks have reported at least as many marks.
func (e *fwdEnv) waitSettled(timeout time.Duration, published, dead int) {
	e.t.Helper()
	deadline := time.Now().Add(timeout)
	// The rows first, then the hooks (they run after the mark statement returns).
	hooked := func() bool {
		e.mu.Lock()
		defer e.mu.Unlock()
		n := 0
		for _, c := range e.delivered {
			n += c
		}
		return n >= published && len(e.dead) >= dead
	}
	for e.count("published_at IS NOT NULL") != published || e.count("dead_lettered_at IS NOT NULL") != dead || !hooked() {
		if time.Now().After(deadline) {
			e.dump()
			e.t.Fatalf("not %d published and %d dead-lettered within %s", published, dead, timeout)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// checkMarkedOnce asserts that each event of ids was marked published exactly once (one
// OnDelivered call, published_at set, no failed attempt) and that no other event was.
func (e *fwdEnv) checkMarkedOnce(ids []string) {
	e.t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	want := map[string]bool{}
	for _, id := range ids {
		want[id] = true
		if n := e.delivered[id]; n != 1 {
			e.t.Errorf("event %s marked published %d times, want 1", id, n)
		}
	}
	for id, n := range e.delivered {
		if !want[id] {
			e.t.Errorf("event %s marked published %d times, want 0", id, n)
		}
	}
	if got := e.count("published_at IS NOT NULL"); got != len(ids) {
		e.t.Errorf("published rows = %d, want %d", got, len(ids))
	}
}

// fwdReceived is a message as a broker-side subscriber got it.
type fwdReceived struct {
	uuid      string
	topic     string // the broker topic / stream / queue it came from
	payload   []byte
	metadata  message.Metadata
	partition int32 // Kafka only; -1 elsewhere
}

// fwdCollector gathers received messages from any number of goroutines.
type fwdCollector struct {
	mu  sync.Mutex
	got []fwdReceived
}

func (c *fwdCollector) add(r fwdReceived) {
	c.mu.Lock()
	c.got = append(c.got, r)
	c.mu.Unlock()
}

func (c *fwdCollector) all() []fwdReceived {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]fwdReceived(nil), c.got...)
}

func (c *fwdCollector) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.got)
}

// consume acks every message of ch into c until ch closes.
func (c *fwdCollector) consume(topic string, ch <-chan *message.Message, partition func(*message.Message) int32) {
	for msg := range ch {
		p := int32(-1)
		if partition != nil {
			p = partition(msg)
		}
		c.add(fwdReceived{uuid: msg.UUID, topic: topic, payload: msg.Payload, metadata: msg.Metadata, partition: p})
		msg.Ack()
	}
}

// checkReceived asserts that got holds exactly the events want, once each, each with its id,
// payload, headers, outbox metadata and topic intact (brokerTopic maps the event topic to the
// broker topic it must come from), in per-key order (in the order of got), and for Kafka one
// partition per key.
func (e *fwdEnv) checkReceived(got []fwdReceived, want []*fwdEvent, brokerTopic func(string) string) {
	e.t.Helper()
	wantSet := map[string]*fwdEvent{}
	for _, ev := range want {
		wantSet[ev.id] = ev
	}
	seen := map[string]bool{}
	lastPos := map[string]int{}
	partOf := map[string]int32{}
	dups, reordered, bad := 0, 0, 0
	for _, r := range got {
		ev := wantSet[r.uuid]
		if ev == nil {
			e.t.Errorf("unexpected message %s on %q", r.uuid, r.topic)
			bad++
			continue
		}
		if seen[r.uuid] {
			dups++
			continue
		}
		seen[r.uuid] = true
		if want := brokerTopic(ev.topic); r.topic != want {
			e.t.Errorf("event %s arrived on %q, want %q", ev.id, r.topic, want)
		}
		var payload map[string]any
		if err := json.Unmarshal(r.payload, &payload); err != nil || !reflect.DeepEqual(payload, ev.payload) {
			e.t.Errorf("event %s payload %s, want %v (%v)", ev.id, r.payload, ev.payload, err)
		}
		for h, v := range ev.headers {
			if r.metadata.Get(h) != v {
				e.t.Errorf("event %s header %s = %q, want %q", ev.id, h, r.metadata.Get(h), v)
			}
		}
		wantMeta := map[string]string{outbox.MetadataEventID: ev.id, outbox.MetadataTopic: ev.topic,
			outbox.MetadataOrderingKey: ev.key, outbox.MetadataAttempt: "1"}
		for h, v := range wantMeta {
			if r.metadata.Get(h) != v {
				e.t.Errorf("event %s metadata %s = %q, want %q", ev.id, h, r.metadata.Get(h), v)
			}
		}
		if _, err := strconv.ParseInt(r.metadata.Get(outbox.MetadataSequence), 10, 64); err != nil {
			e.t.Errorf("event %s: bad %s %q", ev.id, outbox.MetadataSequence, r.metadata.Get(outbox.MetadataSequence))
		}
		if ev.key == "" {
			continue
		}
		if last, ok := lastPos[ev.key]; ok && ev.pos != last+1 {
			reordered++
		} else if !ok && ev.pos != 0 {
			reordered++
		}
		lastPos[ev.key] = ev.pos
		if r.partition >= 0 {
			if p, ok := partOf[ev.key]; ok && p != r.partition {
				e.t.Errorf("key %s in partitions %d and %d", ev.key, p, r.partition)
			}
			partOf[ev.key] = r.partition
		}
	}
	missing := 0
	for id := range wantSet {
		if !seen[id] {
			missing++
		}
	}
	if dups != 0 || reordered != 0 || missing != 0 || bad != 0 {
		e.t.Errorf("received %d: missing=%d duplicates=%d reordered=%d unexpected=%d", len(got), missing, dups, reordered, bad)
	}
}

// checkReceivedSet asserts that got holds exactly the events want, once each (order not
// checked).
func (e *fwdEnv) checkReceivedSet(got []fwdReceived, want []*fwdEvent) {
	e.t.Helper()
	wantSet := map[string]bool{}
	for _, ev := range want {
		wantSet[ev.id] = true
	}
	seen := map[string]int{}
	for _, r := range got {
		seen[r.uuid]++
		if !wantSet[r.uuid] {
			e.t.Errorf("unexpected message %s", r.uuid)
		} else if seen[r.uuid] == 2 {
			e.t.Errorf("message %s received twice", r.uuid)
		}
	}
	for id := range wantSet {
		if seen[id] == 0 {
			e.t.Errorf("event %s not received", id)
		}
	}
}

// fwdMessages returns n messages with small JSON payloads tagged with round.
func fwdMessages(n, round int) []*message.Message {
	msgs := make([]*message.Message, n)
	for i := range msgs {
		msgs[i] = outbox.NewMessage([]byte(fmt.Sprintf(`{"round":%d,"i":%d}`, round, i)))
	}
	return msgs
}

// fwdIDs returns the ids of evs.
func fwdIDs(evs []*fwdEvent) []string {
	ids := make([]string, len(evs))
	for i, ev := range evs {
		ids[i] = ev.id
	}
	return ids
}

// fwdSplit splits evs by pred.
func fwdSplit(evs []*fwdEvent, pred func(*fwdEvent) bool) (yes, no []*fwdEvent) {
	for _, ev := range evs {
		if pred(ev) {
			yes = append(yes, ev)
		} else {
			no = append(no, ev)
		}
	}
	return yes, no
}

// checkDeadLettered asserts that exactly the events dead were dead-lettered after maxAttempts
// failures whose cause matches target (errors.Is), with the backoff between attempts, never
// published; and that no other event had a failed attempt (events held behind a dead letter
// of their key are released without one).
func (e *fwdEnv) checkDeadLettered(dead []*fwdEvent, maxAttempts int, target error) {
	e.t.Helper()
	cfg := e.subCfg()
	e.mu.Lock()
	defer e.mu.Unlock()
	deadSet := map[string]bool{}
	for _, ev := range dead {
		deadSet[ev.id] = true
		if _, ok := e.dead[ev.id]; !ok {
			e.t.Errorf("event %s not dead-lettered", ev.id)
		}
	}
	if len(e.dead) != len(dead) {
		e.t.Errorf("%d events dead-lettered, want %d", len(e.dead), len(dead))
	}
	attempts := map[string]int{}
	for _, f := range e.failed {
		if !deadSet[f.EventID] {
			e.t.Errorf("event %s (not expected to fail) failed: %v", f.EventID, f.Err)
			continue
		}
		attempts[f.EventID]++
		if target != nil && !errors.Is(f.Err, target) {
			e.t.Errorf("event %s failed with %v, want %v", f.EventID, f.Err, target)
		}
		if f.Attempts < maxAttempts {
			// Backoff: RetryBase·2^(attempts−1) capped at RetryMax, ±10% jitter (database clock).
			base := min(cfg.RetryBase*time.Duration(1<<(f.Attempts-1)), cfg.RetryMax)
			if d := f.NextAttemptAt.Sub(f.At); d < base*9/10-time.Millisecond || d > base*11/10+time.Millisecond {
				e.t.Errorf("event %s attempt %d: next attempt after %s, want %s ±10%%", f.EventID, f.Attempts, d, base)
			}
		}
	}
	for _, ev := range dead {
		if attempts[ev.id] != maxAttempts {
			e.t.Errorf("event %s failed %d times, want %d", ev.id, attempts[ev.id], maxAttempts)
		}
	}
	var n int
	q := fmt.Sprintf(`SELECT count(*) FROM %q WHERE dead_lettered_at IS NOT NULL AND published_at IS NULL AND attempts = $1 AND last_error <> ''`, e.schema.Table)
	if err := e.pool.QueryRow(context.Background(), q, maxAttempts).Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	if n != len(dead) {
		e.t.Errorf("%d dead-lettered rows with %d attempts and a last_error, want %d", n, maxAttempts, len(dead))
	}
}

// lastError returns the stored last_error of event id.
func (e *fwdEnv) lastError(id string) string {
	e.t.Helper()
	var s *string
	q := fmt.Sprintf(`SELECT last_error FROM %q WHERE id = $1`, e.schema.Table)
	if err := e.pool.QueryRow(context.Background(), q, id).Scan(&s); err != nil {
		e.t.Fatal(err)
	}
	if s == nil {
		return ""
	}
	return *s
}

// dump logs the table's state per ordering key (for failures).
func (e *fwdEnv) dump() {
	q := fmt.Sprintf(`SELECT coalesce(ordering_key,''), count(*) FILTER (WHERE published_at IS NOT NULL), count(*) FILTER (WHERE dead_lettered_at IS NOT NULL), count(*) FILTER (WHERE published_at IS NULL AND dead_lettered_at IS NULL), max(attempts), max(last_error) FROM %q GROUP BY 1 ORDER BY 1`, e.schema.Table)
	rows, err := e.pool.Query(context.Background(), q)
	if err != nil {
		e.t.Log(err)
		return
	}
	defer rows.Close()
	for rows.Next() {
		var key string
		var pub, dead, pending, att int
		var le *string
		_ = rows.Scan(&key, &pub, &dead, &pending, &att, &le)
		l := ""
		if le != nil {
			l = *le
		}
		e.t.Logf("key %q: published=%d dead=%d pending=%d max_attempts=%d last_error=%.200s", key, pub, dead, pending, att, l)
	}
}
