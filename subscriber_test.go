package outbox_test

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/internal/claimlog"
	"github.com/watermill-outbox/outbox/internal/pgtest"
)

// fastCfg is a subscriber config with short timings for tests.
func fastCfg(schema outbox.SchemaConfig) outbox.SubscriberConfig {
	return outbox.SubscriberConfig{
		Schema:          schema,
		PollInterval:    20 * time.Millisecond,
		BatchSize:       100,
		RetryBase:       200 * time.Millisecond,
		RetryMax:        time.Second,
		LeaseDuration:   3 * time.Second,
		DeliveryTimeout: 2 * time.Second,
	}
}

// delivery is one handler invocation.
type delivery struct {
	id, topic, key string
	seq            int64
	attempt        int
}

// recorder runs handlers for a subscription like a Watermill router: one goroutine per message.
type recorder struct {
	mu   sync.Mutex
	seen []delivery
}

func (r *recorder) all() []delivery {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]delivery(nil), r.seen...)
}

func (r *recorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.seen)
}

// consume reads ch until it closes, calling handle in a goroutine per message; handle returns
// nil to ack, an error to nack, or errNoAnswer to leave the message unanswered.
func (r *recorder) consume(ch <-chan *message.Message, handle func(*message.Message) error) *sync.WaitGroup {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for msg := range ch {
			wg.Add(1)
			go func() {
				defer wg.Done()
				seq, _ := strconv.ParseInt(msg.Metadata.Get(outbox.MetadataSequence), 10, 64)
				att, _ := strconv.Atoi(msg.Metadata.Get(outbox.MetadataAttempt))
				d := delivery{id: msg.UUID, topic: msg.Metadata.Get(outbox.MetadataTopic), key: msg.Metadata.Get(outbox.MetadataOrderingKey), seq: seq, attempt: att}
				r.mu.Lock()
				r.seen = append(r.seen, d)
				r.mu.Unlock()
				err := handle(msg)
				switch {
				case errors.Is(err, errNoAnswer):
				case err != nil:
					outbox.SetNackError(msg, err)
					msg.Nack()
				default:
					msg.Ack()
				}
			}()
		}
	}()
	return &wg
}

var errNoAnswer = errors.New("no answer")

func ack(*message.Message) error { return nil }

// drainedExactlyOnce waits until schema's table has no pending event and checks that the
// recorder saw n deliveries of n distinct events; it returns them in delivery order.
func (r *recorder) drainedExactlyOnce(t *testing.T, b *backend, schema outbox.SchemaConfig, n int) []delivery {
	t.Helper()
	pgtest.Eventually(t, 60*time.Second, "all events published", func() bool {
		return b.count(t, fmt.Sprintf(`SELECT count(*) FROM %q WHERE published_at IS NULL`, schema.Table)) == 0
	})
	ds := r.all()
	if len(ds) != n {
		t.Fatalf("%d deliveries, want %d (exactly once)", len(ds), n)
	}
	ids := map[string]bool{}
	for _, d := range ds {
		if ids[d.id] {
			t.Fatalf("event %s delivered twice", d.id)
		}
		ids[d.id] = true
	}
	return ds
}

func checkPerKeyOrder(t *testing.T, ds []delivery) {
	t.Helper()
	last := map[string]int64{}
	for _, d := range ds {
		if d.key == "" {
			continue
		}
		if d.seq < last[d.key] { // equal: a retry of the same event
			t.Fatalf("key %s: sequence %d delivered after %d", d.key, d.seq, last[d.key])
		}
		last[d.key] = d.seq
	}
}

func TestTwoRelaysExactlyOnceInKeyOrder(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		schema := b.table(t)
		n := b.scale(10000, 5) // 10,000 events over 100 keys (2,000 for SQLite under -race)
		keys := make([]string, 100)
		for i := range keys {
			keys[i] = fmt.Sprintf("key-%03d", i)
		}
		b.seed(t, schema, "orders", n, keys)
		rec := &recorder{}
		for i := range 2 {
			cfg := fastCfg(schema)
			cfg.RelayName = fmt.Sprintf("relay-%d", i)
			cfg.BatchSize = 500
			// A lease no loaded -race run can lose: a lease lost (SQLite's renewals wait for
			// the one write lock, and fastCfg's is 3 s) hands its batch to the other relay,
			// which delivers it again as at-least-once allows, and this test counts exactly
			// once. Lost leases have their own tests.
			cfg.LeaseDuration = 30 * time.Second
			ch, err := b.newSub(t, cfg).Subscribe(ctx, "orders")
			if err != nil {
				t.Fatal(err)
			}
			rec.consume(ch, ack)
		}
		checkPerKeyOrder(t, rec.drainedExactlyOnce(t, b, schema, n))
	})
}

