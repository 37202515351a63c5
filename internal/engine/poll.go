package engine

import (
	"context"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill"
)

// poll claims one batch (or takes the one claimed beside the previous batch), delivers it
// while it claims the next (at most one batch ahead, see prefetch), and starts writing its
// marks. It reports whether to poll again at once: events were claimed, or keys remain
// unexamined.
func (sub *subscription) poll() (again bool, err error) {
	s := sub.s
	b := sub.next
	sub.next = nil
	if b == nil {
		token := s.tokenPrefix + strconv.FormatInt(s.claims.Add(1), 10)
		if o := sub.dueProbe(time.Now()); o != nil {
			return sub.probe(token, o)
		}
		if sub.serialFor > 0 {
			sub.serialFor--
			sub.waitMarks()
		}
		inflight := false // the previous batch's marks are being written beside this claim
		if sub.marking != nil {
			select {
			case <-sub.marking.done:
			default:
				inflight = true
			}
		}
		splitting := sub.splitFor > 0 // before claim counts this claim off
		var more bool
		b, more, err = sub.claimLeased(token)
		if err == nil && b == nil && inflight {
			// The claim ran beside the previous batch's marks and leased nothing: poll again as
			// soon as they land, since the batch's keys may have more events waiting for them.
			// When the walk found such claimable keyed events and the batch held a few keys,
			// the next claims take the runs of half of those keys each (one half is claimed
			// while the other half's marks are written); with one key, or when that split was
			// already on (another relay holds the other half), they wait for the marks first
			// instead of claiming nothing beside them.
			sub.waitMarks()
			if sub.walked > 0 {
				switch n := sub.lastKeyCount; {
				case splitting:
					sub.splitFor, sub.serialFor = splitClaims, splitClaims
				case n > 1 && n <= maxHotKeys:
					sub.splitLimit, sub.splitFor = min(s.cfg.BatchSize, (n+1)/2*s.cfg.MaxRunPerKey), splitClaims
				case n == 1:
					sub.serialFor = splitClaims
				}
			}
			return true, nil
		}
		if err == nil && b == nil && sub.walked > 0 {
			sub.heldPolls++
		} else {
			sub.heldPolls = 0
		}
		if err != nil || b == nil {
			if err == nil {
				sub.endIsolation()
			}
			return more, err
		}
	}
	deliver := sub.deliverable(b)
	sub.view = sub.destView(time.Now())
	delivered := make(chan struct{})
	go func() {
		defer close(delivered)
		sub.deliver(b, deliver)
	}()
	if sub.mayPrefetch(b) {
		sub.next, err = sub.prefetch()
	}
	<-delivered
	sub.noteOutcomes(b.items, nil)
	sub.waitMarks()
	sub.confirm(b)
	sub.continueRuns(b.token, deliver)
	m := &marks{done: make(chan struct{})}
	sub.marking, sub.contMarks = m, m
	go func() {
		defer close(m.done)
		var err error
		m.unconfirmed, err = sub.mark(b.token, b.items)
		if err != nil {
			s.logger.Error("outbox: writing marks failed; the events are delivered again after their lease", err, watermill.LogFields{"token": b.token})
		}
	}()
	if err != nil && sub.ctx.Err() == nil {
		// The claim beside the batch failed: the poll loop backs off as after any failed claim.
		return true, err
	}
	return true, nil
}

// claimLeased claims a batch under token (see claim) and starts renewing its lease; nil when
// it leased nothing. It uses the continuations set by the last delivered batch.
func (sub *subscription) claimLeased(token string) (b *leased, more bool, err error) {
	var prev *marks
	if len(sub.contKeys) > 0 {
		prev = sub.contMarks
	}
	walkLimit := sub.oldest
	items, more, err := sub.claim(token)
	sub.contKeys, sub.contAfter, sub.contFrom = sub.contKeys[:0], sub.contAfter[:0], sub.contFrom[:0]
	if err != nil || len(items) == 0 {
		sub.contStreak = nil // the streaks ended: the next batch starts them over
		return nil, more, err
	}
	b = sub.lease(token, items, prev)
	b.full = more || len(items) >= sub.s.cfg.BatchSize
	keys := map[string]bool{}
	for _, it := range items {
		keys[it.ev.OrderingKey] = true
	}
	// The walk ended before its limit (it saw every claimable keyed event) and found no key
	// the batch does not hold.
	b.held = !keys[""] && sub.walked > 0 && sub.walked <= int64(len(keys)) && sub.walked < int64(walkLimit)
	return b, more, nil
}

