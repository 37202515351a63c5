package engine

import (
	"context"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/watermill-outbox/outbox/internal/dialect"
)

// subscription is one Subscribe call: its poll goroutine (run) drives the stages one batch
// at a time. The state of each stage is an embedded struct whose comment names the goroutines
// that write it; fields set before the goroutines start (s … stopDeliveries) are read-only
// afterwards.
type subscription struct {
	s     *Relay
	sel   Selection
	relay dialect.Relay // the dialect's claim, renew and mark statements
	// emit delivers a claimed batch: it emits messages while ctx lasts; the messages'
	// contexts derive from mctx, which outlives ctx by CloseTimeout at a stop (see deliver).
	emit   func(ctx, mctx context.Context, b []*item) bool
	ctx    context.Context
	cancel context.CancelFunc
	// deliveries is the parent of the message contexts: it ends CloseTimeout after ctx ends
	// (or as soon as the subscription's goroutine returns), not with ctx, so that a stop
	// lets the messages out finish (see SubscriberConfig.CloseTimeout). It keeps ctx's values.
	deliveries     context.Context
	stopDeliveries context.CancelFunc

	pacer     // when to poll
	claimer   // how the next claim is shaped
	continuer // which runs the next claim continues
	settler   // the destinations found unavailable
	pipeline  // the batches between claim and marks

	// lostReported holds the tokens of batches whose lease loss the renewal reported
	// (Hooks.OnLeaseLost, log): their flushes and mark do not report the same events again.
	// Written by renewal goroutines; the batch's mark, its last statement, removes its token.
	lostReported sync.Map
}

// pacer is the pace stage's state (pace.go): written by the poll goroutine, but for retryDues,
// which the goroutines that write marks add to (noteRetry) under retryMu.
type pacer struct {
	// heldPolls counts the polls in a row whose claim leased nothing although its walk found
	// claimable keyed events: their keys are held by another relay (or by a batch of this
	// one). The wait after such a poll doubles with each, up to heldWait (see pollWait).
	heldPolls int
	// Eager locking (SQLite, see ClaimParams.Eager and eagerClaim): woken is set when the
	// subscription's last wait ended with a wakeup signal (events were just committed) and
	// cleared when one ended with the poll interval; fullRun counts the claims in a row that
	// leased a whole batch.
	woken   bool
	fullRun int
	// retryDues are the times (relay clock, UnixNano, ascending, at most maxRetryDues) at
	// which events this relay failed are due again, so the relay polls then instead of after
	// PollInterval; the poll loop drops those that passed.
	retryMu   sync.Mutex
	retryDues []int64
}