func TestFailingHeadHoldsOnlyItsKey(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		schema := b.table(t)
		p := b.publisher(t, outbox.PublisherConfig{Schema: schema})
		evs, err := p.EnqueueMany(ctx, []outbox.EventInput{
			{Topic: "t", Payload: "bad-1", OrderingKey: "bad"},
			{Topic: "t", Payload: "bad-2", OrderingKey: "bad"},
			{Topic: "t", Payload: "good-1", OrderingKey: "good"},
			{Topic: "t", Payload: "free-1"},
			{Topic: "t", Payload: "good-2", OrderingKey: "good"},
			{Topic: "t", Payload: "free-2"},
		})
		if err != nil {
			t.Fatal(err)
		}
		bad1, bad2 := evs[0].ID.String(), evs[1].ID.String()
		cfg := fastCfg(schema)
		cfg.MaxAttempts = 3
		var mu sync.Mutex
		var failures []outbox.FailedInfo
		var dead []outbox.FailedInfo
		cfg.Hooks.OnFailed = func(f outbox.FailedInfo) { mu.Lock(); failures = append(failures, f); mu.Unlock() }
		cfg.Hooks.OnDeadLettered = func(f outbox.FailedInfo) { mu.Lock(); dead = append(dead, f); mu.Unlock() }
		var failing atomic.Bool
		failing.Store(true)
		sub := b.newSub(t, cfg)
		ch, err := sub.Subscribe(ctx, "t")
		if err != nil {
			t.Fatal(err)
		}
		rec := &recorder{}
		rec.consume(ch, func(m *message.Message) error {
			if m.Metadata.Get(outbox.MetadataOrderingKey) == "bad" && failing.Load() {
				return errors.New("broker says no")
			}
			return nil
		})
		// Other keys and unordered events finish while "bad" fails.
		pgtest.Eventually(t, 10*time.Second, "good and unordered published", func() bool {
			return b.count(t, fmt.Sprintf(`SELECT count(*) FROM %q WHERE published_at IS NOT NULL`, schema.Table)) == 4
		})
		pgtest.Eventually(t, 20*time.Second, "bad-1 dead-lettered", func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(dead) == 1
		})
		mu.Lock()
		var deadErr *outbox.DeliveryError
		if len(failures) != 2 || dead[0].EventID != bad1 || dead[0].Attempts != 3 || !errors.As(dead[0].Err, &deadErr) || deadErr.Err.Error() != "broker says no" {
			t.Fatalf("failures %+v dead %+v", failures, dead)
		}
		for i, f := range failures {
			want := cfg.RetryBase * time.Duration(1<<i)
			got := f.NextAttemptAt.Sub(f.At)
			if f.EventID != bad1 || f.Attempts != i+1 || got < want*9/10 || got > want*11/10 {
				t.Fatalf("failure %d: %+v: backoff %s, want %s ±10%%", i, f, got, want)
			}
			var de *outbox.DeliveryError
			if !errors.As(f.Err, &de) || de.Err.Error() != "broker says no" {
				t.Fatalf("failure error %v", f.Err)
			}
		}
		mu.Unlock()
		var lastErr string
		b.raw.QueryRowContext(ctx, fmt.Sprintf(`SELECT last_error FROM %q WHERE id = $1`, schema.Table), bad1).Scan(&lastErr)
		if lastErr != "broker says no" {
			t.Fatalf("last_error = %q", lastErr)
		}
		// bad-2 was never delivered: held behind its dead-lettered head.
		for _, d := range rec.all() {
			if d.id == bad2 {
				t.Fatal("bad-2 delivered while its head is dead-lettered")
			}
		}
		failing.Store(false)
		n, err := sub.RetryDeadLettered(ctx, outbox.RetryFilter{IDs: []uuid.UUID{evs[0].ID}})
		if err != nil || n != 1 {
			t.Fatalf("retry: %d %v", n, err)
		}
		pgtest.Eventually(t, 10*time.Second, "all published", func() bool {
			return b.count(t, fmt.Sprintf(`SELECT count(*) FROM %q WHERE published_at IS NOT NULL`, schema.Table)) == 6
		})
		var order []string
		for _, d := range rec.all() {
			if d.key == "bad" {
				order = append(order, fmt.Sprintf("%s#%d", map[string]string{bad1: "bad-1", bad2: "bad-2"}[d.id], d.attempt))
			}
		}
		if fmt.Sprint(order) != "[bad-1#1 bad-1#2 bad-1#3 bad-1#1 bad-2#1]" {
			t.Fatalf("bad key deliveries: %v", order)
		}
		checkPerKeyOrder(t, rec.all())
	})
}

