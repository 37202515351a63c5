package outbox_test

import (
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

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/internal/pgtest"
)

// levelLog records every log line with its level (it implements outbox.WarnLogger); safe for
// concurrent use.
type levelLog struct {
	mu    sync.Mutex
	lines []string // "LEVEL msg"
}

func (l *levelLog) add(level, msg string) {
	l.mu.Lock()
	l.lines = append(l.lines, level+" "+msg)
	l.mu.Unlock()
}
func (l *levelLog) Error(msg string, _ error, _ watermill.LogFields) { l.add("ERROR", msg) }
func (l *levelLog) Warn(msg string, _ error, _ watermill.LogFields)  { l.add("WARN", msg) }
func (l *levelLog) Info(msg string, _ watermill.LogFields)           { l.add("INFO", msg) }
func (l *levelLog) Debug(string, watermill.LogFields)                {}
func (l *levelLog) Trace(string, watermill.LogFields)                {}
func (l *levelLog) With(watermill.LogFields) watermill.LoggerAdapter { return l }

// count returns how many lines start with prefix ("LEVEL msg…").
func (l *levelLog) count(prefix string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, s := range l.lines {
		if strings.HasPrefix(s, prefix) {
			n++
		}
	}
	return n
}

// TestPermanentDeadLettersAtFirstAttempt: an error wrapped with outbox.Permanent dead-letters
// its event at once (attempts 1, not MaxAttempts), holds its key, and leaves the rest alone.
func TestPermanentDeadLettersAtFirstAttempt(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		schema := b.table(t)
		b.publishKeys(t, schema, "t", 0, []string{"k", "k", "", "j"})
		cfg := fastCfg(schema)
		cfg.MaxAttempts = 5
		sub := b.newSub(t, cfg)
		ch, err := sub.Subscribe(ctx, "t")
		if err != nil {
			t.Fatal(err)
		}
		var rec recorder
		rec.consume(ch, func(m *message.Message) error {
			if strings.ReplaceAll(string(m.Payload), " ", "") == `{"i":0}` {
				return outbox.Permanent(errors.New("message too large"))
			}
			return nil
		})
		pgtest.Eventually(t, 10*time.Second, "head dead-lettered, unordered and other key published", func() bool {
			return b.count(t, fmt.Sprintf(`SELECT count(*) FROM %q WHERE dead_lettered_at IS NOT NULL`, schema.Table)) == 1 &&
				b.count(t, fmt.Sprintf(`SELECT count(*) FROM %q WHERE published_at IS NOT NULL`, schema.Table)) == 2
		})
		var (
			attempts int
			lastErr  string
		)
		if err := b.raw.QueryRowContext(ctx, fmt.Sprintf(`SELECT attempts, last_error FROM %q WHERE dead_lettered_at IS NOT NULL`, schema.Table)).Scan(&attempts, &lastErr); err != nil {
			t.Fatal(err)
		}
		if attempts != 1 || lastErr != "permanent: message too large" {
			t.Fatalf("dead letter: attempts %d, last_error %q; want 1, %q", attempts, lastErr, "permanent: message too large")
		}
		// The key's second event stays held behind its dead-lettered head.
		if n := b.count(t, fmt.Sprintf(`SELECT count(*) FROM %q WHERE published_at IS NULL AND dead_lettered_at IS NULL AND ordering_key = 'k'`, schema.Table)); n != 1 {
			t.Fatalf("%d pending events of key k, want 1 (held)", n)
		}
		for _, d := range rec.all() {
			if d.key == "k" && d.seq != firstSeq(rec.all(), "k") {
				t.Fatalf("key k's second event (sequence %d) was delivered behind a dead letter", d.seq)
			}
		}
	})
}

// firstSeq is the lowest sequence delivered for key.
func firstSeq(ds []delivery, key string) int64 {
	var s int64
	for _, d := range ds {
		if d.key == key && (s == 0 || d.seq < s) {
			s = d.seq
		}
	}
	return s
}

