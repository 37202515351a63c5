package outbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"

	"github.com/watermill-outbox/outbox/internal/dialect"
	"github.com/watermill-outbox/outbox/internal/dialect/memory"
)

// destWorld is a relay over the in-memory table under synctest's clock whose messages go to
// named destinations (metadata "dest"), each answered by answer.
type destWorld struct {
	db     *memory.DB
	sub    *Subscriber
	answer func(dest string, msg *message.Message) error // nil: ack
	start  time.Time                                     // when the world was made

	mu        sync.Mutex
	committed map[string]time.Time   // event id → insert time
	delivered map[string][]time.Time // dest → ack times
	sent      map[string]int         // dest → messages received (acked or not)
	keyOrder  map[string][]int64     // ordering key → acked sequences in order
	acked     map[string]bool
}

func newDestWorld(t *testing.T, cfg SubscriberConfig) *destWorld {
	t.Helper()
	w := &destWorld{db: memory.New(memory.WithCapabilities(dialect.Capabilities{SkipLocked: true, Continuations: true, FlushAcks: true, DatabaseClock: true})),
		start: time.Now(), committed: map[string]time.Time{}, delivered: map[string][]time.Time{}, sent: map[string]int{}, keyOrder: map[string][]int64{}, acked: map[string]bool{}}
	cfg.Destination = func(_ string, msg *message.Message) string { return msg.Metadata.Get("dest") }
	sub, err := newSubscriberOn(&memory.Executor{}, w.db, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	w.sub = sub
	return w
}

// write inserts events bound for dest with the given keys ("" unordered), now.
func (w *destWorld) write(t *testing.T, dest string, keys ...string) {
	t.Helper()
	rows := make([]dialect.InsertRow, len(keys))
	for i, k := range keys {
		rows[i] = dialect.InsertRow{ID: uuid.Must(uuid.NewV7()).String(), Topic: "t", Payload: []byte("{}"), Headers: fmt.Sprintf(`{"dest":%q}`, dest)}
		if k != "" {
			rows[i].OrderingKey = &k
		}
	}
	if _, err := w.db.Insert(context.Background(), &memory.Executor{}, &dialect.InsertParams{Table: &dialect.Table{Parts: []string{DefaultTable}}, Rows: rows}); err != nil {
		t.Fatal(err)
	}
	w.mu.Lock()
	for _, r := range rows {
		w.committed[r.ID] = time.Now()
	}
	w.mu.Unlock()
}

// run consumes the subscription until ctx ends.
func (w *destWorld) run(ctx context.Context, t *testing.T) {
	msgs, err := w.sub.Subscribe(ctx, "t")
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for msg := range msgs {
			dest := msg.Metadata.Get("dest")
			var err error
			if w.answer != nil {
				err = w.answer(dest, msg)
			}
			w.mu.Lock()
			w.sent[dest]++
			if err == nil && !w.acked[msg.UUID] {
				w.acked[msg.UUID] = true
				w.delivered[dest] = append(w.delivered[dest], time.Now())
				if k := msg.Metadata.Get(MetadataOrderingKey); k != "" {
					var seq int64
					fmt.Sscan(msg.Metadata.Get(MetadataSequence), &seq)
					w.keyOrder[k] = append(w.keyOrder[k], seq)
				}
			}
			w.mu.Unlock()
			if err != nil {
				SetNackError(msg, err)
				msg.Nack()
				continue
			}
			msg.Ack()
		}
	}()
}

// waitAll waits (virtual time) until every row is published, or fails after limit.
func (w *destWorld) waitAll(t *testing.T, limit time.Duration) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		done := true
		for _, r := range w.db.Rows() {
			if r.PublishedAt.IsZero() {
				done = false
				break
			}
		}
		if done {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not every event published within %s", limit)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// checkOrder fails when a key's events were acked out of sequence order or more than once.
func (w *destWorld) checkOrder(t *testing.T) {
	t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	for k, seqs := range w.keyOrder {
		if !slices.IsSorted(seqs) {
			t.Errorf("key %s acked out of order: %v", k, seqs)
		}
	}
}

func destRelayConfig() SubscriberConfig {
	return SubscriberConfig{PollInterval: 50 * time.Millisecond, BatchSize: 100, MaxRunPerKey: 10, Concurrency: 8,
		UnavailableBackoff: 100 * time.Millisecond, UnavailableBackoffMax: 2 * time.Second, MarkInterval: 50 * time.Millisecond,
		RetryBase: 100 * time.Millisecond, RetryMax: time.Second, LeaseDuration: 20 * time.Second, DeliveryTimeout: 5 * time.Second,
		CloseTimeout: time.Second}
}

// A destination limited to 100 events/s is delivered at 100/s while another destination of
// the same topic and relay is delivered at once; nothing counts an attempt, key order holds.
func TestDestinationRateLimit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := destRelayConfig()
		cfg.DestinationLimits = map[string]DestinationLimit{"slow": {Rate: 100, Burst: 10}}
		var heldMu sync.Mutex
		held := map[string]int{}
		cfg.Hooks.OnHeld = func(i HeldInfo) {
			heldMu.Lock()
			held[i.Destination+"/"+i.Reason]++
			heldMu.Unlock()
		}
		w := newDestWorld(t, cfg)
		var slowKeys, fastKeys []string
		for i := range 1000 {
			slowKeys = append(slowKeys, fmt.Sprintf("s%02d", i%20))
			fastKeys = append(fastKeys, fmt.Sprintf("f%02d", i%20))
		}
		began := time.Now()
		w.write(t, "slow", slowKeys...)
		w.write(t, "fast", fastKeys...)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		w.run(ctx, t)
		w.waitAll(t, time.Minute)
		cancel()
		w.sub.Close()
		w.checkOrder(t)
		slow, fast := w.delivered["slow"], w.delivered["fast"]
		if len(slow) != 1000 || len(fast) != 1000 {
			t.Fatalf("delivered slow %d fast %d, want 1000 each", len(slow), len(fast))
		}
		// The rate over the deliveries after the first burst.
		span := slow[len(slow)-1].Sub(slow[9]).Seconds()
		rate := float64(len(slow)-10) / span
		fastDone := fast[len(fast)-1].Sub(began)
		t.Logf("slow: %.1f events/s over %.2f s (%d sent); fast: all delivered %.2f s after the start", rate, span, w.sent["slow"], fastDone.Seconds())
		if rate < 90 || rate > 110 {
			t.Errorf("limited destination delivered at %.1f events/s, want 100 ± 10%%", rate)
		}
		if fastDone > 2*time.Second {
			t.Errorf("unlimited destination took %s to deliver 1000 events, want it not held back by the limited one (≤ 2 s)", fastDone)
		}
		heldMu.Lock()
		if len(held) != 1 || held["slow/rate"] == 0 {
			t.Errorf("OnHeld calls %v, want some for slow/rate only", held)
		}
		heldMu.Unlock()
		if w.sent["slow"] != 1000 {
			t.Errorf("limited destination received %d messages, want 1000 (held events are not sent)", w.sent["slow"])
		}
		for _, r := range w.db.Rows() {
			if r.Attempts != 0 {
				t.Fatalf("event %d: %d attempts, want 0 (a held event counts none)", r.Sequence, r.Attempts)
			}
		}
	})
}

