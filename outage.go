package outbox

import (
	"maps"
	"sort"
	"time"
)

// Outage describes a destination that a subscription currently treats as unavailable.
type Outage struct {
	// Destination is the UnavailableError.Destination of the errors ("" when unnamed), or
	// "other" for the outage shared by destinations beyond the 256 a subscription tracks by
	// name (see SubscriberConfig.UnavailableBackoff).
	Destination string
	// Topics are the topics whose events it refused; they are not claimed but for probes.
	Topics []string
	// Since is when the first refusal was seen (relay clock).
	Since time.Time
	// Refused counts the events released as unavailable (no attempt counted) so far.
	Refused int
	// LastError is the last refusal's error.
	LastError error
	// LastProbe is when the last probe ended: the one event claimed for the outage's topics
	// was answered, or the claim found none. Zero before the first probe.
	LastProbe time.Time
	// NextProbe is when the next probe is due (relay clock); the probe waits grow from
	// UnavailableBackoff to UnavailableBackoffMax.
	NextProbe time.Time
}

// Outages returns the destinations that this Subscriber's subscriptions currently treat as
// unavailable (see SubscriberConfig.UnavailableBackoff), sorted by destination; empty when
// every destination answers. It reflects this process only: other relays keep their own.
// Safe for concurrent use.
func (s *Subscriber) Outages() []Outage {
	var out []Outage
	for _, o := range s.relay.Outages() {
		out = append(out, Outage(o))
	}
	return out
}

// DestinationLimits returns a copy of SubscriberConfig.DestinationLimits: the flow control
// of the destinations it names (nil when none). Safe for concurrent use.
func (s *Subscriber) DestinationLimits() map[string]DestinationLimit {
	return maps.Clone(s.cfg.DestinationLimits)
}

// Outages returns the outages of every table's Subscriber (see Subscriber.Outages), sorted by
// destination; a destination down for several tables appears once per table. Safe for
// concurrent use.
func (m *MultiSubscriber) Outages() []Outage {
	var out []Outage
	for _, s := range m.subs {
		out = append(out, s.Outages()...)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Destination < out[j].Destination })
	return out
}