// TestUnavailableDestinationPausesItsTopicsOnly: while a destination answers unavailable, its
// events are released without an attempt, its topic is claimed only by probes of one event,
// another topic keeps flowing, Backlog counts every pending event of the paused topic as
// unavailable (also when the error's text does not start with "unavailable: ", as a
// forwarder's does not), and the outage is one WARN line and one INFO line; once it answers,
// everything is delivered in key order and nothing is dead-lettered.
func TestUnavailableDestinationPausesItsTopicsOnly(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		schema := b.table(t)
		keys := make([]string, 300)
		for i := range keys {
			keys[i] = fmt.Sprintf("k%d", i%10)
		}
		b.publishKeys(t, schema, "down", 0, keys)
		b.seed(t, schema, "up", 100, []string{""})
		cfg := fastCfg(schema)
		cfg.MaxAttempts = 2
		cfg.UnavailableBackoff, cfg.UnavailableBackoffMax = 50*time.Millisecond, 100*time.Millisecond
		logs := &levelLog{}
		sub, err := outbox.NewSubscriber(b.db, cfg, logs)
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Close()
		ch, err := sub.Subscribe(ctx, "*")
		if err != nil {
			t.Fatal(err)
		}
		var (
			down       atomic.Bool
			whileDown  atomic.Int64
			rec        recorder
			refusedErr = errors.New("dial tcp 127.0.0.1:1: connect: connection refused")
		)
		down.Store(true)
		rec.consume(ch, func(m *message.Message) error {
			if m.Metadata.Get(outbox.MetadataTopic) == "down" && down.Load() {
				whileDown.Add(1)
				// As a forwarder reports it: the class is in the chain, not at the start
				// of the text.
				return fmt.Errorf("forwarder: publish event %s: %w", m.UUID, &outbox.UnavailableError{Destination: "broker-a", Err: refusedErr})
			}
			return nil
		})
		pgtest.Eventually(t, 20*time.Second, "the other topic delivered during the outage", func() bool {
			return b.count(t, fmt.Sprintf(`SELECT count(*) FROM %q WHERE topic = 'up' AND published_at IS NOT NULL`, schema.Table)) == 100
		})
		pgtest.Eventually(t, 10*time.Second, "the outage is reported", func() bool {
			o := sub.Outages()
			return len(o) == 1 && o[0].Destination == "broker-a" && len(o[0].Topics) == 1 && o[0].Topics[0] == "down"
		})
		// Probes only: at most one event per probe after the first refusals.
		before := whileDown.Load()
		time.Sleep(500 * time.Millisecond) // the outage lasts; this is the window probes are counted in
		during := whileDown.Load() - before
		if during > 12 {
			t.Fatalf("%d deliveries to the unavailable destination in 500 ms; want probes of one event every 50-100 ms", during)
		}
		if n := b.count(t, fmt.Sprintf(`SELECT count(*) FROM %q WHERE attempts > 0 OR dead_lettered_at IS NOT NULL`, schema.Table)); n != 0 {
			t.Fatalf("%d events charged an attempt or dead-lettered during the outage", n)
		}
		// The probes are reported: when the last one ended and when the next is due.
		pgtest.Eventually(t, 10*time.Second, "a probe is reported", func() bool {
			o := sub.Outages()
			return len(o) == 1 && !o[0].LastProbe.IsZero()
		})
		if o := sub.Outages()[0]; o.LastProbe.Before(o.Since) || !o.NextProbe.After(o.LastProbe) {
			t.Fatalf("outage since %v, last probe %v, next probe %v; want since ≤ last probe < next probe", o.Since, o.LastProbe, o.NextProbe)
		}
		if n := b.count(t, fmt.Sprintf(`SELECT count(*) FROM %q WHERE last_error LIKE 'forwarder: publish event %%: unavailable: broker-a: %%' AND last_error_class = 'unavailable'`, schema.Table)); n == 0 {
			t.Fatal("no released event notes the outage in last_error and last_error_class")
		}
		// Every pending event of the paused topic waits for the destination, not only those
		// it refused (the relay claims none of them but probes).
		n := b.count(t, fmt.Sprintf(`SELECT count(*) FROM %q WHERE topic = 'down' AND published_at IS NULL`, schema.Table))
		bl, err := sub.Backlog(ctx)
		if err != nil {
			t.Fatal(err)
		}
		byTopic, err := sub.BacklogByTopic(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if bl.Unavailable != int64(n) || len(byTopic) != 1 || byTopic[0].Topic != "down" || byTopic[0].Unavailable != int64(n) {
			t.Fatalf("Backlog.Unavailable %d, by topic %+v; want %d on topic down", bl.Unavailable, byTopic, n)
		}
		down.Store(false)
		ds := rec.drainedAll(t, b, schema)
		checkPerKeyOrder(t, ds)
		if n := b.count(t, fmt.Sprintf(`SELECT count(*) FROM %q WHERE attempts > 0 OR dead_lettered_at IS NOT NULL OR published_at IS NULL`, schema.Table)); n != 0 {
			t.Fatalf("%d events charged, dead-lettered or pending after the outage", n)
		}
		if len(sub.Outages()) != 0 {
			t.Fatalf("outage still reported: %+v", sub.Outages())
		}
		if w, i := logs.count("WARN outbox: destination unavailable"), logs.count("INFO outbox: destination available again"); w != 1 || i != 1 {
			t.Fatalf("outage logged as %d WARN and %d INFO lines, want 1 and 1: %q", w, i, logs.lines)
		}
	})
}