func TestDeliveryTimeoutRetries(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		schema := b.table(t)
		b.seed(t, schema, "t", 1, []string{"k"})
		cfg := fastCfg(schema)
		cfg.LeaseDuration, cfg.DeliveryTimeout = 2*time.Second, 300*time.Millisecond
		cfg.RetryBase = 50 * time.Millisecond
		ch, _ := b.newSub(t, cfg).Subscribe(ctx, "t")
		rec := &recorder{}
		var calls atomic.Int32
		rec.consume(ch, func(*message.Message) error {
			if calls.Add(1) == 1 {
				return errNoAnswer
			}
			return nil
		})
		pgtest.Eventually(t, 10*time.Second, "published after a timeout", func() bool {
			return b.count(t, fmt.Sprintf(`SELECT count(*) FROM %q WHERE published_at IS NOT NULL AND attempts = 1 AND last_error LIKE '%%delivery timeout%%'`, schema.Table)) == 1
		})
		if ds := rec.all(); len(ds) != 2 || ds[0].attempt != 1 || ds[1].attempt != 2 {
			t.Fatalf("deliveries %+v", ds)
		}
	})
}

// TestFencing: a relay whose lease expired (simulated: the lease is moved into the past, as a
// paused relay would see it) cannot overwrite the marks of the relay that took over.
func TestFencing(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		schema := b.table(t)
		b.seed(t, schema, "t", 1, []string{""})
		cfgA := fastCfg(schema)
		cfgA.RelayName = "A"
		subA := b.newSub(t, cfgA)
		chA, _ := subA.Subscribe(ctx, "t")
		release := make(chan struct{})
		got := make(chan *message.Message, 1)
		go func() {
			msg := <-chA
			got <- msg
			<-release
			outbox.SetNackError(msg, errors.New("A failed late"))
			msg.Nack()
		}()
		msgA := <-got
		if _, err := b.raw.ExecContext(ctx, fmt.Sprintf(`UPDATE %q SET lease_until = %s`, schema.Table, b.at(-time.Second))); err != nil {
			t.Fatal(err)
		}
		cfgB := fastCfg(schema)
		cfgB.RelayName = "B"
		chB, _ := b.newSub(t, cfgB).Subscribe(ctx, "t")
		recB := &recorder{}
		recB.consume(chB, ack)
		pgtest.Eventually(t, 10*time.Second, "B published it", func() bool {
			return b.count(t, fmt.Sprintf(`SELECT count(*) FROM %q WHERE published_at IS NOT NULL`, schema.Table)) == 1
		})
		close(release)
		<-msgA.Nacked()
		// Close waits for A's poll loop, so A's marks (conditioned on its token) are written.
		subA.Close()
		var attempts int
		var lastErr *string
		var published bool
		b.raw.QueryRowContext(ctx, fmt.Sprintf(`SELECT attempts, last_error, published_at IS NOT NULL FROM %q`, schema.Table)).Scan(&attempts, &lastErr, &published)
		if attempts != 0 || lastErr != nil || !published {
			t.Fatalf("after A's late nack: attempts=%d last_error=%v published=%v", attempts, lastErr, published)
		}
	})
}

