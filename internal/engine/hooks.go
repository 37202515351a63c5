package engine

import "time"

// Hooks observe the relay; nil fields are skipped. The root package's Hooks, field by field:
// each info type has the same fields as the root's of the same name.
type Hooks struct {
	OnDelivered    func(DeliveredInfo)
	OnFailed       func(FailedInfo)
	OnDeadLettered func(FailedInfo)
	OnUnavailable  func(FailedInfo)
	OnOutage       func(OutageInfo)
	OnLeaseLost    func(LeaseLostInfo)
	OnClaim        func(ClaimInfo)
	OnMark         func(MarkInfo)
	OnHeld         func(HeldInfo)
}

// HeldInfo describes an event held back for its destination (see destinations.go).
type HeldInfo struct {
	EventID, Topic, Destination, Reason string
	Until                               time.Time
}

// The reasons an event is held.
const (
	HeldOutage   = "outage"
	HeldRate     = "rate"
	HeldInFlight = "in_flight"
)

// OutageInfo describes a destination's outage as a subscription sees it.
type OutageInfo struct {
	Destination  string
	Topics       []string
	Since, Ended time.Time
	Released     int
	Err          error
}

// LeaseLostInfo describes a batch whose lease another relay took over.
type LeaseLostInfo struct {
	Token  string
	Events int
}

// ClaimInfo describes one claim statement.
type ClaimInfo struct {
	Events   int
	Duration time.Duration
	Probe    bool
}

// MarkInfo describes one mark statement.
type MarkInfo struct {
	Events   int
	Duration time.Duration
	Err      error
}

// DeliveredInfo describes a delivered event.
type DeliveredInfo struct {
	EventID  string
	Topic    string
	Attempts int
	Delay    time.Duration
}

// FailedInfo describes a failed delivery.
type FailedInfo struct {
	EventID       string
	Topic         string
	Attempts      int
	Err           error
	NextAttemptAt time.Time
	At            time.Time
}
