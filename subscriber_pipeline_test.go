package outbox_test

import (
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/internal/claimlog"
	"github.com/watermill-outbox/outbox/internal/pgtest"
)

// heldMessages collects the messages of a subscription without answering them.
type heldMessages struct {
	mu   sync.Mutex
	msgs []*message.Message
}

func (h *heldMessages) take(ch <-chan *message.Message) {
	go func() {
		for m := range ch {
			h.mu.Lock()
			h.msgs = append(h.msgs, m)
			h.mu.Unlock()
		}
	}()
}

func (h *heldMessages) len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.msgs)
}

// seqs returns the outbox sequences of messages [from, to).
func (h *heldMessages) seqs(from, to int) []int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []int64
	for _, m := range h.msgs[from:to] {
		s, _ := strconv.ParseInt(m.Metadata.Get(outbox.MetadataSequence), 10, 64)
		out = append(out, s)
	}
	slices.Sort(out)
	return out
}

func (h *heldMessages) ack(from, to int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, m := range h.msgs[from:to] {
		m.Ack()
	}
}

// holdFirstBatch subscribes a new Subscriber to topic and holds its messages unanswered until
// the first batch (size events) is out and a second batch is leased beside it.
func (b *backend) holdFirstBatch(t *testing.T, cfg outbox.SubscriberConfig, logger watermill.LoggerAdapter, topic string, size int) (*outbox.Subscriber, *heldMessages) {
	t.Helper()
	sub, err := outbox.NewSubscriber(b.db, cfg, logger)
	if err != nil {
		t.Fatal(err)
	}
	h := &heldMessages{}
	h.take(mustSubscribe(t, sub, topic))
	pgtest.Eventually(t, 10*time.Second, "the first batch out and the second leased", func() bool {
		return h.len() == size && len(b.leasedBy(t, cfg.Schema.Table)) == 2
	})
	return sub, h
}

// sequences returns the table's sequences in order.
func (b *backend) sequences(t *testing.T, table string) []int64 {
	t.Helper()
	rows, err := b.raw.QueryContext(ctx, fmt.Sprintf(`SELECT sequence FROM %q ORDER BY sequence`, table))
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []int64
	for rows.Next() {
		var s int64
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		out = append(out, s)
	}
	return out
}

// leasedBy returns the sequences leased under each token (unpublished, lease in the future
// is not checked: the tokens are what the test compares).
func (b *backend) leasedBy(t *testing.T, table string) map[string][]int64 {
	t.Helper()
	rows, err := b.raw.QueryContext(ctx, fmt.Sprintf(`SELECT leased_by, sequence FROM %q WHERE leased_by IS NOT NULL AND published_at IS NULL ORDER BY sequence`, table))
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string][]int64{}
	for rows.Next() {
		var tok string
		var s int64
		if err := rows.Scan(&tok, &s); err != nil {
			t.Fatal(err)
		}
		out[tok] = append(out[tok], s)
	}
	return out
}

// sortedLeases returns the leased sequence lists ordered by their first sequence.
func sortedLeases(m map[string][]int64) [][]int64 {
	var out [][]int64
	for _, s := range m {
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b []int64) int { return int(a[0] - b[0]) })
	return out
}

// leasing returns the sizes of the logged claims that leased events (a claim beside a mark may
// lease nothing on MariaDB and is then made again after the mark).
func leasing(claims *claimlog.Log) []int {
	return slices.DeleteFunc(claims.Sizes(), func(n int) bool { return n == 0 })
}