// 50 destinations on one topic, one of them down for 60 s: the other 49 are delivered during
// the outage as fast as without it, the down one's events are held (no attempt counted, a few
// probes sent) and delivered in key order once it is back.
func TestDestinationOutageHoldsOnlyItsEvents(t *testing.T) {
	p99 := func(outage bool) (time.Duration, *destWorld) {
		var p time.Duration
		var world *destWorld
		synctest.Test(t, func(t *testing.T) {
			w := newDestWorld(t, destRelayConfig())
			world = w
			start := w.start
			down := func() bool { return outage && time.Since(start) < 60*time.Second }
			w.answer = func(dest string, msg *message.Message) error {
				if dest == "d00" && down() {
					return &UnavailableError{Destination: "d00", Err: errors.New("connection refused")}
				}
				return nil
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			w.run(ctx, t)
			// About 90 s of writes, 5 events per 100 ms over 50 destinations, d00 getting one in five;
			// keys stay with their destination, but for key "mix", whose events alternate
			// between d00 and d01.
			n := 0
			for tick := 0; tick < 900; tick++ {
				for j := 0; j < 5; j++ {
					d := 1 + n%49
					if n%5 == 0 {
						d = 0
					}
					key := fmt.Sprintf("k%02d-%d", d, n%7)
					switch {
					case n%50 == 1 && n%100 == 1:
						w.write(t, "d00", "mix")
					case n%50 == 1:
						w.write(t, "d01", "mix")
					default:
						w.write(t, fmt.Sprintf("d%02d", d), key)
					}
					n++
				}
				// Ticks 80-120 ms apart, so that writes do not fall in step with the polls.
				time.Sleep(time.Duration(80+tick*37%41) * time.Millisecond)
			}
			w.waitAll(t, 2*time.Minute)
			cancel()
			w.sub.Close()
			w.checkOrder(t)
			// Commit → delivery of the healthy destinations' events written during the outage.
			var lat []time.Duration
			w.mu.Lock()
			for _, r := range w.db.Rows() {
				if at := w.committed[r.ID]; at.Sub(start) < 60*time.Second && r.Headers != `{"dest":"d00"}` && r.OrderingKey != nil && *r.OrderingKey != "mix" {
					lat = append(lat, r.PublishedAt.Sub(at))
				}
			}
			w.mu.Unlock()
			sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
			p = lat[len(lat)*99/100]
			for _, r := range w.db.Rows() {
				if r.Attempts != 0 {
					t.Errorf("event %d (%s): %d attempts, want 0 (unavailable and held count none)", r.Sequence, r.Headers, r.Attempts)
				}
			}
		})
		return p, world
	}
	base, _ := p99(false)
	withOutage, w := p99(true)
	t.Logf("healthy destinations' p99 commit → delivery: %s without the outage, %s with d00 down for 60 s; d00 received %d messages for %d events",
		base, withOutage, w.sent["d00"], len(w.delivered["d00"]))
	if withOutage > 2*base {
		t.Errorf("p99 with the outage %s, want ≤ 2 × %s", withOutage, base)
	}
	// Without holding, each of d00's events would be sent and refused at least once (and
	// again after each backoff); held, d00 gets its probes: about 1 + 32·ln(60 s / 3.2 s) + 32.
	d00 := 0
	for _, r := range w.db.Rows() {
		if r.Headers == `{"dest":"d00"}` {
			d00++
			if r.PublishedAt.Sub(w.start) < 60*time.Second {
				t.Errorf("d00's event %d published at %s, during its outage", r.Sequence, r.PublishedAt)
			}
		}
	}
	if refused := w.sent["d00"] - len(w.delivered["d00"]); refused > 130 || len(w.delivered["d00"]) != d00 {
		t.Errorf("d00 refused %d messages during its outage, want its probes only (≤ 130 of its %d events); %d delivered", refused, d00, len(w.delivered["d00"]))
	}
}
