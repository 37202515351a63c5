package engine

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/watermill-outbox/outbox/internal/dialect"
)

// claim leases the next batch, leaving the topics of outages out. more reports that the key
// skip scan stopped at its KeyScan bound, so keys after the cursor are still unexamined and the
// next poll should not wait.
func (sub *subscription) claim(token string) (items []*item, more bool, err error) {
	s := sub.s
	began := time.Now()
	sub.walked = -1
	p := &dialect.ClaimParams{Token: token, Limit: s.cfg.BatchSize, SizeHint: min(s.cfg.BatchSize, max(16, sub.lastClaimed)), Oldest: sub.oldest, Cursor: sub.cursor,
		LowUnordered: sub.lowUnordered, LowKeyed: sub.lowKeyed, ContToken: sub.contToken, Paused: sub.pausedTopics(began)}
	if sub.sweep != nil {
		sub.fl.Lower(sub.sweep.take())
		sub.fl.Lower(sub.refind, 0)
		sub.refind = 0
		p.LowKeyed, p.LowUnordered, p.KeyLows = sub.fl.Keyed, sub.fl.Unordered, sub.lows.params()
		if p.NoKeyScan = sub.keyScanIn > 0; p.NoKeyScan {
			sub.keyScanIn--
		}
	}
	if sub.splitFor > 0 {
		p.Limit = sub.splitLimit
	}
	if sub.claimedOne = sub.oneNext; sub.claimedOne {
		// Suspects go out one at a time (isolate): a claim of one keyed event leases no run
		// to set aside.
		p.Limit = 1
	}
	for i, k := range sub.contKeys {
		p.Cont = append(p.Cont, dialect.Continuation{Key: k, From: sub.contFrom[i], After: sub.contAfter[i]})
	}
	follow := sub.contFollow
	p.First = sub.firstKeys(s.cfg.BatchSize)
	p.Eager = sub.eagerClaim()
	// A claim after one that leased less than a whole batch reads first (SQLite): it may well
	// find nothing, and then it never takes the write lock: idle relays polling through the
	// busy handler would otherwise queue with the writers for the lock at every poll
	// (docs/design/relay.md, "Why the policies").
	p.ReadFirst = sub.fullRun == 0 && !sub.s.cfg.SQLiteNoReadFirst
	cctx, cancel := sub.claimContext()
	res, err := sub.relay.Claim(cctx, s.db, p)
	cancel()
	if err != nil {
		sub.lostFollowed(p.Cont, follow, nil)
		return nil, false, fmt.Errorf("outbox: claim from %s: %w", s.table, err)
	}
	if len(res.Events) >= p.Limit {
		sub.fullRun++
	} else {
		sub.fullRun = 0
	}
	sub.walked = res.Walked
	sub.lastClaimed = len(res.Events)
	items = sub.itemsOf(res.Events)
	if len(p.First) > 0 {
		sub.claimedFirst(p.First, items)
	}
	for _, it := range items {
		it.eager = p.Eager
	}
	cursor, scanned := res.Cursor, res.Scanned
	sort.Slice(items, func(i, j int) bool { return items[i].ev.Sequence < items[j].ev.Sequence })
	if len(sub.contKeys) > 0 {
		// The claim reads continuation keys' runs only after their previous events, never
		// through the walk or the key scan.
		cont := make(map[string]bool, len(sub.contKeys))
		for _, k := range sub.contKeys {
			cont[k] = true
		}
		for _, it := range items {
			it.cont = cont[it.ev.OrderingKey]
		}
		sub.lostFollowed(p.Cont, follow, items)
	}
	keys, keyed := map[string]struct{}{}, 0
	for _, it := range items {
		if it.ev.OrderingKey != "" {
			keys[it.ev.OrderingKey] = struct{}{}
			keyed++
		}
	}
	switch {
	case len(items) >= s.cfg.BatchSize || (len(items) > 0 && sub.splitFor > 0):
		sub.oldest = min(s.cfg.BatchSize, max(2*len(keys), 16))
	case len(items) == 0 && sub.walked > 0:
		// Claimable keyed events whose keys are held (by this relay's marks or another
		// relay): keep the walk short, for a shorter claim and fewer locks in the way of
		// the relay that holds them.
		sub.oldest = min(s.cfg.BatchSize, max(2*sub.lastKeyCount, 16))
	case len(items) > 0:
		// Grow the walk step by step, not at once: its row locks are what a concurrent
		// relay's runs skip, so a walk of BatchSize rows after one short batch (short
		// because of that relay) shortened that relay's batches in turn.
		sub.oldest = min(s.cfg.BatchSize, 2*sub.oldest)
	}
	if len(items) > 0 {
		sub.lastKeyCount = len(keys)
	}
	if res.Floors != nil && sub.sweep != nil {
		if !p.NoKeyScan && res.Scanned != nil && *res.Scanned > 0 {
			if res.Floors.ScanHeads > 0 {
				sub.keyScanEvery = 0
			} else {
				sub.keyScanEvery = min(max(2*sub.keyScanEvery, 1), maxKeyScanBackoff)
			}
			sub.keyScanIn = sub.keyScanEvery
		}
		now := time.Now()
		sub.fl.Update(res.Floors, now)
		if ll, ok := sub.relay.(dialect.LockLooker); ok && sub.fl.LookAtLocks(now) {
			// xmin waits for a transaction that may not be the outbox's (see FloorTracker).
			if holders, err := ll.LockHolders(sub.ctx, s.db); err == nil {
				sub.fl.CheckLocks(holders, now)
			} else {
				s.logger.Debug("outbox: reading the table's lock holders failed", watermill.LogFields{"error": err.Error()})
			}
		}
		s.logger.Trace("outbox: claim floors", watermill.LogFields{"keyed": sub.fl.Keyed, "unordered": sub.fl.Unordered, "xmin": res.Floors.Xmin})
		sub.sweep.keyed.Store(sub.fl.Keyed)
		sub.sweep.unordered.Store(sub.fl.Unordered)
		for _, it := range items {
			k := it.ev.OrderingKey
			it.follow = k != "" && (it.ev.Sequence < p.LowKeyed || (it.cont && follow[k]))
		}
	} else {
		sub.advanceLows(items)
	}
	if sub.splitFor > 0 {
		sub.splitFor--
		// Still a few hot keys filling the capped claim with long runs (at least half of
		// MaxRunPerKey on average): keep splitting. Many short runs end the split.
		if keyed >= sub.splitLimit && 2*keyed >= len(keys)*s.cfg.MaxRunPerKey {
			sub.splitFor = splitClaims
		}
	}
	rankRuns(items)
	if sub.lows != nil {
		sub.lows.note(items)
	}
	// Resume the key skip scan after the last key it reached; start over once it reached the
	// end of the keys.
	switch {
	case p.NoKeyScan: // the cursor waits for the next skip scan
	case scanned != nil && *scanned >= int64(s.cfg.KeyScan) && cursor != nil:
		sub.cursor, more = *cursor, true
	default:
		sub.cursor = ""
	}
	fields := watermill.LogFields{"events": len(items), "token": token, "duration": time.Since(began), "walked": res.Walked, "key_scan": !p.NoKeyScan}
	if res.Scanned != nil {
		fields["keys_scanned"] = *res.Scanned
	}
	s.logger.Trace("outbox: claimed", fields)
	if h := s.hooks.OnClaim; h != nil {
		h(ClaimInfo{Events: len(items), Duration: time.Since(began)})
	}
	return items, more, nil
}

