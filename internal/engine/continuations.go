package engine

// confirm releases, instead of marking published, b's acked continuation events (see
// leased.prev) whose keys' previous events the marks they follow did not write as published:
// publishing them would put them before those events, which go out again after their lease
// (at least once, in order).
func (sub *subscription) confirm(b *leased) {
	if b.prev == nil {
		return
	}
	<-b.prev.done
	if len(b.prev.unconfirmed) == 0 {
		return
	}
	for _, it := range b.items {
		if it.cont && it.state == stateAcked && b.prev.unconfirmed[it.ev.OrderingKey] {
			it.state = stateReleased
		}
	}
}

// continueRuns sets the next claim's continuations from a delivered batch: every ordering
// key whose run held MaxRunPerKey events, or was followed (item.follow), all acked
// (Capabilities.Continuations: PostgreSQL and MariaDB/MySQL; SQLite's single writer needs none).
// A key continued contRounds batches in a row is left out once (one key per batch, never a
// batch's only key, never a followed key): its next run goes to whichever relay claims it first
// after this batch's marks, so that several relays end up sharing a few hot keys instead of
// the first one keeping them all.
func (sub *subscription) continueRuns(token string, deliver []*item) {
	// Continuations no claim used (the batch delivered now was claimed ahead, and no claim
	// ran after the batch they continue): a followed key's are lost with them.
	for i, k := range sub.contKeys {
		if sub.contFollow[k] {
			sub.refindFrom(sub.contAfter[i] + 1)
		}
	}
	sub.contKeys, sub.contAfter, sub.contFrom, sub.contToken = sub.contKeys[:0], sub.contAfter[:0], sub.contFrom[:0], token
	sub.contFollow, sub.contLeftOut = nil, false
	if !sub.s.caps.Continuations || sub.ctx.Err() != nil {
		return
	}
	type run struct {
		n                 int
		first, last, miss int64 // miss: the first event not acked (0: the run was acked whole)
		follow            bool
	}
	runs := map[string]*run{}
	var order []string
	for _, it := range deliver { // in sequence order
		k := it.ev.OrderingKey
		if k == "" {
			continue
		}
		r := runs[k]
		if r == nil {
			r = &run{first: it.ev.Sequence}
			runs[k] = r
			order = append(order, k)
		}
		r.n++
		r.last = it.ev.Sequence
		if it.state != stateAcked && r.miss == 0 {
			r.miss = it.ev.Sequence
		}
		r.follow = r.follow || it.follow
	}
	rounds := make(map[string]int, len(order))
	dropped := false
	for _, k := range order {
		r := runs[k]
		if r.miss > 0 && r.follow {
			// Not continued: the event not acked and the key's events after it lie below the
			// floor. One that failed is found by the retry scan when due, and the rest wait for
			// it; one released without an attempt (an outage, a stop) has no next_attempt_at.
			sub.refindFrom(r.miss)
		}
		if r.miss == 0 && (r.n >= sub.s.cfg.MaxRunPerKey || r.follow) {
			n := sub.contStreak[k] + 1
			if n > contRounds && !dropped && len(order) > 1 && !r.follow {
				dropped, sub.contLeftOut = true, true
				continue
			}
			rounds[k] = n
			sub.contKeys = append(sub.contKeys, k)
			sub.contAfter = append(sub.contAfter, r.last)
			sub.contFrom = append(sub.contFrom, r.first)
			if r.follow {
				if sub.contFollow == nil {
					sub.contFollow = map[string]bool{}
				}
				sub.contFollow[k] = true
			}
		}
	}
	sub.contStreak = rounds
}

// refindFrom has the next claim lower the keyed floor to seq (see refind) when the
// subscription has floors. A followed key (item.follow) lies below the keyed floor, where only
// its continuation finds its events once its run is delivered (the floor moved past them while
// they waited for a retrying or dead-lettered event); when that continuation is lost (a run not
// acked whole, continuations no claim used, a claim that did not lease them), the floor goes
// back to the key's next event instead of leaving it to the sweep (Config.SweepInterval). The claim
// after that walks from there once (the entries of events published since), and the floor then
// stays at the key's first pending event until it is published.
func (sub *subscription) refindFrom(seq int64) {
	if sub.sweep != nil && seq > 0 && (sub.refind == 0 || seq < sub.refind) {
		sub.refind = seq
	}
}

// contRounds is how many batches in a row a key may be continued before it is left out once
// (see continueRuns), so that several relays end up sharing a few hot keys.
const contRounds = 4