// drainedAll waits until nothing is pending and returns every delivery seen.
func (r *recorder) drainedAll(t *testing.T, b *backend, schema outbox.SchemaConfig) []delivery {
	t.Helper()
	pgtest.Eventually(t, 60*time.Second, "all events published", func() bool {
		return b.count(t, fmt.Sprintf(`SELECT count(*) FROM %q WHERE published_at IS NULL`, schema.Table)) == 0
	})
	return r.all()
}

// TestUnavailableDeadLetterAfter: once an outage has lasted UnavailableDeadLetterAfter, the
// destination's refused events are dead-lettered instead of held.
func TestUnavailableDeadLetterAfter(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		schema := b.table(t)
		b.seed(t, schema, "t", 20, []string{""})
		cfg := fastCfg(schema)
		cfg.UnavailableBackoff, cfg.UnavailableBackoffMax = 20*time.Millisecond, 50*time.Millisecond
		cfg.UnavailableDeadLetterAfter = 300 * time.Millisecond
		sub := b.newSub(t, cfg)
		ch, _ := sub.Subscribe(ctx, "t")
		(&recorder{}).consume(ch, func(*message.Message) error { return outbox.Unavailable(errors.New("gone")) })
		pgtest.Eventually(t, 20*time.Second, "all dead-lettered", func() bool {
			return b.count(t, fmt.Sprintf(`SELECT count(*) FROM %q WHERE dead_lettered_at IS NOT NULL AND attempts = 1 AND last_error LIKE 'destination unavailable for more than 300ms%%'`, schema.Table)) == 20
		})
	})
}

// TestAcksWrittenWhileBatchOut: acks of a batch that is still out are written every
// MarkInterval, each reported once, and a key's ack only after its earlier events' acks
// (PostgreSQL; SQLite writes a batch's acks at its end).
func TestAcksWrittenWhileBatchOut(t *testing.T) {
	func(t *testing.T, b *backend) {
		schema := b.table(t)
		b.publishKeys(t, schema, "t", 0, []string{"", "", "", "k", "k", "k", "j", "j"})
		cfg := fastCfg(schema)
		cfg.MarkInterval = 20 * time.Millisecond
		cfg.LeaseDuration, cfg.DeliveryTimeout = 3*time.Second, 2500*time.Millisecond
		var delivered atomic.Int64
		cfg.Hooks.OnDelivered = func(outbox.DeliveredInfo) { delivered.Add(1) }
		sub := b.newSub(t, cfg)
		ch, _ := sub.SubscribeBatches(ctx, "t")
		batch := <-ch
		if len(batch.Messages) != 8 {
			t.Fatalf("batch of %d, want 8", len(batch.Messages))
		}
		// Ack unordered #0 and #2, key k's second event (its first is unanswered) and key
		// j's both.
		for _, i := range []int{0, 2, 4, 6, 7} {
			batch.Messages[i].Ack()
		}
		pgtest.Eventually(t, 5*time.Second, "acks written while the batch is out", func() bool {
			return b.count(t, fmt.Sprintf(`SELECT count(*) FROM %q WHERE published_at IS NOT NULL`, schema.Table)) == 4
		})
		if n := b.count(t, fmt.Sprintf(`SELECT count(*) FROM %q WHERE published_at IS NOT NULL AND ordering_key = 'k'`, schema.Table)); n != 0 {
			t.Fatal("key k's second event written published before its first")
		}
		for _, i := range []int{1, 3, 5} {
			batch.Messages[i].Ack()
		}
		pgtest.Eventually(t, 5*time.Second, "all published", func() bool {
			return b.count(t, fmt.Sprintf(`SELECT count(*) FROM %q WHERE published_at IS NOT NULL`, schema.Table)) == 8
		})
		pgtest.Eventually(t, 5*time.Second, "each delivery reported once", func() bool { return delivered.Load() == 8 })
		sub.Close()
		if n := delivered.Load(); n != 8 {
			t.Fatalf("OnDelivered called %d times, want 8", n)
		}
	}(t, pgBackend(t))
}