// lostFollowed notes the followed continuations of conts (follow: contFollow when the claim
// began) that the claim's items (in sequence order) do not continue: the key had no event
// left, or its next run could not be leased yet (the marks before it had not landed and its
// lease was short, or another relay holds it). See refindFrom.
func (sub *subscription) lostFollowed(conts []dialect.Continuation, follow map[string]bool, items []*item) {
	for _, c := range conts {
		if follow[c.Key] && !slices.ContainsFunc(items, func(it *item) bool { return it.cont && it.ev.OrderingKey == c.Key }) {
			sub.refindFrom(c.After + 1)
		}
	}
}

// probeClaim leases one event of o's topics (the oldest claimable, in key order like any
// claim), or none.
func (sub *subscription) probeClaim(token string, o *outage) ([]*item, error) {
	began := time.Now()
	topics := make([]string, 0, len(o.topics))
	for t := range o.topics {
		topics = append(topics, t)
	}
	// The oldest 16 keyed events are walked for the one event leased; with named destinations
	// (Config.Destination) up to 16 are leased, so that the probe also finds events of the
	// topics bound elsewhere (the outage's own are held but for one, see destinations.go).
	limit := 1
	if sub.s.cfg.Destination != nil {
		limit = min(sub.s.cfg.BatchSize, 16)
	}
	cctx, cancel := sub.claimContext()
	res, err := sub.relay.Claim(cctx, sub.s.db, &dialect.ClaimParams{Token: token, Limit: limit, Oldest: 16, Probe: topics})
	cancel()
	if err != nil {
		return nil, fmt.Errorf("outbox: probe claim from %s: %w", sub.s.table, err)
	}
	items := sub.itemsOf(res.Events)
	if h := sub.s.hooks.OnClaim; h != nil {
		h(ClaimInfo{Events: len(items), Duration: time.Since(began), Probe: true})
	}
	rankRuns(items)
	return items, nil
}

