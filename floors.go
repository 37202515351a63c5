package outbox

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/watermill-outbox/outbox/internal/dialect"
)

// keyLows are per-key sequences below which every event of the key is published (the heads the
// relay claimed: a claimed head is its key's first unpublished event, and per-key commit order
// keeps any later event of the key above it), sent with each claim so that its head checks start
// there instead of at the key's first index entry (see the walk fragment of claim.sql). At most
// maxKeyLows keys are kept: when full, the map starts over (many distinct keys have few events
// each, so a head check of theirs has little to step over).
type keyLows map[string]int64

const maxKeyLows = 1024

// note records the heads of a claim's items (rank 1), but not a continuation's first event: the
// events before it are this relay's, and their marks may still fail (see subscription.confirm).
func (l *keyLows) note(items []*item) {
	for _, it := range items {
		if it.rank != 1 || it.cont || it.ev.OrderingKey == "" {
			continue
		}
		if len(*l) >= maxKeyLows {
			*l = make(keyLows, maxKeyLows)
		}
		(*l)[it.ev.OrderingKey] = it.ev.Sequence
	}
}

// params returns the lows for a claim.
func (l keyLows) params() []dialect.KeyLow {
	out := make([]dialect.KeyLow, 0, len(l))
	for k, v := range l {
		out = append(out, dialect.KeyLow{Key: k, Low: v})
	}
	return out
}

// sweepInterval is how often a subscription with floors sweeps below them (dialect.Sweeper) for
// events no claim can find any more: a key the relay was following when it stopped (see
// subscription.follow), or an event written without the Publisher in a transaction that had no
// transaction id yet (the floors' settling assumes one). It reads the history below the floors,
// beside the claims.
var sweepInterval = 30 * time.Second // a variable for the tests (export_test.go)

// sweeper runs the sweeps of one subscription until ctx ends; found receives the lowest
// sequences found below the floors that were current when the sweep began.
type sweeper struct {
	every            time.Duration // sweepInterval when the subscription started
	keyed, unordered atomic.Int64  // the floors, published by the claiming goroutine
	// foundKeyed and foundUnordered are what the last sweeps found (0: nothing), taken by the
	// next claim.
	foundKeyed, foundUnordered atomic.Int64
}

// run sweeps every sweepInterval until ctx ends.
func (w *sweeper) run(ctx context.Context, sub *subscription, sw dialect.Sweeper) {
	t := time.NewTicker(w.every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		fk, fu := w.keyed.Load(), w.unordered.Load()
		if fk <= 1 && fu <= 1 {
			continue
		}
		k, u, err := sw.Sweep(ctx, sub.s.db, fk, fu)
		if err != nil {
			if ctx.Err() == nil {
				sub.s.logger.Debug("outbox: sweep below the claim floors failed", watermill.LogFields{"error": err.Error()})
			}
			continue
		}
		if k > 0 || u > 0 {
			sub.s.logger.Info("outbox: found events below the claim floors; claiming them", watermill.LogFields{"keyed": k, "unordered": u})
			w.foundKeyed.Store(k)
			w.foundUnordered.Store(u)
		}
	}
}

// take returns and clears what the sweeps found.
func (w *sweeper) take() (keyed, unordered int64) {
	return w.foundKeyed.Swap(0), w.foundUnordered.Swap(0)
}
