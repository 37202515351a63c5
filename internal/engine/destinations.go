package engine

import (
	"fmt"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Destinations (Config.Destination set): each emitted event is bound for a destination that the
// engine names before it emits the event (a webhook host, a route). Two things follow per
// destination, on the per-message path (Subscribe):
//
//   - An outage holds only the events bound for its destination: while it lasts they are not
//     emitted but held (released with no attempt and no delivery start counted, due again at
//     the outage's next probe), and their keys wait behind them; one event per probe wait goes
//     out as the probe. Events of the same topic bound elsewhere keep flowing. A topic is paused
//     (outage.go) only when a batch had no event of it that another destination answered.
//   - Flow control (Config.Limits): a destination over its rate holds its events until its
//     tokens allow them (spread over the time its rate needs), so it never delays another; one
//     at its MaxInFlight makes its lane wait for one of its deliveries of the same batch.

// Limit is one destination's flow control; the zero value is none.
type Limit struct {
	// Rate is the most events per second emitted to the destination (0: unlimited), with Burst
	// more at once after a quiet time (0: one tenth of Rate, at least 1).
	Rate  float64
	Burst int
	// MaxInFlight is the most events out to the destination at once, over the relay's
	// subscriptions (0: unlimited).
	MaxInFlight int
}

// maxLimited bounds the destinations whose flow-control state a Relay keeps; past it, the state
// of destinations idle for idleLimited is dropped first.
const (
	maxLimited  = 4096
	idleLimited = time.Minute
)

// limiters is a Relay's flow-control state per destination, shared by its subscriptions: the
// delivery goroutines of every subscription take tokens and in-flight slots under mu.
type limiters struct {
	limits func(dest string) Limit
	mu     sync.Mutex
	m      map[string]*limited
}

// limited is one destination's flow-control state.
type limited struct {
	limit    Limit
	rl       *rate.Limiter // nil without a Rate
	inflight int
	used     time.Time
}

// of returns dest's state, or nil when it has no limit.
func (l *limiters) of(dest string, now time.Time) *limited {
	if l == nil || l.limits == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if st := l.m[dest]; st != nil {
		st.used = now
		return st
	}
	lim := l.limits(dest)
	if lim == (Limit{}) {
		return nil
	}
	if len(l.m) >= maxLimited {
		for d, st := range l.m {
			if st.inflight == 0 && now.Sub(st.used) >= idleLimited {
				delete(l.m, d)
			}
		}
	}
	st := &limited{limit: lim, used: now}
	if lim.Rate > 0 {
		burst := lim.Burst
		if burst <= 0 {
			burst = max(1, int(lim.Rate/10))
		}
		st.rl = rate.NewLimiter(rate.Limit(lim.Rate), burst)
	}
	if len(l.m) < maxLimited {
		if l.m == nil {
			l.m = map[string]*limited{}
		}
		l.m[dest] = st
	}
	return st
}

// take takes a token and an in-flight slot of st for one event at now. It returns the hold
// (> 0: over the rate; the event is held that long, and the k-th such event of a batch 1/Rate
// later than the one before) or full (at MaxInFlight; wait for a delivery to end).
func (l *limiters) take(st *limited, now time.Time, k int) (hold time.Duration, full bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if m := st.limit.MaxInFlight; m > 0 && st.inflight >= m {
		return 0, true
	}
	if st.rl != nil {
		r := st.rl.ReserveN(now, 1)
		if d := r.DelayFrom(now); d > 0 {
			r.CancelAt(now)
			return d + time.Duration(float64(k)/st.limit.Rate*float64(time.Second)), false
		}
	}
	st.inflight++
	return 0, false
}

// done gives back an in-flight slot taken by take.
func (l *limiters) done(st *limited) {
	l.mu.Lock()
	st.inflight--
	l.mu.Unlock()
}

// destView is what a batch's delivery knows of the destinations in an outage: for each, when
// its next probe is due; written by the poll goroutine before the delivery starts, read-only
// afterwards.
type destView map[string]time.Time

// destView returns the outages whose events a delivery holds: those not past
// UnavailableDeadLetterAfter (after it their events go out and are dead-lettered when refused).
func (sub *subscription) destView(now time.Time) destView {
	if sub.s.cfg.Destination == nil || len(sub.outages) == 0 {
		return nil
	}
	v := destView{}
	for d, o := range sub.outages {
		if !sub.outageExpired(o, now) {
			v[d] = o.nextProbe
		}
	}
	return v
}

// gate is one batch's per-destination bookkeeping in deliverEach (its goroutine only).
type gate struct {
	sub    *subscription
	view   destView
	probed map[string]bool // destinations whose probe this batch sent
	down   map[string]bool // destinations that refused an event of this batch
	held   map[string]int  // events held over a destination's rate so far
	// waiting are the lanes whose next event waits for an in-flight slot of its destination,
	// taken back by release when one of this batch's deliveries to it ends.
	waiting map[string][]*lane
	// mine counts this batch's deliveries out per destination.
	mine map[string]int
}

// admit decides whether it (its destination named) goes out now. It returns false when it is
// held (its state set) or its lane waits for an in-flight slot (waiting).
func (g *gate) admit(it *item, l *lane, now time.Time) (ok, waiting bool) {
	sub := g.sub
	d := it.dest
	if g.down[d] {
		it.hold(sub.s.cfg.UnavailableBackoff, HeldOutage, fmt.Sprintf("held: destination %q unavailable (refused an event of the same batch)", d))
		return false, false
	}
	if probe, in := g.view[d]; in {
		if now.Before(probe) || g.probed[d] {
			it.hold(max(probe.Sub(now), sub.s.cfg.UnavailableBackoff), HeldOutage, fmt.Sprintf("held: destination %q in an outage; next probe in %s", d, max(probe.Sub(now), 0).Round(time.Millisecond)))
			return false, false
		}
		if g.probed == nil {
			g.probed = map[string]bool{}
		}
		g.probed[d] = true // this event is the probe
	}
	st := sub.s.limits.of(d, now)
	if st == nil {
		return true, false
	}
	hold, full := sub.s.limits.take(st, now, g.held[d])
	switch {
	case full && g.mine[d] > 0:
		if g.waiting == nil {
			g.waiting = map[string][]*lane{}
		}
		g.waiting[d] = append(g.waiting[d], l)
		return false, true
	case full:
		// Every slot is taken by other batches (other subscriptions of this relay): held
		// briefly rather than waiting on deliveries this batch does not see end.
		it.hold(sub.s.cfg.UnavailableBackoff, HeldInFlight, fmt.Sprintf("held: destination %q at its MaxInFlight", d))
		return false, false
	case hold > 0:
		if g.held == nil {
			g.held = map[string]int{}
		}
		g.held[d]++
		it.hold(hold, HeldRate, fmt.Sprintf("held: destination %q over its rate of %g events/s", d, st.limit.Rate))
		return false, false
	}
	it.limited = st
	if g.mine == nil {
		g.mine = map[string]int{}
	}
	g.mine[d]++
	return true, false
}

// answered notes the end of it's delivery: its in-flight slot is given back, and a lane waiting
// for one is returned to go on; a refusal holds the rest of the batch's events bound there.
func (g *gate) answered(it *item) (resume *lane) {
	if it.limited != nil {
		g.sub.s.limits.done(it.limited)
		it.limited = nil
		g.mine[it.dest]--
	}
	if it.state == stateUnavailable && it.dest != "" {
		if g.down == nil {
			g.down = map[string]bool{}
		}
		g.down[it.dest] = true
	}
	if w := g.waiting[it.dest]; len(w) > 0 {
		resume, g.waiting[it.dest] = w[0], w[1:]
	}
	return resume
}

// stranded returns the lanes still waiting when no delivery of the batch is out: their events
// are held briefly (their destination's slots are all taken by other batches).
func (g *gate) stranded() []*lane {
	var out []*lane
	for d, w := range g.waiting {
		out = append(out, w...)
		delete(g.waiting, d)
	}
	return out
}

// hold marks it held back before emission for d with the note why (see dialect.MarkParams.Held).
func (it *item) hold(d time.Duration, reason, why string) {
	it.state, it.holdFor, it.holdReason, it.err = stateHeld, max(d, time.Millisecond), reason, fmt.Errorf("%s", why)
}
