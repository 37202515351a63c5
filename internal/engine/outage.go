package engine

import (
	"fmt"
	"sort"
	"time"

	"github.com/ThreeDotsLabs/watermill"
)

// outage is a destination that answered unavailable (UnavailableError.Destination): the
// subscription claims none of the topics whose events it refused, except one event at a time as
// a probe, until a probe gets any other answer. Only the poll goroutine touches it.
type outage struct {
	dest      string // its key in subscription.outages (OverflowDestination for the shared one)
	topics    map[string]bool
	since     time.Time
	nextProbe time.Time
	lastProbe time.Time // when the last probe's answer (or its empty claim) came; zero: none yet
	probes    int
	refused   int // events released as unavailable during the outage
	lastErr   error
	// seen is when the outage last had an event: a refusal, or a probe that claimed one.
	seen time.Time
	// empty counts the probes in a row that claimed nothing (see idle).
	empty int
	// shared are the topics of which another destination answered an event during the
	// outage (Config.Destination): they are not paused; the outage's events are held instead.
	shared map[string]bool
}

// MaxOutages caps the destinations a subscription tracks in an outage by name, so that the
// outage state (and the Outages list, and the hooks' destinations) does not grow with the
// number of destinations, such as one per webhook host. A new destination that answers
// unavailable while MaxOutages are tracked joins the one shared outage named
// OverflowDestination: its topics are paused and probed with that outage's, no attempt is
// charged, and the first probe that gets an answer other than unavailable ends the shared
// outage (a destination still down opens an outage again at its next refusal).
const MaxOutages = 256

// OverflowDestination is the destination name of the shared outage beyond MaxOutages. A
// destination that is itself named so shares its outage.
const OverflowDestination = "other"

// idleProbes is how many probes in a row must claim nothing, with no event refused for
// UnavailableBackoffMax, before an outage is closed as idle: its topics have no claimable
// event left, so no probe will ever answer for it (see idle).
const idleProbes = 3

// Outage describes a destination that a subscription currently treats as unavailable.
type Outage struct {
	// Destination is the UnavailableError.Destination of the errors ("" when unnamed), or
	// OverflowDestination for the outage shared by destinations beyond MaxOutages.
	Destination string
	// Topics are the topics whose events it refused; they are not claimed but for probes.
	Topics []string
	// Since is when the first refusal was seen (relay clock).
	Since time.Time
	// Refused counts the events released as unavailable (no attempt counted) so far.
	Refused int
	// LastError is the last refusal's error.
	LastError error
	// LastProbe is when the last probe ended (its event answered, or its claim found none);
	// zero before the first.
	LastProbe time.Time
	// NextProbe is when the next probe is due (relay clock).
	NextProbe time.Time
}

// publishOutages copies the subscription's outages to the Subscriber for Outages.
func (sub *subscription) publishOutages() {
	var list []Outage
	for _, o := range sub.outages {
		ts := make([]string, 0, len(o.topics))
		for t := range o.topics {
			ts = append(ts, t)
		}
		sort.Strings(ts)
		list = append(list, Outage{Destination: o.dest, Topics: ts, Since: o.since, Refused: o.refused, LastError: o.lastErr, LastProbe: o.lastProbe, NextProbe: o.nextProbe})
	}
	s := sub.s
	s.outagesMu.Lock()
	if s.outages == nil {
		s.outages = map[*subscription][]Outage{}
	}
	if len(list) == 0 {
		delete(s.outages, sub)
	} else {
		s.outages[sub] = list
	}
	s.outagesMu.Unlock()
}

// pausedTopics returns the topics the next claim must leave out: those of every outage that
// has not passed UnavailableDeadLetterAfter (after it, its events are claimed at full rate and
// dead-lettered when refused); empty when nothing is paused.
func (sub *subscription) pausedTopics(now time.Time) []string {
	out := []string{}
	for _, o := range sub.outages {
		if sub.outageExpired(o, now) {
			continue
		}
		for t := range o.topics {
			out = append(out, t)
		}
	}
	return out
}

func (sub *subscription) outageExpired(o *outage, now time.Time) bool {
	d := sub.s.cfg.UnavailableDeadLetterAfter
	return d > 0 && now.Sub(o.since) >= d
}

// probeWait is the wait before an outage's next probe: a 32nd of the outage's age, within
// UnavailableBackoff..UnavailableBackoffMax, so that a destination back after a 30 s outage is
// probed within about 1 s, one down for hours every UnavailableBackoffMax. A probe is one event.
func (sub *subscription) probeWait(o *outage, now time.Time) time.Duration {
	return min(max(now.Sub(o.since)/32, sub.s.cfg.UnavailableBackoff), sub.s.cfg.UnavailableBackoffMax)
}

// dueProbe returns the outage whose probe is due, or nil.
func (sub *subscription) dueProbe(now time.Time) *outage {
	var due *outage
	for _, o := range sub.outages {
		if len(o.topics) > 0 && !sub.outageExpired(o, now) && !now.Before(o.nextProbe) && (due == nil || o.nextProbe.Before(due.nextProbe)) {
			due = o
		}
	}
	return due
}