// mayPrefetch reports whether to claim the next batch while b is out: b was full (a batch
// that was not full found the backlog drained; the poll after it claims what came meanwhile) and
// does not hold every key its claim's walk found (leased.held), the last batch left no key out
// of its continuations (that key is held by the marks being written; the claim after b takes
// it), no outage probe is due (it is claimed on its own, after b), no claim is to wait for
// marks (serialFor), and no claim beside a batch came back empty lately (noPrefetch).
func (sub *subscription) mayPrefetch(b *leased) bool {
	if !sub.s.caps.ClaimAhead {
		return false
	}
	if sub.noPrefetch > 0 {
		sub.noPrefetch--
		return false
	}
	return b.full && !b.held && !b.isolated && !sub.contLeftOut && sub.serialFor == 0 && sub.ctx.Err() == nil && sub.dueProbe(time.Now()) == nil
}

// prefetch claims the next batch while the current one is out, beside the previous batch's
// marks. Per-key order needs nothing more: every claim leaves out the keys whose head is
// leased, so the keys of the batch out (and of the batch being marked) are not claimed again
// before their marks land — but for continuations, which follow a run acked whole (see
// contKeys; they continue the batch before the one out). A claim that leased nothing while
// claimable keyed events waited (their keys are the batch's out, e.g. a few hot keys) turns
// prefetching off for splitClaims batches: those keys are continued after the batch instead.
func (sub *subscription) prefetch() (*leased, error) {
	token := sub.s.tokenPrefix + strconv.FormatInt(sub.s.claims.Add(1), 10)
	marking := sub.marking
	if marking != nil {
		select {
		case <-marking.done:
			marking = nil
		default:
		}
	}
	b, _, err := sub.claimLeased(token)
	if err == nil && b == nil && marking != nil {
		// It ran beside the previous batch's marks and leased nothing (on MariaDB a claim
		// beside a mark may lock none of the rows it found, though the mark holds others):
		// claim again once they landed.
		<-marking.done
		token = sub.s.tokenPrefix + strconv.FormatInt(sub.s.claims.Add(1), 10)
		b, _, err = sub.claimLeased(token)
	}
	if err != nil {
		return nil, err
	}
	if b == nil {
		if sub.walked > 0 {
			sub.noPrefetch = splitClaims
		}
		return nil, nil
	}
	b.prefetched = true
	return b, nil
}

// releaseNext gives back the lease of a batch claimed ahead but not delivered (the
// subscription stops): its events are released with no attempt and no delivery start counted.
func (sub *subscription) releaseNext() {
	b := sub.next
	if b == nil {
		return
	}
	sub.next = nil
	b.stopRenew()
	b.lost()
	for _, it := range b.items {
		it.state = stateReleased
	}
	sub.waitMarks()
	if _, err := sub.mark(b.token, b.items); err != nil {
		sub.s.logger.Error("outbox: releasing a batch claimed ahead failed; it is claimed again after its lease", err, watermill.LogFields{"token": b.token})
	}
}

// lease starts renewing a claimed batch's lease and returns it, ready for deliver.
func (sub *subscription) lease(token string, items []*item, prev *marks) *leased {
	b := &leased{token: token, items: items, prev: prev, fl: sub.newFlusher(token)}
	var stopEmit, stopMsgs context.CancelFunc
	b.bctx, stopEmit = context.WithCancel(sub.ctx)
	b.mctx, stopMsgs = context.WithCancel(sub.deliveries)
	b.lost = func() { stopEmit(); stopMsgs() }
	b.stopRenew = sub.renewWhileOut(token, items, b.lost, b.fl)
	return b
}

// deliver emits a claimed batch's deliverable events while flushing its acks every
// MarkInterval; it returns when every emitted event was answered, or was left unanswered by a
// stop (after CloseTimeout) or a lost lease (at once), and ends the batch's lease renewal.
func (sub *subscription) deliver(b *leased, deliver []*item) {
	defer func() { b.stopRenew(); b.lost() }()
	if len(deliver) == 0 {
		return
	}
	b.fl.start(deliver, b.prev)
	sub.emit(b.bctx, b.mctx, deliver)
	b.fl.stop()
}

// probe delivers one event of an outage's topics (see outage.go) and writes its mark before
// returning. A probe that finds nothing to claim leaves the outage open (the topics' events
// may be held or leased elsewhere) and waits for the next probe, unless the outage is idle
// (see outage.go: idle), which closes it.
func (sub *subscription) probe(token string, o *outage) (again bool, err error) {
	sub.waitMarks()
	items, err := sub.probeClaim(token, o)
	if err != nil {
		o.nextProbe = time.Now().Add(sub.probeWait(o, time.Now()))
		return false, err
	}
	b := sub.lease(token, items, nil)
	sub.view = sub.destView(time.Now()) // the probe is due: one event of its destination goes out
	sub.deliver(b, sub.deliverable(b))
	sub.noteOutcomes(items, o)
	if _, err := sub.mark(token, items); err != nil {
		sub.s.logger.Error("outbox: writing marks failed; the events are delivered again after their lease", err, watermill.LogFields{"token": token})
	}
	// Poll at once when the outage ended; otherwise the ordinary claim of the other topics.
	return true, nil
}