// A few hot keys: every batch holds a full run of every key, and the next claim runs while
// that batch's marks are written. It continues the keys' runs after the ones just delivered
// (they are this relay's own, acked), so no claim comes back empty until the backlog is
// drained; order and exactly-once delivery are unchanged. Without continuations the claim
// beside the marks found all four keys still leased and came back empty.
func TestHotKeysContinuedBesideMarks(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		schema := b.table(t)
		n := b.scale(8000, 8)
		keys := []string{"hot-a", "hot-b", "hot-c", "hot-d"}
		b.seed(t, schema, "hot", n, keys)
		cfg := fastCfg(schema)
		cfg.BatchSize, cfg.MaxRunPerKey = 400, 100
		claims := &claimlog.Log{}
		sub, err := outbox.NewSubscriber(b.db, cfg, claims)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { sub.Close() })
		ch, err := sub.Subscribe(ctx, "hot")
		if err != nil {
			t.Fatal(err)
		}
		rec := &recorder{}
		rec.consume(ch, ack)
		checkPerKeyOrder(t, rec.drainedExactlyOnce(t, b, schema, n))
		if !b.dialect.Capabilities().ContinuedRuns {
			return // claims wait for the previous batch's marks (SQLite's one writer)
		}
		// Every key has 2,000 events: 20 runs of 100. A key continued 4 batches in a row is
		// left out once (one key per batch), so a claim holds 3 or 4 runs until the keys run
		// out.
		sizes, total := claims.Sizes(), 0
		for i, size := range sizes {
			if total == n {
				break
			}
			if size == 0 {
				t.Fatalf("claim %d of the backlog leased nothing; claim sizes %v", i+1, sizes)
			}
			total += size
		}
		if total != n {
			t.Fatalf("claims leased %d events, want %d; claim sizes %v", total, n, sizes)
		}
	})
}

// TestContinuationKeepsAgeOrder: a continued key competes with the other keys by the age of
// its next event. One hot key fills every batch (MaxRunPerKey = BatchSize) and an older event
// of another key waits behind its first run: it goes out in the next batch, not after the hot
// key's whole backlog (position 511 of 511 when continuations were read first).
func TestContinuationKeepsAgeOrder(t *testing.T) {
	b := pgBackend(t)
	schema := b.table(t)
	keys := slices.Repeat([]string{"hot"}, 511)
	keys[10] = "cold" // sequence position 11
	b.publishKeys(t, schema, "t", 0, keys)
	cfg := fastCfg(schema)
	cfg.BatchSize, cfg.MaxRunPerKey = 10, 10
	ch, err := b.newSub(t, cfg).Subscribe(ctx, "t")
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{}
	rec.consume(ch, ack)
	ds := rec.drainedExactlyOnce(t, b, schema, len(keys))
	checkPerKeyOrder(t, ds)
	for i, d := range ds {
		if d.key == "cold" && i >= 20 {
			t.Fatalf("the cold event (sequence position 11) was delivered at position %d, want within the first two batches", i+1)
		}
	}
}

