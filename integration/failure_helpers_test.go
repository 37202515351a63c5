package integration_test

// Shared checks of the failure-class tests (failure_*_test.go): permanent errors dead-letter
// at the first attempt, and a failing event of a key has none of its key's later events on the
// broker before it.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"

	"github.com/watermill-outbox/outbox"
)

// checkDeadAtFirstAttempt asserts that exactly the events dead were dead-lettered, each at its
// first attempt with an error matching outbox.ErrPermanent and target, and that no other event
// failed (see checkDeadAfter).
func (e *fwdEnv) checkDeadAtFirstAttempt(dead []*fwdEvent, target error) {
	e.t.Helper()
	want := map[*fwdEvent]int{}
	for _, ev := range dead {
		want[ev] = 1
	}
	e.checkDeadAfter(want, target)
}

// checkDeadAfter asserts that exactly the events of want were dead-lettered, each after want[ev]
// failed attempts (reported to the hooks and counted in the row, which has a last_error), and
// that no other event had a failed attempt. An event dead-lettered at its first attempt must
// have failed with an error matching outbox.ErrPermanent and, when not nil, permanentCause.
func (e *fwdEnv) checkDeadAfter(want map[*fwdEvent]int, permanentCause error) {
	e.t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	byID := map[string]*fwdEvent{}
	for ev := range want {
		byID[ev.id] = ev
		f, ok := e.dead[ev.id]
		switch {
		case !ok:
			e.t.Errorf("event %s not dead-lettered", ev.id)
		case f.Attempts != want[ev]:
			e.t.Errorf("event %s dead-lettered at attempt %d, want %d", ev.id, f.Attempts, want[ev])
		case want[ev] == 1 && (!errors.Is(f.Err, outbox.ErrPermanent) || (permanentCause != nil && !errors.Is(f.Err, permanentCause))):
			e.t.Errorf("event %s dead-lettered with %v, want a permanent %v", ev.id, f.Err, permanentCause)
		}
	}
	if len(e.dead) != len(want) {
		e.t.Errorf("%d events dead-lettered, want %d", len(e.dead), len(want))
	}
	failures := map[string]int{}
	for _, f := range e.failed {
		failures[f.EventID]++
		if byID[f.EventID] == nil {
			e.t.Errorf("event %s (not expected to fail) failed: %v", f.EventID, f.Err)
		}
	}
	for ev, n := range want {
		if failures[ev.id] != n {
			e.t.Errorf("event %s reported %d failures, want %d", ev.id, failures[ev.id], n)
		}
		q := fmt.Sprintf(`SELECT count(*) FROM %q WHERE id = $1 AND dead_lettered_at IS NOT NULL AND published_at IS NULL AND attempts = $2 AND last_error <> ''`, e.schema.Table)
		var c int
		if err := e.pool.QueryRow(context.Background(), q, ev.id, n).Scan(&c); err != nil {
			e.t.Fatal(err)
		}
		if c != 1 {
			e.t.Errorf("event %s: no dead-lettered row with %d attempts and a last_error", ev.id, n)
		}
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

// checkOrderOnce asserts that got holds exactly the events want, once each, and every ordering
// key's events in their order (the order of got), whatever their attempt numbers.
func (e *fwdEnv) checkOrderOnce(got []fwdReceived, want []*fwdEvent) {
	e.t.Helper()
	byID := map[string]*fwdEvent{}
	for _, ev := range want {
		byID[ev.id] = ev
	}
	seen := map[string]bool{}
	next := map[string]int{}
	for _, r := range got {
		ev := byID[r.uuid]
		switch {
		case ev == nil:
			e.t.Errorf("unexpected message %s", r.uuid)
			continue
		case seen[r.uuid]:
			e.t.Errorf("event %s received twice", r.uuid)
			continue
		}
		seen[r.uuid] = true
		if ev.key != "" {
			if ev.pos != next[ev.key] {
				e.t.Errorf("key %s: position %d received where %d was due", ev.key, ev.pos, next[ev.key])
			}
			next[ev.key] = ev.pos + 1
		}
	}
	if len(seen) != len(want) {
		e.t.Errorf("%d of %d events received", len(seen), len(want))
	}
}

// addWithHeaders writes one event of key with the given headers (plus "source").
func (e *fwdEnv) addWithHeaders(topic, key string, headers map[string]string) *fwdEvent {
	e.t.Helper()
	ev := &fwdEvent{topic: topic, key: key, pos: e.pos[key], payload: map[string]any{"key": key, "pos": float64(e.pos[key])},
		headers: map[string]string{"source": "fwd-test"}}
	for k, v := range headers {
		ev.headers[k] = v
	}
	e.pos[key]++
	body, _ := json.Marshal(ev.payload)
	msg := outbox.NewMessage(body)
	for k, v := range ev.headers {
		msg.Metadata.Set(k, v)
	}
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
