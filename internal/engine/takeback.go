package engine

import (
	"context"
	"time"

	"github.com/ThreeDotsLabs/watermill"
)

// takeBack releases the unexpired leases of an earlier Subscriber of the same RelayName (a
// relay process that was killed and restarted under its name), so that its events are claimed
// again at once instead of after LeaseDuration. Leases of this Subscriber are kept. Its
// fencing tokens are "RelayName#<12 hex digits>#<claim number>" (NewSubscriber); only
// leased_by values of exactly that shape match, so a relay whose name merely starts with
// this one's keeps its leases.
//
// It scans the pending events once (the pending index), at the start of each subscription.
// If the earlier Subscriber is in fact still running (two live relays share a name), its
// marks for those events are refused by the fence and the events are delivered again: no
// event is lost or recorded out of order, but the destination may see duplicates.
func (sub *subscription) takeBack() {
	s := sub.s
	if !s.cfg.TakeBack {
		return
	}
	name := s.cfg.RelayName + "#"
	ctx, cancel := context.WithTimeout(sub.ctx, 30*time.Second)
	defer cancel()
	n, err := s.d.TakeBack(ctx, s.db, s.t, name, s.tokenPrefix)
	switch {
	case err != nil:
		if sub.ctx.Err() == nil {
			s.logger.Error("outbox: taking back the leases of an earlier relay of this name failed; they are claimed when they expire", err, nil)
		}
	case n > 0:
		s.logger.Info("outbox: took back the unexpired leases of an earlier relay of this name", watermill.LogFields{"events": n})
	}
}
