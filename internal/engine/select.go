package engine

import (
	"fmt"
	"time"
)

// deliverable returns the events of a claimed batch to emit: each key's gap-free run from its
// head, without poison events (dropPoison) and, in a batch claimed ahead, without the events
// of topics paused since (dropPaused); the rest is released. A batch with a suspect delivers
// one event (isolate).
func (sub *subscription) deliverable(b *leased) []*item {
	deliver, release := splitRuns(b.items)
	for _, it := range release {
		it.state = stateReleased
	}
	deliver = sub.dropPoison(deliver)
	if b.prefetched {
		deliver = sub.dropPaused(deliver)
	}
	return sub.isolate(b, deliver)
}

// splitRuns keeps, for each ordering key, only the run that starts at the key's head with no
// gap (a run member skipped by SKIP LOCKED or changed concurrently breaks the run); the rest is
// released. Items are in sequence order.
func splitRuns(items []*item) (deliver, release []*item) {
	next := map[string]int64{}
	broken := map[string]bool{}
	for _, it := range items {
		k := it.ev.OrderingKey
		if k == "" {
			deliver = append(deliver, it)
			continue
		}
		want, ok := next[k]
		if !ok {
			want = 1
		}
		if broken[k] || it.rank != want {
			broken[k] = true
			release = append(release, it)
			continue
		}
		next[k] = want + 1
		deliver = append(deliver, it)
	}
	return deliver, release
}

// dropPoison takes out of deliver (in sequence order) the events whose deliveries started more
// than MaxDeliveryStarts times without an outcome — a relay stopped or crashed while delivering
// each time — and dead-letters them (ErrPoisonEvent); their keys' later events are released.
func (sub *subscription) dropPoison(deliver []*item) []*item {
	limit := sub.s.cfg.MaxDeliveryStarts
	var (
		out    []*item
		poison map[string]bool
	)
	for i, it := range deliver {
		k := it.ev.OrderingKey
		switch {
		case k != "" && poison[k]:
			it.state = stateReleased
		case it.ev.DeliveryStarts > limit:
			it.state, it.perm = stateFailed, true
			it.err = fmt.Errorf("%w: %d deliveries started without an outcome (SubscriberConfig.MaxDeliveryStarts %d)", ErrPoisonEvent, it.ev.DeliveryStarts-1, limit)
			if out == nil {
				out = append(make([]*item, 0, len(deliver)), deliver[:i]...)
			}
			if k != "" {
				if poison == nil {
					poison = map[string]bool{}
				}
				poison[k] = true
			}
			continue
		}
		if out != nil && it.state != stateReleased {
			out = append(out, it)
		}
	}
	if out == nil {
		return deliver
	}
	return out
}

// dropPaused takes out of deliver (in sequence order) the events of topics paused by an
// outage that opened after their batch was claimed ahead, and their keys' later events: they
// are released without an attempt, as if the claim had left them out.
func (sub *subscription) dropPaused(deliver []*item) []*item {
	if len(sub.outages) == 0 {
		return deliver
	}
	paused := map[string]bool{}
	for _, t := range sub.pausedTopics(time.Now()) {
		paused[t] = true
	}
	if len(paused) == 0 {
		return deliver
	}
	out := deliver[:0:0]
	held := map[string]bool{}
	for _, it := range deliver {
		k := it.ev.OrderingKey
		if paused[it.ev.Topic] || (k != "" && held[k]) {
			it.state = stateReleased
			if k != "" {
				held[k] = true
			}
			continue
		}
		out = append(out, it)
	}
	return out
}