// TestNextBatchClaimedWhileOut: while a batch is out (its handler holds every message), the
// relay claims and leases exactly one more batch — the next 10 events, under a token of its
// own — and emits none of it; a third claim waits until the first batch is acked. Then the
// second batch goes out and the third is claimed beside it.
func TestNextBatchClaimedWhileOut(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		if !b.dialect.Capabilities().ClaimAhead {
			t.Skipf("%s does not claim ahead (Capabilities.ClaimAhead)", b.dialect)
		}
		schema := b.table(t)
		keys := make([]string, 40)
		for i := range keys {
			keys[i] = fmt.Sprintf("k%02d", i)
		}
		b.publishKeys(t, schema, "pipe", 0, keys)
		seqs := b.sequences(t, schema.Table)
		cfg := fastCfg(schema)
		cfg.BatchSize, cfg.Concurrency = 10, 10
		claims := &claimlog.Log{}
		sub, h := b.holdFirstBatch(t, cfg, claims, "pipe", 10)
		t.Cleanup(func() { sub.Close() })
		if got := h.seqs(0, 10); !slices.Equal(got, seqs[:10]) {
			t.Fatalf("first batch %v, want %v", got, seqs[:10])
		}
		if got := sortedLeases(b.leasedBy(t, schema.Table)); len(got) != 2 || !slices.Equal(got[0], seqs[:10]) || !slices.Equal(got[1], seqs[10:20]) {
			t.Fatalf("leases %v, want %v and %v", got, seqs[:10], seqs[10:20])
		}
		// At most one batch ahead: while the first batch stays out, nothing more is claimed
		// or emitted (observed over 15 poll intervals).
		for deadline := time.Now().Add(15 * cfg.PollInterval); time.Now().Before(deadline); {
			if n := h.len(); n != 10 {
				t.Fatalf("%d messages out while the first batch is unanswered, want 10", n)
			}
			time.Sleep(cfg.PollInterval / 2)
		}
		if sizes := leasing(claims); !slices.Equal(sizes, []int{10, 10}) {
			t.Fatalf("claims that leased events %v while the first batch is out, want [10 10]", sizes)
		}

		h.ack(0, 10)
		// The first batch's marks land beside the second batch's delivery and the third
		// batch's claim.
		// The claim is logged after its transaction commits, so the wait covers the log too:
		// the third lease can be seen in the table before its claim's log line is written.
		var (
			leases    [][]int64
			published int
		)
		waitFor(t, 10*time.Second, func() bool {
			leases = sortedLeases(b.leasedBy(t, schema.Table))
			published = b.count(t, fmt.Sprintf(`SELECT count(*) FROM %q WHERE published_at IS NOT NULL`, schema.Table))
			return h.len() == 20 && len(leases) == 2 && slices.Equal(leases[1], seqs[20:30]) && published == 10 &&
				len(leasing(claims)) >= 3
		}, func() string {
			return fmt.Sprintf("the second batch out, the third leased and the first published: %d out, leases %v, %d published, claims %v",
				h.len(), leases, published, claims.Sizes())
		})
		if got := h.seqs(10, 20); !slices.Equal(got, seqs[10:20]) {
			t.Fatalf("second batch %v, want %v", got, seqs[10:20])
		}
		if !slices.Equal(leases[0], seqs[10:20]) {
			t.Fatalf("leases %v, want %v and %v", leases, seqs[10:20], seqs[20:30])
		}
		if sizes := leasing(claims); !slices.Equal(sizes, []int{10, 10, 10}) {
			t.Fatalf("claims that leased events %v while the second batch is out, want [10 10 10]", sizes)
		}
		h.ack(10, 20)
		pgtest.Eventually(t, 10*time.Second, "the third batch out", func() bool { return h.len() == 30 })
		h.ack(20, 30)
		pgtest.Eventually(t, 10*time.Second, "the fourth batch out", func() bool { return h.len() == 40 })
		h.ack(30, 40)
		pgtest.Eventually(t, 10*time.Second, "every event published", func() bool {
			return b.count(t, fmt.Sprintf(`SELECT count(*) FROM %q WHERE published_at IS NOT NULL`, schema.Table)) == 40
		})
		if got := h.seqs(0, 40); !slices.Equal(got, seqs) {
			t.Fatalf("delivered %v, want %v once each", got, seqs)
		}
		if sizes := leasing(claims); !slices.Equal(sizes, []int{10, 10, 10, 10}) {
			t.Fatalf("claims that leased events %v, want four of 10", sizes)
		}
	})
}

