package engine

import (
	"github.com/ThreeDotsLabs/watermill"
)

// isolate delivers a suspect alone. A suspect is an event at its last allowed start: this
// claim's start is its MaxDeliveryStarts-th without an outcome, so a relay died (or lost its
// lease) with it out at every start before. Until then the deaths charge every event that was
// out, as a claim counts a start for each event it leases; the last start is made alone, so a
// batch that keeps killing the relay dead-letters only the event that kills it, and an event
// that was only out beside it ends its suspect start with an outcome. When deliver (a claimed
// batch's deliverable events, in sequence order) holds a suspect, only the head of the first
// suspect's key (the suspect itself when it has no key, or when it is the head) is delivered,
// and every other event is set aside: released with the start this claim counted taken back,
// before anything is emitted. A batch claimed ahead delivers no suspect: it is set aside
// whole, and the next claim (not ahead) isolates. The batch's marks land before the next
// claim, so an isolated event's ack is never lost to the next one's death. While isolating,
// claims take one keyed event (ClaimParams.Limit; the unordered events and a dialect that
// does not cap are set aside as above); a claim of one that finds no suspect is followed by a
// whole one, and the episode ends when a whole claim finds none. Off when
// MaxDeliveryStarts is 1 (every claim would be a last start). Poll goroutine.
func (sub *subscription) isolate(b *leased, deliver []*item) []*item {
	limit := sub.s.cfg.MaxDeliveryStarts
	if limit < 2 {
		return deliver
	}
	first := -1
	suspects := 0
	for i, it := range deliver {
		if it.ev.DeliveryStarts >= limit {
			if first < 0 {
				first = i
			}
			suspects++
		}
	}
	if first < 0 {
		if !b.prefetched {
			sub.endIsolation()
		}
		return deliver
	}
	sub.oneNext = true
	b.isolated = true
	var keep *item
	if !b.prefetched {
		keep = deliver[first]
		if k := keep.ev.OrderingKey; k != "" {
			for _, it := range deliver[:first] {
				if it.ev.OrderingKey == k {
					keep = it // the key's head: its run goes out in order
					break
				}
			}
		}
	}
	if !sub.isolating {
		sub.isolating = true
		sub.s.logger.Info("outbox: isolating suspect events: their deliveries started MaxDeliveryStarts-1 times without an outcome (a relay died with them out); their last start is made one event at a time, so that only an event that kills the relay is dead-lettered", watermill.LogFields{"suspects": suspects, "max_delivery_starts": limit})
	}
	aside := make([]*item, 0, len(deliver))
	for _, it := range deliver {
		if it != keep {
			aside = append(aside, it)
		}
	}
	sub.setAside(b, aside)
	if keep == nil {
		return nil
	}
	sub.serialFor = max(sub.serialFor, 1) // its marks land before the next claim
	return []*item{keep}
}

// endIsolation is called when a claim (not ahead) found no suspect: after a claim of one
// event, the next claim is a whole one; after a whole one, the isolation episode ends.
func (sub *subscription) endIsolation() {
	if sub.claimedOne {
		sub.oneNext = false
		return
	}
	if sub.isolating {
		sub.isolating = false
		sub.s.logger.Info("outbox: suspect events isolated; whole batches resume", nil)
	}
}

// setAside releases items of b before any is emitted, taking back the start their claim
// counted. When the statement fails they stay abandoned, and the batch's mark releases them.
func (sub *subscription) setAside(b *leased, items []*item) {
	if len(items) == 0 {
		return
	}
	seqs := make([]int64, len(items))
	for i, it := range items {
		it.state = stateAbandoned
		seqs[i] = it.ev.Sequence
	}
	// The renewal no longer expects them leased (a set-aside event lost to another relay is
	// not this batch's loss: it is not delivered here).
	b.fl.mu.Lock()
	b.fl.setAside += len(items)
	b.fl.mu.Unlock()
	if _, err := sub.writeMarks(b.token, markSets{abandoned: seqs, eager: items[0].eager}); err != nil {
		sub.s.logger.Error("outbox: setting events aside failed; the batch's mark releases them", err, watermill.LogFields{"token": b.token, "events": len(items)})
		return
	}
	for _, it := range items {
		it.state = stateSetAside
	}
}
