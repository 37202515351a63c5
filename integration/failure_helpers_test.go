package integration_test

// Shared checks of the failure-class tests (failure_*_test.go): permanent errors dead-letter
// at the first attempt, and a failing event of a key has none of its key's later events on the
// broker before it.

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/watermill-outbox/outbox"
)

// checkDeadAtFirstAttempt asserts that exactly the events dead were dead-lettered, each at its
// first attempt (one failure reported, Attempts 1, no backoff) with an error matching
// outbox.ErrPermanent and target, and that no other event failed.
func (e *fwdEnv) checkDeadAtFirstAttempt(dead []*fwdEvent, target error) {
	e.t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	deadSet := map[string]bool{}
	for _, ev := range dead {
		deadSet[ev.id] = true
		f, ok := e.dead[ev.id]
		switch {
		case !ok:
			e.t.Errorf("event %s not dead-lettered", ev.id)
		case f.Attempts != 1:
			e.t.Errorf("event %s dead-lettered at attempt %d, want 1", ev.id, f.Attempts)
		case !errors.Is(f.Err, outbox.ErrPermanent) || (target != nil && !errors.Is(f.Err, target)):
			e.t.Errorf("event %s dead-lettered with %v, want a permanent %v", ev.id, f.Err, target)
		}
	}
	if len(e.dead) != len(dead) {
		e.t.Errorf("%d events dead-lettered, want %d", len(e.dead), len(dead))
	}
	failures := map[string]int{}
	for _, f := range e.failed {
		failures[f.EventID]++
		if !deadSet[f.EventID] {
			e.t.Errorf("event %s (not expected to fail) failed: %v", f.EventID, f.Err)
		}
	}
	for _, ev := range dead {
		if failures[ev.id] != 1 {
			e.t.Errorf("event %s reported %d failures, want 1 (the dead letter)", ev.id, failures[ev.id])
		}
	}
	var n int
	q := fmt.Sprintf(`SELECT count(*) FROM %q WHERE dead_lettered_at IS NOT NULL AND published_at IS NULL AND attempts = 1 AND last_error <> ''`, e.schema.Table)
	if err := e.pool.QueryRow(context.Background(), q).Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	if n != len(dead) {
		e.t.Errorf("%d dead-lettered rows with 1 attempt and a last_error, want %d", n, len(dead))
	}
}

// checkUntouched asserts that the events evs are pending with no attempt counted.
func (e *fwdEnv) checkUntouched(evs []*fwdEvent) {
	e.t.Helper()
	for _, ev := range evs {
		if n := e.count(fmt.Sprintf("id = '%s' AND published_at IS NULL AND dead_lettered_at IS NULL AND attempts = 0", ev.id)); n != 1 {
			e.t.Errorf("event %s (key %s, position %d) not pending untouched", ev.id, ev.key, ev.pos)
		}
	}
}

// checkWireOrder asserts, for the message ids in the order a broker holds them (one stream,
// queue or partition), that every failed event's later events of the same ordering key are
// absent: none of them is on the broker while the failed one is not, so none can be ahead of it.
func checkWireOrder(t *testing.T, onBroker []string, failed []*fwdEvent, all []*fwdEvent) {
	t.Helper()
	on := map[string]bool{}
	for _, id := range onBroker {
		on[id] = true
	}
	for _, f := range failed {
		if on[f.id] {
			t.Errorf("failed event %s is on the broker", f.id)
		}
		for _, ev := range all {
			if ev.key == f.key && ev.pos > f.pos && on[ev.id] {
				t.Errorf("event %s (key %s, position %d) is on the broker although position %d of its key failed", ev.id, ev.key, ev.pos, f.pos)
			}
		}
	}
}