// TestRestartedRelayTakesBackItsLeases: a Subscriber with an explicit RelayName releases the
// unexpired leases of an earlier Subscriber of that name at Subscribe, and only those.
func TestRestartedRelayTakesBackItsLeases(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		schema := b.table(t)
		b.seed(t, schema, "t", 6, []string{""})
		lease := func(token string, seq int) {
			b.exec(t, fmt.Sprintf(`UPDATE %q SET leased_by = '%s', lease_until = %s WHERE sequence = (SELECT min(sequence) FROM %q) + %d`,
				schema.Table, token, b.at(time.Hour), schema.Table, seq))
		}
		lease("relay-1#0123456789ab#7", 0) // a killed predecessor: taken back
		lease("relay-1#a0b1c2d3e4f5#1", 1) // another one: taken back
		lease("relay-10#0123456789ab#1", 2)
		lease("relay-1#nothexnothex#1", 3)
		lease("other#0123456789ab#1", 4)
		cfg := fastCfg(schema)
		cfg.RelayName, cfg.LeaseDuration = "relay-1", time.Hour
		cfg.DeliveryTimeout = time.Minute
		ch, _ := b.newSub(t, cfg).Subscribe(ctx, "t")
		var rec recorder
		rec.consume(ch, ack)
		pgtest.Eventually(t, 10*time.Second, "taken-back and free events delivered", func() bool {
			return b.count(t, fmt.Sprintf(`SELECT count(*) FROM %q WHERE published_at IS NOT NULL`, schema.Table)) == 3
		})
		if n := b.count(t, fmt.Sprintf(`SELECT count(*) FROM %q WHERE published_at IS NULL AND leased_by IN ('relay-10#0123456789ab#1', 'relay-1#nothexnothex#1', 'other#0123456789ab#1')`, schema.Table)); n != 3 {
			t.Fatalf("%d of the 3 leases of other relays kept, want 3", n)
		}
	})
}

// TestRetryDueWakesRelay: a failed event is tried again when its backoff ends, not at the
// next PollInterval.
func TestRetryDueWakesRelay(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		schema := b.table(t)
		b.seed(t, schema, "t", 1, []string{"k"})
		cfg := fastCfg(schema)
		cfg.PollInterval, cfg.RetryBase = time.Hour, 100*time.Millisecond
		sub := b.newSub(t, cfg)
		ch, _ := sub.Subscribe(ctx, "t")
		var calls atomic.Int64
		(&recorder{}).consume(ch, func(*message.Message) error {
			if calls.Add(1) == 1 {
				return errors.New("first try fails")
			}
			return nil
		})
		pgtest.Eventually(t, 10*time.Second, "retried after its 100 ms backoff, with a 1 h PollInterval", func() bool {
			return b.count(t, fmt.Sprintf(`SELECT count(*) FROM %q WHERE published_at IS NOT NULL AND attempts = 1`, schema.Table)) == 1
		})
	})
}

// TestPoisonEventDeadLettered: an event whose deliveries started MaxDeliveryStarts times
// without an outcome (a relay killed while delivering it each time) is dead-lettered at its
// next claim instead of being delivered, and holds its key; a redelivery after one such start
// carries a higher outbox-attempt than the try before it.
func TestPoisonEventDeadLettered(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		schema := b.table(t)
		b.publishKeys(t, schema, "t", 0, []string{"p", "p", "q"})
		cfg := fastCfg(schema)
		cfg.MaxDeliveryStarts = 3
		// Event 1 (key p's head) crashed its relay 3 times; key q's event once.
		b.exec(t, fmt.Sprintf(`UPDATE %q SET delivery_starts = 3 WHERE sequence = (SELECT min(sequence) FROM %q)`, schema.Table, schema.Table))
		b.exec(t, fmt.Sprintf(`UPDATE %q SET delivery_starts = 1 WHERE ordering_key = 'q'`, schema.Table))
		sub := b.newSub(t, cfg)
		ch, _ := sub.Subscribe(ctx, "t")
		var rec recorder
		rec.consume(ch, ack)
		pgtest.Eventually(t, 10*time.Second, "poison dead-lettered, q delivered", func() bool {
			return b.count(t, fmt.Sprintf(`SELECT count(*) FROM %q WHERE dead_lettered_at IS NOT NULL AND attempts = 1 AND delivery_starts = 0 AND last_error LIKE 'outbox: poison event%%'`, schema.Table)) == 1 &&
				b.count(t, fmt.Sprintf(`SELECT count(*) FROM %q WHERE published_at IS NOT NULL`, schema.Table)) == 1
		})
		ds := rec.all()
		if len(ds) != 1 || ds[0].key != "q" || ds[0].attempt != 2 {
			t.Fatalf("deliveries %+v; want only key q's event, with outbox-attempt 2", ds)
		}
		if n := b.count(t, fmt.Sprintf(`SELECT count(*) FROM %q WHERE ordering_key = 'p' AND published_at IS NULL AND dead_lettered_at IS NULL AND delivery_starts = 0`, schema.Table)); n != 1 {
			t.Fatal("key p's second event is not held (released, no start counted)")
		}
	})
}