// TestContinuationWaitsForItsPredecessorsMark: a batch's mark fails (an injected error from a
// trigger, once) while the next claim has already continued its key. The continuation is
// delivered, but its acks are not written: it is released, and both batches go out again, the
// failed one first, once its lease has expired. So no event is published before an earlier
// event of its key (published_at follows sequence order).
func TestContinuationWaitsForItsPredecessorsMark(t *testing.T) {
	b := pgBackend(t)
	schema := b.table(t)
	const n = 300
	b.seed(t, schema, "t", n, []string{"k"})
	fn, once := schema.Table+"_fail", schema.Table+"_once"
	b.exec(t, fmt.Sprintf(`CREATE SEQUENCE %q`, once))
	t.Cleanup(func() {
		b.raw.ExecContext(ctx, fmt.Sprintf(`DROP TABLE IF EXISTS %q; DROP FUNCTION IF EXISTS %q(); DROP SEQUENCE IF EXISTS %q`, schema.Table, fn, once))
	})
	// Nested IFs: the sequence is consumed only by the update that publishes the 50th event.
	b.exec(t, fmt.Sprintf(`CREATE FUNCTION %[1]q() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF NEW.published_at IS NOT NULL AND OLD.published_at IS NULL AND NEW.sequence = (SELECT min(sequence) + 49 FROM %[2]q) THEN
		IF nextval('%[3]s') = 1 THEN
			RAISE EXCEPTION 'injected mark failure';
		END IF;
	END IF;
	RETURN NEW;
END $$`, fn, schema.Table, once))
	b.exec(t, fmt.Sprintf(`CREATE TRIGGER fail_once BEFORE UPDATE ON %q FOR EACH ROW EXECUTE FUNCTION %q()`, schema.Table, fn))
	cfg := fastCfg(schema)
	cfg.BatchSize, cfg.MaxRunPerKey = 100, 100
	ch, err := b.newSub(t, cfg).Subscribe(ctx, "t")
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{}
	rec.consume(ch, ack)
	pgtest.Eventually(t, 30*time.Second, "all events published", func() bool {
		return b.count(t, fmt.Sprintf(`SELECT count(*) FROM %q WHERE published_at IS NULL`, schema.Table)) == 0
	})
	if fired := b.count(t, fmt.Sprintf(`SELECT count(*) FROM %q WHERE is_called`, once)); fired != 1 {
		t.Fatal("the injected mark failure never fired")
	}
	checkPerKeyOrder(t, rec.all()[:100]) // the first batch, before anything was redelivered
	out := b.count(t, fmt.Sprintf(`SELECT count(*) FROM (SELECT published_at < lag(published_at) OVER (ORDER BY sequence) AS early FROM %q) x WHERE early`, schema.Table))
	if out != 0 {
		t.Fatalf("%d events published before the event preceding them", out)
	}
	// The first two batches went out twice (the second as a continuation whose acks were
	// released), the third once.
	times := map[int64]int{}
	for _, d := range rec.all() {
		times[d.seq]++
	}
	byCount := map[int]int{}
	for _, c := range times {
		byCount[c]++
	}
	if len(times) != n || byCount[2] != 200 || byCount[1] != 100 {
		t.Fatalf("deliveries per event: %v events delivered twice, %v once, of %d distinct; want 200 and 100 of %d", byCount[2], byCount[1], len(times), n)
	}
}

// TestRetryBelowScanStartClaimedDuringBacklog: after a full batch the next claim's scan starts
// at that batch's lowest sequence; an event that becomes claimable again below that start (a
// retry) must still be claimed while full batches go on (the scans go back to the start every
// few full batches), not only once the backlog is drained.
func TestRetryBelowScanStartClaimedDuringBacklog(t *testing.T) {
	b := pgBackend(t)
	schema := b.table(t)
	const n = 2000
	b.seed(t, schema, "t", n, []string{""})
	cfg := fastCfg(schema)
	cfg.BatchSize, cfg.RetryBase, cfg.RetryMax = 10, time.Millisecond, time.Millisecond
	sub := b.newSub(t, cfg)
	ch, err := sub.Subscribe(ctx, "t")
	if err != nil {
		t.Fatal(err)
	}
	var nacked string
	acked, retriedAfter := 0, -1
	seen := map[string]int{}
	for acked < n {
		select {
		case m := <-ch:
			seq := m.Metadata.Get(outbox.MetadataSequence)
			seen[seq]++
			if nacked == "" {
				nacked = seq
				m.Nack()
				continue
			}
			if seq == nacked {
				retriedAfter = acked
			}
			acked++
			m.Ack()
		case <-time.After(30 * time.Second):
			t.Fatalf("%d of %d events acked within 30s", acked, n)
		}
	}
	// 16 full batches of 10 may pass on the raised scan start before a claim scans from the
	// start again; the backlog is 200 batches.
	if retriedAfter < 0 || retriedAfter > n/2 {
		t.Fatalf("retried event %s delivered again after %d other acks, want within the first %d", nacked, retriedAfter, n/2)
	}
	if len(seen) != n || seen[nacked] != 2 {
		t.Fatalf("%d distinct events, the nacked one delivered %d times; want %d and 2", len(seen), seen[nacked], n)
	}
	t.Logf("retried event delivered again after %d acks", retriedAfter)
}
