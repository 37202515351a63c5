package engine

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
)

// downErr is a refusal by an unavailable destination.
type downErr struct{ dest string }

func (e downErr) Error() string { return e.dest + " is down" }

// outageSub is a subscription that notes outcomes with no database: refusals are downErr, and
// the hooks record each outage opened or ended (dest, or "-"+dest) and count the refusals.
func outageSub(events *[]string, refused *int) *subscription {
	s := &Relay{logger: watermill.NopLogger{}, host: Host{
		Unavailable: func(err error) (bool, string, time.Duration) {
			var d downErr
			ok := errors.As(err, &d)
			return ok, d.dest, 0
		},
		DeliveryError: func(_, _ string, err error) error { return err },
	}, hooks: Hooks{
		OnOutage: func(i OutageInfo) {
			if i.Ended.IsZero() {
				*events = append(*events, i.Destination)
			} else {
				*events = append(*events, "-"+i.Destination)
			}
		},
		OnUnavailable: func(FailedInfo) { *refused++ },
	}}
	s.cfg.UnavailableBackoff, s.cfg.UnavailableBackoffMax = time.Millisecond, time.Minute
	return &subscription{s: s, ctx: context.Background()}
}

func refusal(i int) *item {
	return &item{ev: event{Topic: fmt.Sprintf("t%d", i)}, id: fmt.Sprint(i), state: stateUnavailable, err: downErr{fmt.Sprintf("webhook h%d:443", i)}}
}

// TestOutagesBounded: refusals by 1,000 destinations (one topic each) open MaxOutages outages
// by name and one shared OverflowDestination outage that holds the other 744 topics: every
// topic is paused, every refusal is released without an attempt, and the Relay's list holds
// MaxOutages+1 outages.
func TestOutagesBounded(t *testing.T) {
	const dests = 1000
	var events []string
	refused := 0
	sub := outageSub(&events, &refused)
	var items []*item
	for i := range dests {
		items = append(items, refusal(i))
	}
	sub.noteOutcomes(items[:dests/2], nil)
	sub.noteOutcomes(items[dests/2:], nil)
	if len(sub.outages) != MaxOutages+1 || len(sub.s.Outages()) != MaxOutages+1 {
		t.Fatalf("%d outages, %d listed, want %d", len(sub.outages), len(sub.s.Outages()), MaxOutages+1)
	}
	over := sub.outages[OverflowDestination]
	if over == nil || len(over.topics) != dests-MaxOutages || !over.topics["t256"] || !over.topics["t999"] || over.refused != dests-MaxOutages {
		t.Fatalf("overflow outage %+v, want topics t256…t999 and %d refused", over, dests-MaxOutages)
	}
	opened := map[string]bool{}
	for _, e := range events {
		opened[e] = true
	}
	if len(events) != MaxOutages+1 || !opened["webhook h0:443"] || !opened["webhook h255:443"] || !opened[OverflowDestination] || opened["webhook h256:443"] {
		t.Fatalf("%d outages opened, want %d: h0…h255 and %q", len(events), MaxOutages+1, OverflowDestination)
	}
	if n := len(sub.pausedTopics(time.Now())); n != dests {
		t.Fatalf("%d topics paused, want %d", n, dests)
	}
	for _, it := range items {
		if it.state != stateUnavailable || it.perm {
			t.Fatalf("event %s: state %d perm %v, want released as unavailable (no attempt)", it.id, it.state, it.perm)
		}
	}
	if refused != dests {
		t.Fatalf("OnUnavailable called %d times, want %d", refused, dests)
	}

	// The shared outage's probe gets an answer: it ends, all of its topics are claimed again.
	sub.noteOutcomes([]*item{{ev: event{Topic: "t500"}, state: stateAcked}}, over)
	if sub.outages[OverflowDestination] != nil || len(sub.outages) != MaxOutages || events[len(events)-1] != "-"+OverflowDestination {
		t.Fatalf("after the answer to its probe: overflow %v, %d outages, last hook %q", sub.outages[OverflowDestination], len(sub.outages), events[len(events)-1])
	}
	// A destination still down refuses again: the shared outage again, since MaxOutages are
	// tracked; once one of those ends, a new destination gets its own.
	sub.noteOutcomes([]*item{refusal(700)}, nil)
	if sub.outages[OverflowDestination] == nil || len(sub.outages) != MaxOutages+1 {
		t.Fatalf("refusal past the cap: %d outages, overflow %v", len(sub.outages), sub.outages[OverflowDestination])
	}
	sub.noteOutcomes([]*item{{ev: event{Topic: "t0"}, state: stateAcked}}, sub.outages["webhook h0:443"])
	sub.noteOutcomes([]*item{refusal(701)}, nil)
	if o := sub.outages["webhook h701:443"]; o == nil || !o.topics["t701"] || len(sub.outages) != MaxOutages+1 {
		t.Fatalf("refusal with a free slot: own outage %v, %d outages, want it and %d", o, len(sub.outages), MaxOutages+1)
	}
}