// TestGracefulStopCountsNoStart: a delivery left unanswered when the Subscriber closes does not
// count towards MaxDeliveryStarts.
func TestGracefulStopCountsNoStart(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		schema := b.table(t)
		b.seed(t, schema, "t", 1, []string{"k"})
		cfg := fastCfg(schema)
		cfg.CloseTimeout = 50 * time.Millisecond
		sub := b.newSub(t, cfg)
		ch, _ := sub.Subscribe(ctx, "t")
		<-ch // never answered
		sub.Close()
		if n := b.count(t, fmt.Sprintf(`SELECT delivery_starts FROM %q`, schema.Table)); n != 0 {
			t.Fatalf("delivery_starts %d after a graceful stop, want 0", n)
		}
	})
}

// TestMigrateAddsDeliveryStarts: CheckTable refuses a table made before the delivery_starts and
// last_error_class columns existed (ErrTableOutdated, naming them); Migrate adds them, runs
// again on the upgraded table, and CheckTable then passes.
func TestMigrateAddsDeliveryStarts(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		schema := b.table(t)
		b.exec(t, fmt.Sprintf(`ALTER TABLE %q DROP COLUMN delivery_starts`, schema.Table))
		b.exec(t, fmt.Sprintf(`ALTER TABLE %q DROP COLUMN last_error_class`, schema.Table))
		err := outbox.CheckTable(ctx, b.db, schema)
		if !errors.Is(err, outbox.ErrTableOutdated) || !strings.Contains(err.Error(), "lacks delivery_starts, last_error_class") {
			t.Fatalf("CheckTable before Migrate: %v, want ErrTableOutdated naming both columns", err)
		}
		for range 2 {
			if err := outbox.Migrate(ctx, b.db, schema); err != nil {
				t.Fatal(err)
			}
		}
		if err := outbox.CheckTable(ctx, b.db, schema); err != nil {
			t.Fatalf("CheckTable after Migrate: %v", err)
		}
		b.seed(t, schema, "t", 2, []string{"k"})
		if n := b.count(t, fmt.Sprintf(`SELECT sum(delivery_starts) FROM %q`, schema.Table)); n != 0 {
			t.Fatalf("sum(delivery_starts) %d, want 0", n)
		}
		if n := b.count(t, fmt.Sprintf(`SELECT count(*) FROM %q WHERE last_error_class IS NULL`, schema.Table)); n != 2 {
			t.Fatalf("%d events with last_error_class NULL, want 2", n)
		}
	})
}

