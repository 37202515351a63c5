package engine

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/watermill-outbox/outbox/internal/dialect"
)

// slowSweeper is a dialect.Sweeper whose sweep takes took and finds nothing.
type slowSweeper struct {
	took  time.Duration
	calls int
}

func (s *slowSweeper) Sweep(context.Context, dialect.Executor, int64, int64) (int64, int64, error) {
	s.calls++
	time.Sleep(s.took)
	return 0, 0, nil
}

// TestSweepSpacedByItsCost: the next sweep waits sweepCostFactor times the last sweep's
// duration when that is longer than the interval, the interval otherwise; no sweep runs while
// the floors are at the start.
func TestSweepSpacedByItsCost(t *testing.T) {
	sub := &subscription{s: &Relay{logger: watermill.NopLogger{}}}
	w := &sweeper{every: 100 * time.Millisecond}
	ctx := context.Background()

	sw := &slowSweeper{took: 20 * time.Millisecond}
	if next := w.sweep(ctx, sub, sw); next != w.every || sw.calls != 0 {
		t.Fatalf("floors at 0: next %v after %d sweeps, want %v after none", next, sw.calls, w.every)
	}
	w.keyed.Store(500)
	next := w.sweep(ctx, sub, sw)
	if sw.calls != 1 || next < sweepCostFactor*sw.took || next > sweepCostFactor*(sw.took+time.Second) {
		t.Fatalf("a %v sweep: next in %v after %d sweeps, want about %v", sw.took, next, sw.calls, sweepCostFactor*sw.took)
	}
	sw.took = 0
	if next := w.sweep(ctx, sub, sw); next != w.every || sw.calls != 2 {
		t.Fatalf("a fast sweep: next in %v after %d sweeps, want %v", next, sw.calls, w.every)
	}
}