// TestIdleOutagesClosed: an outage whose probes claim nothing idleProbes times in a row, with
// no refusal for UnavailableBackoffMax, is closed (Hooks.OnOutage with Ended): 1,000
// destinations whose topics got no more events leave no outage behind.
func TestIdleOutagesClosed(t *testing.T) {
	var events []string
	refused := 0
	sub := outageSub(&events, &refused)
	var items []*item
	for i := range 1000 {
		items = append(items, refusal(i))
	}
	sub.noteOutcomes(items, nil)
	o := sub.outages["webhook h3:443"]
	for range idleProbes {
		sub.noteOutcomes(nil, o)
	}
	if sub.outages["webhook h3:443"] != o || o.empty != idleProbes {
		t.Fatalf("closed within UnavailableBackoffMax of its refusal (empty probes %d)", o.empty)
	}
	sub.noteOutcomes([]*item{refusal(3)}, o) // a probe that claims an event
	if o.empty != 0 {
		t.Fatalf("empty probes %d after a probe claimed an event, want 0", o.empty)
	}
	for _, o := range sub.outages {
		o.seen = o.seen.Add(-time.Minute) // as if UnavailableBackoffMax had passed
	}
	for range idleProbes - 1 {
		sub.noteOutcomes(nil, o)
	}
	if sub.outages["webhook h3:443"] != o {
		t.Fatalf("closed after %d empty probes, want %d", idleProbes-1, idleProbes)
	}
	events = nil
	for range idleProbes {
		for _, o := range sub.outages {
			sub.noteOutcomes(nil, o)
		}
	}
	if len(sub.outages) != 0 || len(sub.s.Outages()) != 0 || len(sub.s.outages) != 0 || len(events) != MaxOutages+1 {
		t.Fatalf("after idle probes: %d outages, %d listed, %d ended, want 0, 0, %d", len(sub.outages), len(sub.s.Outages()), len(events), MaxOutages+1)
	}
}

// TestExpiredOutageClosedWhenIdle: an outage past UnavailableDeadLetterAfter is not probed; it
// is closed once none of its events was refused for UnavailableDeadLetterAfter again.
func TestExpiredOutageClosedWhenIdle(t *testing.T) {
	var events []string
	refused := 0
	sub := outageSub(&events, &refused)
	sub.s.cfg.UnavailableDeadLetterAfter = time.Hour
	sub.noteOutcomes([]*item{refusal(1), refusal(2)}, nil)
	a, b := sub.outages["webhook h1:443"], sub.outages["webhook h2:443"]
	a.since, a.seen = a.since.Add(-3*time.Hour), a.seen.Add(-time.Hour)   // expired, idle
	b.since, b.seen = b.since.Add(-3*time.Hour), b.seen.Add(-time.Minute) // expired, refused lately
	sub.noteOutcomes(nil, nil)
	if sub.outages["webhook h1:443"] != nil || sub.outages["webhook h2:443"] != b || events[len(events)-1] != "-webhook h1:443" {
		t.Fatalf("outages %v, hooks %v: want h1 closed, h2 open", sub.outages, events)
	}
}