// TestFencedMarkReportedOnce: a batch whose lease passed to another relay while it was out
// logs one WARN line and calls OnLeaseLost once with the number of events taken over.
func TestFencedMarkReportedOnce(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		schema := b.table(t)
		b.seed(t, schema, "t", 5, []string{""})
		cfg := fastCfg(schema)
		cfg.MarkInterval = time.Hour // the batch's one mark at its end
		var lost []outbox.LeaseLostInfo
		var mu sync.Mutex
		cfg.Hooks.OnLeaseLost = func(i outbox.LeaseLostInfo) { mu.Lock(); lost = append(lost, i); mu.Unlock() }
		logs := &levelLog{}
		sub, err := outbox.NewSubscriber(b.db, cfg, logs)
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Close()
		ch, _ := sub.SubscribeBatches(ctx, "t")
		batch := <-ch
		b.exec(t, fmt.Sprintf(`UPDATE %q SET leased_by = 'other#0123456789ab#1'`, schema.Table))
		for _, m := range batch.Messages {
			m.Ack()
		}
		pgtest.Eventually(t, 5*time.Second, "lease loss reported", func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(lost) > 0
		})
		sub.Close()
		mu.Lock()
		defer mu.Unlock()
		if len(lost) != 1 || lost[0].Events != 5 {
			t.Fatalf("OnLeaseLost calls %+v, want one with 5 events", lost)
		}
		if n := logs.count("WARN outbox: lease lost: 5 events"); n != 1 {
			t.Fatalf("%d WARN lines for the lost lease, want 1: %q", n, logs.lines)
		}
		if n := b.count(t, fmt.Sprintf(`SELECT count(*) FROM %q WHERE published_at IS NOT NULL`, schema.Table)); n != 0 {
			t.Fatalf("%d events marked by the relay that lost the lease", n)
		}
	})
}

// TestOutageHooks: OnOutage is called when an outage starts and when it ends, OnUnavailable
// for each released event, OnClaim with Probe set for probes.
func TestOutageHooks(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		schema := b.table(t)
		b.seed(t, schema, "t", 3, []string{"k"})
		cfg := fastCfg(schema)
		cfg.UnavailableBackoff, cfg.UnavailableBackoffMax = 20*time.Millisecond, 40*time.Millisecond
		var (
			mu       sync.Mutex
			outages  []outbox.OutageInfo
			released int
			probes   int
		)
		cfg.Hooks.OnOutage = func(o outbox.OutageInfo) { mu.Lock(); outages = append(outages, o); mu.Unlock() }
		cfg.Hooks.OnUnavailable = func(outbox.FailedInfo) { mu.Lock(); released++; mu.Unlock() }
		cfg.Hooks.OnClaim = func(c outbox.ClaimInfo) {
			if c.Probe {
				mu.Lock()
				probes++
				mu.Unlock()
			}
		}
		sub := b.newSub(t, cfg)
		ch, _ := sub.Subscribe(ctx, "t")
		var refusals atomic.Int64
		(&recorder{}).consume(ch, func(*message.Message) error {
			if refusals.Add(1) <= 3 {
				return &outbox.UnavailableError{Destination: "d", Err: errors.New("down")}
			}
			return nil
		})
		pgtest.Eventually(t, 10*time.Second, "drained", func() bool {
			return b.count(t, fmt.Sprintf(`SELECT count(*) FROM %q WHERE published_at IS NOT NULL`, schema.Table)) == 3
		})
		mu.Lock()
		defer mu.Unlock()
		if len(outages) != 2 || !outages[0].Ended.IsZero() || outages[1].Ended.IsZero() || outages[1].Released != 3 || outages[1].Destination != "d" {
			t.Fatalf("OnOutage calls %+v, want start and end of destination d with 3 released", outages)
		}
		if released != 3 || probes < 3 {
			t.Fatalf("OnUnavailable %d times (want 3), %d probe claims (want ≥ 3)", released, probes)
		}
	})
}

// TestStopCountsNoAttempt: deliveries that fail with context.Canceled because the Subscriber is
// closing are not charged an attempt (20 rounds of 10 events in flight).
func TestStopCountsNoAttempt(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		schema := b.table(t)
		b.seed(t, schema, "t", 10, []string{""})
		for round := 0; round < b.scale(20, 4); round++ {
			cfg := fastCfg(schema)
			cfg.CloseTimeout = 50 * time.Millisecond // the handlers wait for their context to end
			sub, err := outbox.NewSubscriber(b.db, cfg, nil)
			if err != nil {
				t.Fatal(err)
			}
			ch, _ := sub.Subscribe(ctx, "t")
			var out sync.WaitGroup
			for i := 0; i < 10; i++ {
				m := <-ch
				out.Add(1)
				go func() { // a handler whose destination call is canceled by the stop
					defer out.Done()
					<-m.Context().Done()
					outbox.SetNackError(m, fmt.Errorf("publish: %w", m.Context().Err()))
					m.Nack()
				}()
			}
			sub.Close()
			out.Wait()
			if n := b.count(t, fmt.Sprintf(`SELECT count(*) FROM %q WHERE attempts > 0 OR last_error IS NOT NULL`, schema.Table)); n != 0 {
				t.Fatalf("round %d: %d events charged an attempt by the stop", round, n)
			}
			b.exec(t, fmt.Sprintf(`UPDATE %q SET lease_until = NULL, leased_by = NULL`, schema.Table))
		}
	})
}