// nextProbeAt returns when the earliest probe is due, or the zero time without outages.
func (sub *subscription) nextProbeAt(now time.Time) time.Time {
	var at time.Time
	for _, o := range sub.outages {
		if len(o.topics) > 0 && !sub.outageExpired(o, now) && (at.IsZero() || o.nextProbe.Before(at)) {
			at = o.nextProbe
		}
	}
	return at
}

// noteOutcomes opens or extends outages for the batch's events refused as unavailable, and
// turns such refusals into dead letters once their outage passed UnavailableDeadLetterAfter.
// probe is the outage a probe batch was claimed for (nil for an ordinary batch): any other
// answer to the probe ends it. Runs in the poll goroutine, after the batch is over.
func (sub *subscription) noteOutcomes(items []*item, probe *outage) {
	now := time.Now()
	answered := false
	// healthy: the topics of which a named destination (Config.Destination) answered an event
	// of the batch. A destination that answers ends its outage.
	var healthy map[string]bool
	for _, it := range items {
		if it.dest == "" || !(it.state == stateAcked || it.state == stateFailed && !(it.perm && sub.unavailable(it.err))) {
			continue
		}
		if healthy == nil {
			healthy = map[string]bool{}
		}
		healthy[it.ev.Topic] = true
		if o := sub.outages[it.dest]; o != nil {
			sub.closeOutage(o, now, false)
		}
		for _, o := range sub.outages {
			if o.topics[it.ev.Topic] {
				// Paused when its batch had no other answer; another destination of the topic
				// answers, so it flows again and only the outage's events are held.
				delete(o.topics, it.ev.Topic)
				if o.shared == nil {
					o.shared = map[string]bool{}
				}
				o.shared[it.ev.Topic] = true
			}
		}
	}
	for _, it := range items {
		switch it.state {
		case stateAcked, stateFailed:
			// A probe is answered by its own destination (another one's answer ends no outage
			// of a named destination: see healthy above).
			answered = answered || it.dest == ""
			// An outage past UnavailableDeadLetterAfter is not probed (its topics are claimed
			// at full rate): the first answer of one of its topics ends it.
			for _, o := range sub.outages {
				if o.topics[it.ev.Topic] && sub.outageExpired(o, now) && !(it.state == stateFailed && it.perm && sub.unavailable(it.err)) {
					sub.closeOutage(o, now, false)
				}
			}
			continue
		case stateHeld:
			if o := sub.outages[it.dest]; o != nil {
				o.seen = now
			}
			continue
		case stateUnavailable:
		default:
			continue
		}
		_, dest, retryAfter := sub.s.host.Unavailable(it.err)
		if it.dest != "" {
			dest = it.dest
		}
		o, opened := sub.outageOf(dest, it, now)
		if opened {
			defer sub.outageHook(o, time.Time{})
		}
		// A topic whose events another destination answered in this batch is not paused: the
		// destination's events are held instead (see destinations.go).
		spared := it.dest != "" && (healthy[it.ev.Topic] || o.shared[it.ev.Topic])
		if spared && o.shared == nil {
			o.shared = map[string]bool{}
		}
		if spared {
			o.shared[it.ev.Topic] = true
		} else {
			o.topics[it.ev.Topic] = true
		}
		o.refused++
		o.lastErr = it.err
		o.seen = now
		if h := sub.s.hooks.OnUnavailable; h != nil {
			h(FailedInfo{EventID: it.id, Topic: it.ev.Topic, Attempts: it.ev.Attempts, Err: sub.s.host.DeliveryError(it.id, it.ev.Topic, it.err), At: now})
		}
		// A destination's RetryAfter (a receiver's HTTP Retry-After) delays the next probe, but
		// by at most UnavailableBackoffMax: one answer of "Retry-After: 999999999" paused the
		// topics for 32 years (TestRetryAfterDelaysProbesAtMostBackoffMax).
		if next := now.Add(min(retryAfter, sub.s.cfg.UnavailableBackoffMax)); next.After(o.nextProbe) {
			o.nextProbe = next
		}
		switch {
		case sub.outageExpired(o, now):
			it.state, it.perm = stateFailed, true
			it.err = fmt.Errorf("destination unavailable for more than %s (SubscriberConfig.UnavailableDeadLetterAfter): %w", sub.s.cfg.UnavailableDeadLetterAfter, it.err)
		case it.dest != "":
			// A named destination refused it: held until after the outage's next probe, so
			// that a probe claims another event (one of another destination ends its topic's
			// pause, see healthy above); an in-batch probe refused moves the next one on.
			if spared && o != probe && !opened {
				o.probes++
				o.nextProbe = now.Add(max(sub.probeWait(o, now), o.nextProbe.Sub(now)))
			}
			it.hold(o.nextProbe.Sub(now)+sub.probeWait(o, now), HeldOutage, fmt.Sprintf("held: destination %q unavailable: %v", dest, it.err))
		}
	}
	if probe != nil {
		probe.probes++
		probe.lastProbe = now
		probe.empty++
		if len(items) > 0 {
			probe.empty = 0
			probe.seen = now
		}
		switch {
		case sub.outages[probe.dest] != probe: // ended by an expired-outage answer above
		case answered:
			sub.closeOutage(probe, now, false)
		case sub.idle(probe, now):
			sub.closeOutage(probe, now, true)
		default:
			probe.nextProbe = now.Add(max(sub.probeWait(probe, now), probe.nextProbe.Sub(now)))
		}
	}
	// An outage that pauses no topic (its events are held, see destinations.go) and saw none
	// for UnavailableBackoffMax is closed: nothing is known of its destination any more.
	for _, o := range sub.outages {
		if len(o.topics) == 0 && o != probe && now.Sub(o.seen) >= sub.s.cfg.UnavailableBackoffMax {
			sub.closeOutage(o, now, true)
		}
	}
	// An outage past UnavailableDeadLetterAfter is not probed: it ends at an answer of one of
	// its topics, or, when none of its events was refused for UnavailableDeadLetterAfter again
	// (its topics get no events any more), here.
	if d := sub.s.cfg.UnavailableDeadLetterAfter; d > 0 {
		for _, o := range sub.outages {
			if sub.outageExpired(o, now) && now.Sub(o.seen) >= d {
				sub.closeOutage(o, now, true)
			}
		}
	}
	sub.publishOutages()
}