// claimer is the claim stage's state (claim.go): the adaptive policies that shape the next
// claim. Written by the poll goroutine only; the sweeper's own goroutine reads sweep's atomics
// and keyLows has its own lock (marks note written acks).
type claimer struct {
	// cursor is where the next claim's key skip scan resumes.
	cursor string
	// oldest is how many of the oldest claimable keyed events the next claim walks and locks
	// (SKIP LOCKED) to find its keys (PostgreSQL): about twice the keys the last full batch
	// needed, so a concurrent relay's walk skips only those keys and finds others; doubled (up
	// to BatchSize) after each batch that was not full; back to about twice the last batch's
	// keys after a claim that found claimable keyed events but leased nothing.
	oldest int
	// During splitFor claims, a claim leases at most splitLimit keyed events of any keys:
	// the runs of half the last batch's keys (at most maxHotKeys keys), set when a claim
	// beside that batch's marks found claimable keyed events but leased nothing, so one half
	// of a few hot keys is claimed while the other half's marks are written (PostgreSQL).
	// Capped claims that fill up with long runs (on average at least MaxRunPerKey/2) renew
	// it; many short runs let it end.
	splitLimit int
	splitFor   int
	// serialFor counts the next polls that wait for the previous batch's marks before
	// claiming: set when one hot key's events were all the claimable work there was, or when
	// a claim beside the marks found nothing even though the split was on (another relay
	// holds the other half).
	serialFor int
	// lastKeyCount is the number of distinct ordering keys of the last batch that leased
	// events; walked the number of keys the last claim's oldest-keyed walk found (claimable
	// keyed events exist), -1 when the claim does not report it (SQLite).
	lastKeyCount int
	walked       int64
	// lastClaimed is how many events the last claim leased (its size hint for the next).
	lastClaimed int
	// lowUnordered and lowKeyed are where the claim's unordered scan and oldest-keyed walk
	// start (sequence >= low; PostgreSQL): after a full batch, its lowest unordered and
	// keyed sequence, so that a claim in a long backlog does not step over the index entries
	// of every event the relay already processed (until VACUUM removes them). Events below
	// them that become claimable again
	// (retries, released or expired leases) are found when the lows go back to 0: after a
	// batch that was not full, and after lowClaims full batches in a row (lowAge).
	lowUnordered, lowKeyed int64
	lowAge                 int
	// With Capabilities.Floors (PostgreSQL) the scans start at floors instead (see floors.go):
	// fl, the head checks' per-key lows, the sweeper below the floors, and contFollow: which
	// of contKeys are followed (see item.follow).
	fl         dialect.FloorTracker
	lows       *keyLows
	sweep      *sweeper
	contFollow map[string]bool
	// first are the keys taken back from an earlier relay of this name whose runs the next
	// claims lease before any other (see takeBack), until firstUntil.
	first      []dialect.TakenKey
	firstUntil time.Time
	// refind is a sequence the next claim lowers the keyed floor to (0: none; see refindFrom):
	// a followed key's events from there may lie below the floor with no continuation left to
	// lease them.
	refind int64
	// keyScanIn is how many more claims leave out the key skip scan, keyScanEvery how many the
	// last backoff was (PostgreSQL floors): a skip scan that found no claimable head of a key the
	// relay does not know (the known keys' heads come from their lows) doubles the backoff up to
	// maxKeyScanBackoff; one that found some ends it.
	keyScanIn, keyScanEvery int
}

// continuer is the runs the next claim may continue (continuations.go). Written by the poll
// goroutine only.
type continuer struct {
	// contKeys, contFrom, contAfter and contToken are the next claim's continuations
	// (Capabilities.Continuations: PostgreSQL, MariaDB/MySQL): the keys whose run in the last
	// batch (claimed under contToken) held MaxRunPerKey events and was acked whole, with the
	// run's first and last sequence. The next claim may lease such a key's following events
	// while that batch's marks are still being written, because the events before them are
	// this relay's own, already delivered (see the cont fragment of the PostgreSQL claim).
	contKeys   []string
	contAfter  []int64
	contFrom   []int64
	contStreak map[string]int // continued batches in a row, per key in contKeys
	contToken  string
	// contMarks is the marks of the batch contKeys continue (see leased.prev).
	contMarks *marks
	// contLeftOut: the last delivered batch left a key out of its continuations (see
	// continueRuns).
	contLeftOut bool
}

// settler is the outages stage's state (outage.go). Written by the poll goroutine only; the
// Relay's copy for Outages is published under its lock.
type settler struct {
	// outages are the destinations found unavailable, by UnavailableError.Destination or the
	// name Config.Destination gives (see outage.go); their topics are left out of claims but
	// for one probe event at a time, or their events are held (see destinations.go).
	outages map[string]*outage
	// view is the outages a batch's delivery holds events of (see destView): set before the
	// delivery starts, read by it.
	view destView
}

// pipeline is the batches between their claim and their marks (poll.go). Written by the poll
// goroutine only; a marks value is written by its mark goroutine before done is closed.
type pipeline struct {
	// marking is the previous batch's marks; nil before the first. Marks run while the next
	// batch is delivered and the one after it claimed: that batch's events stay leased (so no
	// claim takes them, nor a later event of their keys) until the marks land.
	marking *marks
	// next is the batch claimed while the current one was out (see poll), delivered next;
	// nil when none is. noPrefetch counts the next batches delivered without a claim beside
	// them (a claim beside the last one leased nothing while claimable keyed events waited:
	// their keys were held by the batch out, e.g. a few hot keys).
	next       *leased
	noPrefetch int
	// isolating: suspects are delivered alone (see isolate), from the claim that found the
	// first to a whole claim that finds none; logged once at each end. oneNext: the next claim
	// takes one keyed event (the last one found a suspect); claimedOne: the last claim did.
	isolating, oneNext, claimedOne bool
}