// TestNotAttemptedForeverIsPoison: an event whose every delivery ends "not attempted" (say it
// makes the destination drop its connection each time) is not sent again without end: the
// releases keep its starts, so MaxDeliveryStarts dead-letters it as a poison event after
// MaxDeliveryStarts deliveries, with no attempt charged before that.
func TestNotAttemptedForeverIsPoison(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		schema := b.table(t)
		b.publishKeys(t, schema, "t", 0, []string{"p", "p"})
		cfg := fastCfg(schema)
		cfg.MaxDeliveryStarts = 3
		sub := b.newSub(t, cfg)
		ch, _ := sub.Subscribe(ctx, "t")
		var rec recorder
		var first atomic.Int64
		rec.consume(ch, func(m *message.Message) error {
			seq, _ := strconv.ParseInt(m.Metadata.Get(outbox.MetadataSequence), 10, 64)
			first.CompareAndSwap(0, seq)
			if seq == first.Load() {
				return outbox.NotAttempted(errors.New("connection reset by peer"))
			}
			return nil
		})
		pgtest.Eventually(t, 20*time.Second, "the never-attempted event dead-lettered", func() bool {
			return b.count(t, fmt.Sprintf(`SELECT count(*) FROM %q WHERE dead_lettered_at IS NOT NULL AND attempts = 1 AND last_error LIKE 'outbox: poison event%%'`, schema.Table)) == 1
		})
		// Like any dead letter, it holds its key: the key's next event waits, never delivered.
		if n := b.count(t, fmt.Sprintf(`SELECT count(*) FROM %q WHERE published_at IS NULL AND dead_lettered_at IS NULL AND attempts = 0`, schema.Table)); n != 1 {
			t.Fatalf("%d events held behind the dead letter, want 1", n)
		}
		var tries int
		for _, d := range rec.all() {
			if d.seq == first.Load() {
				tries++
			}
		}
		if tries != 3 {
			t.Fatalf("the never-attempted event was delivered %d times, want 3 (MaxDeliveryStarts)", tries)
		}
	})
}

// TestRetryAfterDelaysProbesAtMostBackoffMax: a destination's RetryAfter longer than the
// backoff delays the next probe, but by at most UnavailableBackoffMax: a RetryAfter of an hour
// (a receiver's "Retry-After: 3600", or a hostile one's 999999999) paused the topic that long.
func TestRetryAfterDelaysProbesAtMostBackoffMax(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		schema := b.table(t)
		b.seed(t, schema, "t", 1, []string{""}) // one event: its second delivery is the probe
		cfg := fastCfg(schema)
		cfg.UnavailableBackoff, cfg.UnavailableBackoffMax = 20*time.Millisecond, 300*time.Millisecond
		sub := b.newSub(t, cfg)
		ch, err := sub.Subscribe(ctx, "t")
		if err != nil {
			t.Fatal(err)
		}
		var (
			mu       sync.Mutex
			refused  time.Time
			nextCall time.Time
		)
		(&recorder{}).consume(ch, func(*message.Message) error {
			mu.Lock()
			defer mu.Unlock()
			if refused.IsZero() {
				refused = time.Now()
				return &outbox.UnavailableError{Destination: "d", RetryAfter: time.Hour, Err: errors.New("429 Too Many Requests")}
			}
			if nextCall.IsZero() {
				nextCall = time.Now()
			}
			return nil
		})
		pgtest.Eventually(t, 10*time.Second, "the event delivered after the capped Retry-After", func() bool {
			return b.count(t, fmt.Sprintf(`SELECT count(*) FROM %q WHERE published_at IS NOT NULL`, schema.Table)) == 1
		})
		mu.Lock()
		defer mu.Unlock()
		if gap := nextCall.Sub(refused); gap < 250*time.Millisecond {
			t.Fatalf("the next delivery came %s after the refusal: the RetryAfter (capped at UnavailableBackoffMax, 300ms) was not honoured", gap)
		}
		if n := b.count(t, fmt.Sprintf(`SELECT count(*) FROM %q WHERE attempts > 0`, schema.Table)); n != 0 {
			t.Fatalf("%d events charged an attempt for the refusal", n)
		}
	})
}