// eagerClaim reports whether the next claim, and its batch's marks, take SQLite's write lock
// eagerly (ClaimParams.Eager): while the subscription's waits end with wakeup signals (writers
// are committing; set by the poll loop, cleared by a wait that ran out), within
// maxEagerFullRun whole batches in a row. A subscription without a Wakeup never is. The marks
// follow their batch's claim (item.eager), not the claims made beside them.
func (sub *subscription) eagerClaim() bool {
	switch sub.s.cfg.SQLiteEager {
	case dialect.EagerFirstAfterWake:
		w := sub.woken
		sub.woken = false
		return w
	case dialect.EagerNever:
		return false
	}
	return sub.woken && sub.fullRun < maxEagerFullRun
}

// maxEagerFullRun bounds eager locking while a relay drains a backlog: after this many claims
// in a row that leased a whole batch, claims (and their marks) wait through SQLite's busy
// handler like the writers until a claim leases less than a batch, so that a draining relay
// does not take the lock at every turn from writers sleeping in the busy handler.
const maxEagerFullRun = 4

// advanceLows sets the next claim's scan starts after a claim that leased items.
func (sub *subscription) advanceLows(items []*item) {
	if len(items) < sub.s.cfg.BatchSize || sub.lowAge >= lowClaims {
		sub.lowUnordered, sub.lowKeyed, sub.lowAge = 0, 0, 0
		return
	}
	sub.lowAge++
	var u, k int64
	for _, it := range items { // in sequence order
		switch {
		case it.ev.OrderingKey == "" && u == 0:
			u = it.ev.Sequence
		case it.ev.OrderingKey != "" && k == 0:
			k = it.ev.Sequence
		}
	}
	if u > 0 {
		sub.lowUnordered = u
	}
	if k > 0 {
		sub.lowKeyed = k
	}
}

// lowClaims is how many full batches in a row may start their scans at the lows (see
// subscription.lowUnordered) before a claim scans from the start again.
const lowClaims = 16

// maxKeyScanBackoff is the most claims in a row that leave out the key skip scan after it found
// no head of a key the relay does not know (see subscription.keyScanIn).
const maxKeyScanBackoff = 16

// splitClaims is how many claims cap keyed events at the runs of half the last batch's keys
// (renewed while capped claims fill up with long runs) or wait for the marks first, once a
// claim beside the marks found their keys all still leased; then the relay tries whole
// batches again. maxHotKeys is the most keys a batch may hold for that: with more keys, other
// keys are claimable beside the marks.
const (
	splitClaims = 16
	maxHotKeys  = 64
)

// claimGrace is how long a claim statement may go on after its subscription stops.
const claimGrace = 5 * time.Second

// claimContext returns the context of a claim statement: not ended by the subscription's stop
// itself but claimGrace after it. A claim canceled mid-statement may still commit its leases
// on the server (PostgreSQL runs the statement to its end, and pgx gives up on the answer), and
// the relay would never see, deliver or release those events: they would wait for their lease to
// expire. A claim that returns after the stop leases a batch the stop then releases (deliver
// emits nothing of it; its mark gives the leases back).
func (sub *subscription) claimContext() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.WithoutCancel(sub.ctx))
	stop := context.AfterFunc(sub.ctx, func() {
		t := time.AfterFunc(claimGrace, cancel)
		context.AfterFunc(ctx, func() { t.Stop() })
	})
	return ctx, func() { stop(); cancel() }
}