// marks is one batch's mark statement, written beside the delivery of the batches after it.
type marks struct {
	done chan struct{} // closed when the statement is over
	// unconfirmed holds the ordering keys of the batch whose acks the statement did not write
	// (it failed, or the lease had passed to another relay): the continuation events of those
	// keys (see leased.prev) are released instead of marked published, so they go out again
	// after the events before them. Written before done is closed.
	unconfirmed map[string]bool
}

// leased is a claimed batch from its claim to the end of its delivery. Its lease is renewed
// from the claim on (three times per LeaseDuration), so a batch claimed while the previous one
// is out keeps its lease while it waits.
type leased struct {
	token string
	items []*item
	// prev is the marks of the batch whose runs this claim continued (subscription.contKeys),
	// nil when it continued none: its continuation acks are written only once those marks
	// wrote the previous run's acks (see confirm, flusher).
	prev *marks
	// full: the claim leased a whole batch or stopped at its key scan bound, so more work is
	// likely waiting and the next batch is claimed while this one is out. held: every key
	// the claim's walk found is in the batch (a few hot keys), which holds no unordered
	// event, so a claim beside it would find nothing; their runs are continued after it.
	full, held bool
	// prefetched: claimed while the previous batch was out (its topics may have been paused
	// since). isolated: it held a suspect (see isolate); no batch is claimed beside it.
	prefetched, isolated bool
	// bctx ends emitting (a stop, a lost lease); mctx ends the messages out (CloseTimeout
	// after a stop, a lost lease at once); lost ends both.
	bctx, mctx context.Context
	lost       func()
	fl         *flusher
	stopRenew  func()
}

// newSubscription returns a subscription of sel, not started.
func (s *Relay) newSubscription(ctx context.Context, sel Selection) *subscription {
	sub := &subscription{s: s, sel: sel, claimer: claimer{oldest: s.cfg.BatchSize, walked: -1}}
	if s.caps.Floors {
		every := s.cfg.SweepInterval
		if every <= 0 {
			every = defaultSweepInterval
		}
		sub.lows, sub.sweep = &keyLows{}, &sweeper{every: every}
	}
	sub.relay = s.d.NewRelay(s.t, dialect.RelayConfig{BatchSize: s.cfg.BatchSize, MaxRunPerKey: s.cfg.MaxRunPerKey, KeyScan: s.cfg.KeyScan,
		LeaseDuration: s.cfg.LeaseDuration, MaxAttempts: s.cfg.MaxAttempts, RetryBase: s.cfg.RetryBase, RetryMax: s.cfg.RetryMax}, sel.Dialect)
	sub.ctx, sub.cancel = context.WithCancel(ctx)
	sub.deliveries, sub.stopDeliveries = context.WithCancel(context.WithoutCancel(ctx))
	return sub
}

// start runs the subscription's goroutines; it returns ErrClosed after Close.
func (sub *subscription) start(done func()) error {
	s := sub.s
	s.closeMu.RLock()
	defer s.closeMu.RUnlock()
	if s.closed {
		sub.cancel()
		sub.stopDeliveries()
		return ErrClosed
	}
	s.wg.Add(2)
	go func() {
		defer s.wg.Done()
		select {
		case <-s.closing:
		case <-sub.ctx.Done():
		}
		sub.cancel()
		// The stop: the messages out get CloseTimeout to be answered (see deliver).
		t := time.NewTimer(s.cfg.CloseTimeout)
		defer t.Stop()
		select {
		case <-t.C:
			s.logger.Info("outbox: close timeout; the messages still out are released", watermill.LogFields{"close_timeout": s.cfg.CloseTimeout.String()})
		case <-sub.deliveries.Done():
		}
		sub.stopDeliveries()
	}()
	go func() {
		defer s.wg.Done()
		defer done()
		defer sub.stopDeliveries()
		defer sub.cancel()
		sub.run()
	}()
	return nil
}

// waitMarks waits until the previous batch's marks are written.
func (sub *subscription) waitMarks() {
	if sub.marking != nil {
		<-sub.marking.done
	}
}