// TestBatchClaimedAheadKeepsItsLease: the batch claimed while the previous one is out keeps
// its lease however long it waits. The first batch (5 events, one message out at a time, each
// acked after 300 ms) is out for 1.5 s, longer than the 1 s LeaseDuration; a second relay
// polls the same topic all along and never gets an event of the waiting batch: every event is
// delivered by the first relay, once, and no lease is lost.
func TestBatchClaimedAheadKeepsItsLease(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		if !b.dialect.Capabilities().ClaimAhead {
			t.Skipf("%s does not claim ahead (Capabilities.ClaimAhead)", b.dialect)
		}
		schema := b.table(t)
		b.publishKeys(t, schema, "ahead", 0, make([]string, 10))
		var lost atomic.Int64
		cfg := fastCfg(schema)
		cfg.BatchSize, cfg.Concurrency = 5, 1
		cfg.LeaseDuration, cfg.DeliveryTimeout = time.Second, 900*time.Millisecond
		cfg.Hooks.OnLeaseLost = func(i outbox.LeaseLostInfo) { lost.Add(int64(i.Events)) }
		cfg.RelayName = "first"
		first := b.newSub(t, cfg)
		ch, err := first.Subscribe(ctx, "ahead")
		if err != nil {
			t.Fatal(err)
		}
		recFirst := &recorder{}
		recFirst.consume(ch, func(*message.Message) error { time.Sleep(300 * time.Millisecond); return nil })
		pgtest.Eventually(t, 10*time.Second, "the second batch leased while the first is out", func() bool {
			return len(b.leasedBy(t, schema.Table)) == 2
		})
		cfg.RelayName = "second"
		second := b.newSub(t, cfg)
		ch2, err := second.Subscribe(ctx, "ahead")
		if err != nil {
			t.Fatal(err)
		}
		recSecond := &recorder{}
		recSecond.consume(ch2, ack)
		ds := recFirst.drainedExactlyOnce(t, b, schema, 10)
		if n := recSecond.count(); n != 0 {
			t.Fatalf("the second relay delivered %d events of leased batches, want 0", n)
		}
		for i, d := range ds {
			if d.attempt != 1 {
				t.Fatalf("delivery %d: attempt %d, want 1", i, d.attempt)
			}
		}
		if n := lost.Load(); n != 0 {
			t.Fatalf("%d events' leases lost, want 0", n)
		}
	})
}

// TestPipelinedKeyOrderWithNacks: one relay delivers 100 keys × 12 events plus unordered
// events in batches of 50 while claiming the next batch beside each; every 23rd event is
// nacked at its first attempt (a retry with backoff). At every delivery every earlier event of its key has
// been acked — a nacked event's later events, even in the batch claimed ahead, wait for its
// retry — every event is acked once, the nacked ones at attempt 2, and claims did run while
// a batch was out.
func TestPipelinedKeyOrderWithNacks(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		schema := b.table(t)
		keys := make([]string, 101)
		for i := range 100 {
			keys[i] = fmt.Sprintf("k%03d", i)
		}
		n := b.scale(1212, 3)
		b.seed(t, schema, "order", n, keys) // every 101st event unordered
		seqsOfKey := b.keySequences(t, schema.Table)

		var (
			mu         sync.Mutex
			acked      = map[int64]int{} // sequence → attempt acked
			violations []string
			overlapped atomic.Int64 // claims that leased events while messages were out
			// busy holds the periods during which messages were out (end zero: still out); a
			// period ends before the relay sees the last answer, so a claim after a batch's
			// end does not overlap it.
			busyMu sync.Mutex
			out    int
			busy   [][2]time.Time
		)
		outDelta := func(d int) {
			busyMu.Lock()
			defer busyMu.Unlock()
			switch out += d; {
			case d > 0 && out == 1:
				busy = append(busy, [2]time.Time{time.Now()})
			case d < 0 && out == 0:
				busy[len(busy)-1][1] = time.Now()
			}
		}
		cfg := fastCfg(schema)
		cfg.BatchSize, cfg.MaxRunPerKey, cfg.Concurrency = 50, 5, 20
		cfg.RetryBase, cfg.RetryMax = 50*time.Millisecond, 100*time.Millisecond
		cfg.Hooks.OnClaim = func(i outbox.ClaimInfo) {
			ended := time.Now()
			began := ended.Add(-i.Duration)
			busyMu.Lock()
			defer busyMu.Unlock()
			for _, p := range busy {
				if i.Events > 0 && p[0].Before(ended) && (p[1].IsZero() || p[1].After(began)) {
					overlapped.Add(1)
					break
				}
			}
		}
		sub := b.newSub(t, cfg)
		ch := mustSubscribe(t, sub, "order")
		go func() {
			for msg := range ch {
				outDelta(1)
				go func() {
					seq, _ := strconv.ParseInt(msg.Metadata.Get(outbox.MetadataSequence), 10, 64)
					att, _ := strconv.Atoi(msg.Metadata.Get(outbox.MetadataAttempt))
					key := msg.Metadata.Get(outbox.MetadataOrderingKey)
					time.Sleep(2 * time.Millisecond) // a destination's round trip
					mu.Lock()
					for _, s := range seqsOfKey[key] {
						if s >= seq {
							break
						}
						if acked[s] == 0 {
							violations = append(violations, fmt.Sprintf("key %s: %d delivered before %d was acked", key, seq, s))
						}
					}
					if seq%23 == 0 && att == 1 {
						mu.Unlock()
						outDelta(-1)
						msg.Nack()
						return
					}
					if acked[seq] != 0 {
						violations = append(violations, fmt.Sprintf("%d acked twice", seq))
					}
					acked[seq] = att
					mu.Unlock()
					outDelta(-1)
					msg.Ack()
				}()
			}
		}()
		pgtest.Eventually(t, 60*time.Second, "every event published", func() bool {
			return b.count(t, fmt.Sprintf(`SELECT count(*) FROM %q WHERE published_at IS NOT NULL`, schema.Table)) == n
		})
		mu.Lock()
		defer mu.Unlock()
		if len(violations) > 0 {
			t.Fatalf("%d order violations, first: %s", len(violations), violations[0])
		}
		if len(acked) != n {
			t.Fatalf("%d events acked, want %d", len(acked), n)
		}
		for seq, att := range acked {
			want := 1
			if seq%23 == 0 {
				want = 2
			}
			if att != want {
				t.Fatalf("event %d acked at attempt %d, want %d", seq, att, want)
			}
		}
		switch {
		case !b.dialect.Capabilities().ClaimAhead:
			if overlapped.Load() != 0 {
				t.Fatalf("%d claims leased events while a batch was out, without claiming ahead", overlapped.Load())
			}
		case overlapped.Load() == 0:
			t.Fatal("no claim leased events while a batch was out")
		}
		t.Logf("%d claims leased events while a batch was out", overlapped.Load())
	})
}

