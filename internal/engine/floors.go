package engine

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/watermill-outbox/outbox/internal/dialect"
)

// keyLows are per-key sequences below which every event of the key is published, sent with
// each claim so that its head checks start there instead of at the key's first index entry (see
// the walk step of the PostgreSQL claim). They come from the heads the relay claimed (a claimed head is
// its key's first unpublished event, and per-key commit order keeps any later event of the key
// above it) and from the marks it wrote (a run acked and written from its start: every event up
// to its last is published; without this a key served by continuations kept the low of its first
// head, and under a held snapshot its head checks read every event published since). At most
// maxKeyLows keys are kept: when full, the map starts over (many distinct keys have few events
// each, so a head check of theirs has little to step over). Safe for concurrent use (marks are
// written beside the next claim).
type keyLows struct {
	mu sync.Mutex
	m  map[string]int64
}

const maxKeyLows = 1024

// set raises key's low to low. Call with l.mu held.
func (l *keyLows) set(key string, low int64) {
	if l.m == nil || (len(l.m) >= maxKeyLows && l.m[key] == 0) {
		l.m = make(map[string]int64, maxKeyLows)
	}
	l.m[key] = max(l.m[key], low)
}

// note records the heads of a claim's items (rank 1), but not a continuation's first event: the
// events before it are this relay's, and their marks may still fail (see subscription.confirm).
func (l *keyLows) note(items []*item) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, it := range items {
		if it.rank == 1 && !it.cont && it.ev.OrderingKey != "" {
			l.set(it.ev.OrderingKey, it.ev.Sequence)
		}
	}
}

// noteWritten records, for each key of a batch whose marks were written, the event after the
// last of the key's run that was acked and written as published without a gap from the run's
// start. Items are in sequence order.
func (l *keyLows) noteWritten(items []*item, written func(*item) bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	broken := map[string]bool{}
	for _, it := range items {
		k := it.ev.OrderingKey
		if k == "" || broken[k] || it.rank < 1 {
			continue
		}
		if !written(it) {
			broken[k] = true
			continue
		}
		l.set(k, it.ev.Sequence+1)
	}
}

// params returns the lows for a claim.
func (l *keyLows) params() []dialect.KeyLow {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]dialect.KeyLow, 0, len(l.m))
	for k, v := range l.m {
		out = append(out, dialect.KeyLow{Key: k, Low: v})
	}
	return out
}

// defaultSweepInterval is how often a subscription with floors sweeps below them (dialect.Sweeper) for
// events no claim can find any more: a key the relay was following when it stopped (see
// subscription.follow), or an event written without the Publisher in a transaction that had no
// transaction id yet (the floors' settling assumes one). It reads the history below the floors,
// beside the claims.
const defaultSweepInterval = 30 * time.Second

// sweepCostFactor spaces sweeps by at least this many times the last sweep's duration. A sweep
// reads the pending-event index below the floors, and under a long-open snapshot that index
// keeps an entry for every event written since the snapshot (VACUUM cannot remove them), so a
// sweep's cost grows with the snapshot's age: at 1,000 events/s with a snapshot held for 10
// minutes a sweep took 1.2 s of a core, every 30 s, on a 2-core machine already busy with the
// writers, and the relay's delivery fell behind while it ran. Spaced this way, sweeps use at
// most about 1/sweepCostFactor of a core; what they look for (the stranded events above) is
// rare, and only waits longer to be found.
const sweepCostFactor = 50

// sweeper runs the sweeps of one subscription until ctx ends; found receives the lowest
// sequences found below the floors that were current when the sweep began.
type sweeper struct {
	every            time.Duration // Config.SweepInterval
	keyed, unordered atomic.Int64  // the floors, published by the claiming goroutine
	// foundKeyed and foundUnordered are what the last sweeps found (0: nothing), taken by the
	// next claim.
	foundKeyed, foundUnordered atomic.Int64
}

// run sweeps every w.every, or sweepCostFactor times the last sweep's duration when that is
// longer, until ctx ends.
func (w *sweeper) run(ctx context.Context, sub *subscription, sw dialect.Sweeper) {
	t := time.NewTimer(w.every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		t.Reset(w.sweep(ctx, sub, sw))
	}
}

// sweep runs one sweep and returns the wait before the next.
func (w *sweeper) sweep(ctx context.Context, sub *subscription, sw dialect.Sweeper) time.Duration {
	fk, fu := w.keyed.Load(), w.unordered.Load()
	if fk <= 1 && fu <= 1 {
		return w.every
	}
	began := time.Now()
	k, u, err := sw.Sweep(ctx, sub.s.db, fk, fu)
	took := time.Since(began)
	next := max(w.every, sweepCostFactor*took)
	sub.s.logger.Trace("outbox: swept below the claim floors", watermill.LogFields{"keyed_floor": fk, "unordered_floor": fu, "duration": took, "next_in": next})
	if err != nil {
		if ctx.Err() == nil {
			sub.s.logger.Debug("outbox: sweep below the claim floors failed", watermill.LogFields{"error": err.Error()})
		}
		return next
	}
	if k > 0 || u > 0 {
		sub.s.logger.Info("outbox: found events below the claim floors; claiming them", watermill.LogFields{"keyed": k, "unordered": u})
		w.foundKeyed.Store(k)
		w.foundUnordered.Store(u)
	}
	return next
}

// take returns and clears what the sweeps found.
func (w *sweeper) take() (keyed, unordered int64) {
	return w.foundKeyed.Swap(0), w.foundUnordered.Swap(0)
}
