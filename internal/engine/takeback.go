package engine

import (
	"context"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/watermill-outbox/outbox/internal/dialect"
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
//
// Where the dialect names the keys it released (dialect.KeyTakeBacker), the next claims lease
// those keys' runs before any other (claimer.first, ClaimParams.First): the earlier relay's
// batches, its batch claimed ahead in particular, reach far ahead of the oldest pending
// events, and claimed in age order they would wait until every older event of other keys was
// claimed.
func (sub *subscription) takeBack() {
	s := sub.s
	if !s.cfg.TakeBack {
		return
	}
	name := s.cfg.RelayName + "#"
	ctx, cancel := context.WithTimeout(sub.ctx, 30*time.Second)
	defer cancel()
	var n int64
	var err error
	if kt, ok := s.d.(dialect.KeyTakeBacker); ok {
		var keys []dialect.TakenKey
		n, keys, err = kt.TakeBackKeys(ctx, s.db, s.t, name, s.tokenPrefix)
		sub.first, sub.firstUntil = keys, time.Now().Add(s.cfg.LeaseDuration)
	} else {
		n, err = s.d.TakeBack(ctx, s.db, s.t, name, s.tokenPrefix)
	}
	switch {
	case err != nil:
		if sub.ctx.Err() == nil {
			s.logger.Error("outbox: taking back the leases of an earlier relay of this name failed; they are claimed when they expire", err, nil)
		}
	case n > 0:
		s.logger.Info("outbox: took back the unexpired leases of an earlier relay of this name", watermill.LogFields{"events": n})
	}
}

// The taken-back keys are given to the claims for LeaseDuration after the take-back (see
// claimedFirst), not for a number of claims: a relay restarted on a loaded machine may make many
// small claims (split, isolating) before it reaches them, and a key that loses its place waits
// for every older key of the backlog (tens of seconds in a long one). A key whose run another
// relay claimed, or whose head backs off, is not seen as done and is looked up by each claim
// until then: one index probe per key.

// firstKeys returns the taken-back keys the next claim leases first (ClaimParams.First): up to
// limit of claimer.first.
func (sub *subscription) firstKeys(limit int) []dialect.TakenKey {
	return sub.first[:min(len(sub.first), limit)]
}

// claimedFirst drops from claimer.first the keys a claim given them (first, the first
// len(first) of claimer.first) is done with: those of which it leased the last event taken
// back. The others are kept: a run of theirs was cut (by the claim's limit or MaxRunPerKey, by
// this relay or by another that took the key's head first), and the next run waits for that
// one's marks; or their head is not claimable for now (backing off). LeaseDuration after the
// take-back none is kept.
func (sub *subscription) claimedFirst(first []dialect.TakenKey, items []*item) {
	last := make(map[string]int64, len(items))
	for _, it := range items {
		if k := it.ev.OrderingKey; k != "" {
			last[k] = max(last[k], it.ev.Sequence)
		}
	}
	var kept []dialect.TakenKey
	for _, f := range first {
		if last[f.Key] < f.Last {
			kept = append(kept, f)
		}
	}
	sub.first = append(kept, sub.first[len(first):]...)
	if len(sub.first) == 0 || time.Now().After(sub.firstUntil) {
		sub.first = nil
	}
}