// TestCloseReleasesBatchClaimedAhead: a Subscriber closed while one batch is out (its
// messages acked, nacked with the stop's context error or unanswered during the close) and the
// next batch is leased beside it: the acks are written, and every other event of both batches
// is released with no attempt and no delivery start counted (MaxAttempts is 1: one charged
// attempt would be a dead letter); a later relay delivers each of them once, at attempt 1.
func TestCloseReleasesBatchClaimedAhead(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		if !b.dialect.Capabilities().ClaimAhead {
			t.Skipf("%s does not claim ahead (Capabilities.ClaimAhead)", b.dialect)
		}
		schema := b.table(t)
		keys := make([]string, 30)
		for i := range keys {
			keys[i] = fmt.Sprintf("k%02d", i)
		}
		b.publishKeys(t, schema, "close", 0, keys)
		cfg := fastCfg(schema)
		cfg.BatchSize, cfg.Concurrency, cfg.MaxAttempts = 10, 10, 1
		cfg.CloseTimeout = 100 * time.Millisecond
		sub, h := b.holdFirstBatch(t, cfg, watermill.NopLogger{}, "close", 10)
		begun := make(chan struct{})
		var wg sync.WaitGroup
		acks := 0
		for i, m := range h.msgs {
			a := answerOf(i)
			if a == answerAck {
				acks++
			}
			wg.Add(1)
			go func() { defer wg.Done(); handleAtClose(m, a, begun) }()
		}
		close(begun)
		sub.Close()
		wg.Wait()
		q := fmt.Sprintf(`SELECT count(*) FROM %q WHERE `, schema.Table)
		if n := b.count(t, q+`published_at IS NOT NULL`); n != acks {
			t.Fatalf("%d published, want %d", n, acks)
		}
		if n := b.count(t, q+`published_at IS NULL AND lease_until IS NULL AND leased_by IS NULL AND attempts = 0 AND delivery_starts = 0 AND dead_lettered_at IS NULL`); n != 30-acks {
			t.Fatalf("%d released without an attempt or a start, want %d", n, 30-acks)
		}
		rec := &recorder{}
		rec.consume(mustSubscribe(t, b.newSub(t, cfg), "close"), ack)
		ds := rec.drainedExactlyOnce(t, b, schema, 30-acks)
		for _, d := range ds {
			if d.attempt != 1 {
				t.Fatalf("event %d delivered at attempt %d after the close, want 1", d.seq, d.attempt)
			}
		}
	})
}

func mustSubscribe(t *testing.T, sub *outbox.Subscriber, topic string) <-chan *message.Message {
	t.Helper()
	ch, err := sub.Subscribe(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	return ch
}

// waitFor waits up to d for cond, then fails with what() describes.
func waitFor(t *testing.T, d time.Duration, cond func() bool, what func() string) {
	t.Helper()
	for deadline := time.Now().Add(d); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %s: %s", d, what())
		}
	}
}
