package mysql

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/watermill-outbox/outbox/internal/dialect"
)

// ledger checks relays sharing a table: no event is leased by two relays at once, every
// claimed keyed event's predecessors of its key were acked before (acks are recorded before
// their mark is written, so a mark's commit is never ahead of the record), each claim's runs
// are ranked 1, 2 … in sequence order, and (drains) every event is acked exactly once.
type ledger struct {
	mu     sync.Mutex
	keyOf  map[int64]string
	byKey  map[string][]int64 // in sequence order
	leased map[int64]bool
	acked  map[int64]int
	claims int
	errs   []string
}

func newLedger(stored []dialect.Stored) *ledger {
	l := &ledger{keyOf: map[int64]string{}, byKey: map[string][]int64{}, leased: map[int64]bool{}, acked: map[int64]int{}}
	for _, s := range stored {
		if s.OrderingKey != nil {
			l.keyOf[s.Sequence] = *s.OrderingKey
			l.byKey[*s.OrderingKey] = append(l.byKey[*s.OrderingKey], s.Sequence)
		}
	}
	return l
}

func (l *ledger) fail(format string, args ...any) {
	if len(l.errs) < 10 {
		l.errs = append(l.errs, fmt.Sprintf(format, args...))
	}
}

// claimed checks a claim's events (in sequence order).
func (l *ledger) claimed(evs []dialect.Claimed) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.claims++
	rank := map[string]int64{}
	for _, e := range evs {
		if l.leased[e.Sequence] {
			l.fail("event %d leased twice at once", e.Sequence)
		}
		l.leased[e.Sequence] = true
		if e.OrderingKey == nil {
			if e.Rank != 0 {
				l.fail("unordered event %d has rank %d", e.Sequence, e.Rank)
			}
			continue
		}
		k := *e.OrderingKey
		rank[k]++
		if e.Rank != rank[k] {
			l.fail("event %d of %s has rank %d, want %d", e.Sequence, k, e.Rank, rank[k])
		}
		for _, prev := range l.byKey[k] {
			if prev >= e.Sequence {
				break
			}
			if l.acked[prev] == 0 && !(rank[k] > 1 && l.leased[prev]) {
				l.fail("event %d of %s claimed before %d was acked", e.Sequence, k, prev)
			}
		}
	}
}

// answered records a batch's outcome before its mark is written.
func (l *ledger) answered(acked, other []int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, s := range acked {
		l.acked[s]++
		delete(l.leased, s)
	}
	for _, s := range other {
		delete(l.leased, s)
	}
}

// relayLoop claims and marks until stop says so: each claimed event is acked, or with
// probability failRate failed (its key's later events of the batch released).
func relayLoop(t *testing.T, tb *dialect.Table, cfg dialect.RelayConfig, name string, l *ledger, failRate float64, stop func(empty bool) bool) error {
	r := New().NewRelay(tb, cfg, all)
	ctx := context.Background()
	for i := 0; ; i++ {
		token := fmt.Sprintf("%s#%012x#%d", name, 0, i)
		res, err := r.Claim(ctx, sqlEx(testDB), &dialect.ClaimParams{Token: token, Limit: cfg.BatchSize, Oldest: cfg.BatchSize})
		if err != nil {
			return fmt.Errorf("%s claim: %w", name, err)
		}
		if stop(len(res.Events) == 0) {
			return nil
		}
		l.claimed(res.Events)
		m := &dialect.MarkParams{Token: token}
		failedKey := map[string]bool{}
		for _, e := range res.Events {
			switch {
			case e.OrderingKey != nil && failedKey[*e.OrderingKey]:
				m.Released = append(m.Released, e.Sequence)
			case rand.Float64() < failRate:
				m.Failed = append(m.Failed, e.Sequence)
				m.Errs = append(m.Errs, "boom")
				m.Perm = append(m.Perm, false)
				m.Jitters = append(m.Jitters, 1)
				if e.OrderingKey != nil {
					failedKey[*e.OrderingKey] = true
				}
			default:
				m.Acked = append(m.Acked, e.Sequence)
			}
		}
		l.answered(m.Acked, append(append([]int64(nil), m.Failed...), m.Released...))
		mr, err := r.Mark(ctx, sqlEx(testDB), m)
		if err != nil {
			return fmt.Errorf("%s mark: %w", name, err)
		}
		if len(mr) != len(res.Events) {
			return fmt.Errorf("%s mark wrote %d of %d events", name, len(mr), len(res.Events))
		}
	}
}

// 10,000 events over 100 keys (and some unordered) drained by two relays: each event acked
// exactly once, each key in order.
func TestDrainTwoRelays(t *testing.T) {
	tb := newTable(t)
	rows := make([]dialect.InsertRow, 10000)
	for i := range rows {
		k := fmt.Sprintf("key%03d", rand.IntN(100))
		if i%10 == 0 {
			k = ""
		}
		rows[i] = ev("t", `{"n":1}`, k, "")
	}
	stored := mustInsert(t, tb, rows...)
	l := newLedger(stored)
	cfg := relayConfig(100, 10)
	began := time.Now()
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			empty := 0
			errs[i] = relayLoop(t, tb, cfg, fmt.Sprint("relay", i), l, 0, func(e bool) bool {
				if !e {
					empty = 0
					return false
				}
				empty++
				return empty >= 3 // the other relay's marks may still be in flight
			})
		}()
	}
	wg.Wait()
	took := time.Since(began)
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, e := range l.errs {
		t.Error(e)
	}
	if len(l.acked) != len(rows) {
		t.Fatalf("%d events acked, want %d", len(l.acked), len(rows))
	}
	for s, n := range l.acked {
		if n != 1 {
			t.Fatalf("event %d acked %d times", s, n)
		}
	}
	if n := queryInt64s(t, "SELECT COUNT(*) FROM "+namesOf(tb).table+" WHERE published_at IS NULL")[0]; n != 0 {
		t.Fatalf("%d events unpublished", n)
	}
	t.Logf("drained %d events with two relays in %v (%.0f events/s, -race); deadlocked transactions run again so far: %d", len(rows), took, float64(len(rows))/took.Seconds(), deadlocks.Load())
}

// Four relays on 10 hot keys with failures (retried after 1 ms): no event is leased twice at
// once, no key's event is claimed before its predecessors were acked.
func TestConcurrentClaimersKeepKeyOrder(t *testing.T) {
	tb := newTable(t)
	rows := make([]dialect.InsertRow, 2000)
	for i := range rows {
		k := fmt.Sprintf("hot%d", rand.IntN(10))
		if i%5 == 0 {
			k = ""
		}
		rows[i] = ev("t", `1`, k, "")
	}
	stored := mustInsert(t, tb, rows...)
	l := newLedger(stored)
	cfg := relayConfig(50, 10)
	cfg.RetryBase, cfg.RetryMax, cfg.MaxAttempts = time.Millisecond, time.Millisecond, 1000
	deadline := time.Now().Add(60 * time.Second)
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = relayLoop(t, tb, cfg, fmt.Sprint("c", i), l, 0.1, func(bool) bool {
				l.mu.Lock()
				defer l.mu.Unlock()
				return len(l.acked) == len(rows) || time.Now().After(deadline)
			})
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, e := range l.errs {
		t.Error(e)
	}
	if len(l.acked) != len(rows) {
		t.Fatalf("%d of %d events acked within the deadline", len(l.acked), len(rows))
	}
	t.Logf("%d claims; deadlocked transactions run again so far: %d", l.claims, deadlocks.Load())
	for s, n := range l.acked {
		if n != 1 {
			t.Fatalf("event %d acked %d times", s, n)
		}
	}
}