// outageOf returns the outage that the refusal of it by dest joins: dest's own, or the shared
// OverflowDestination one when MaxOutages destinations are tracked. opened: there was none
// (it is logged; the caller calls Hooks.OnOutage).
func (sub *subscription) outageOf(dest string, it *item, now time.Time) (o *outage, opened bool) {
	if o := sub.outages[dest]; o != nil {
		return o, false
	}
	over := sub.outages[OverflowDestination]
	named := len(sub.outages)
	if over != nil {
		named--
	}
	if named >= MaxOutages {
		if over != nil {
			return over, false
		}
		sub.s.logWarn(fmt.Sprintf("outbox: destination unavailable; %d destinations are in an outage already, so it shares the outage %q; its topics are paused and probed, no attempts are counted", MaxOutages, OverflowDestination),
			it.err, watermill.LogFields{"destination": dest, "topic": it.ev.Topic})
		dest = OverflowDestination
	} else {
		sub.s.logWarn("outbox: destination unavailable; its topics are paused and probed, no attempts are counted", it.err,
			watermill.LogFields{"destination": dest, "topic": it.ev.Topic})
	}
	if sub.outages == nil {
		sub.outages = map[string]*outage{}
	}
	o = &outage{dest: dest, topics: map[string]bool{}, since: now, nextProbe: now.Add(sub.s.cfg.UnavailableBackoff)}
	sub.outages[dest] = o
	return o, true
}

// idle reports whether the outage's topics have no event left to probe: idleProbes probes in a
// row claimed nothing (the events may be held behind a failed head, or leased by another
// relay, for a while) and none was refused or claimed for UnavailableBackoffMax. Nothing is
// then known about the destination, and an outage kept open would hold its memory and its
// gauge for good; one refusal opens it again.
func (sub *subscription) idle(o *outage, now time.Time) bool {
	return o.empty >= idleProbes && now.Sub(o.seen) >= sub.s.cfg.UnavailableBackoffMax
}

// outageHook calls Hooks.OnOutage for o (ended zero: it started).
func (sub *subscription) outageHook(o *outage, ended time.Time) {
	h := sub.s.hooks.OnOutage
	if h == nil {
		return
	}
	ts := make([]string, 0, len(o.topics))
	for t := range o.topics {
		ts = append(ts, t)
	}
	sort.Strings(ts)
	h(OutageInfo{Destination: o.dest, Topics: ts, Since: o.since, Ended: ended, Released: o.refused, Err: o.lastErr})
}

// closeOutage ends an outage: its topics are claimed at full rate again. idle: it ends because
// its topics had no event left (see idle), not because the destination answered.
func (sub *subscription) closeOutage(o *outage, now time.Time, idle bool) {
	delete(sub.outages, o.dest)
	sub.outageHook(o, now)
	msg := "outbox: destination available again; its topics are claimed at full rate"
	if idle {
		msg = "outbox: destination outage closed: its topics have no event left to deliver"
	}
	sub.s.logger.Info(msg, watermill.LogFields{
		"destination": o.dest, "unavailable_for": now.Sub(o.since).Round(time.Millisecond).String(),
		"events_released": o.refused, "probes": o.probes})
}

// unavailable reports whether err says its destination is unavailable.
func (sub *subscription) unavailable(err error) bool {
	ok, _, _ := sub.s.host.Unavailable(err)
	return ok
}
