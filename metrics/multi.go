package metrics

import (
	"time"

	"github.com/watermill-outbox/outbox"
)

// Multi returns a Recorder that passes every measurement to each of recs in order (for
// example Prometheus and OpenTelemetry at once). Nil entries are skipped.
func Multi(recs ...Recorder) Recorder {
	var m multi
	for _, r := range recs {
		if r != nil {
			m = append(m, r)
		}
	}
	return m
}

type multi []Recorder

func (m multi) Delivered(topic string, delay time.Duration) {
	for _, r := range m {
		r.Delivered(topic, delay)
	}
}

func (m multi) Failed(topic string) {
	for _, r := range m {
		r.Failed(topic)
	}
}

func (m multi) DeadLettered(topic string) {
	for _, r := range m {
		r.DeadLettered(topic)
	}
}

func (m multi) Unavailable(topic string) {
	for _, r := range m {
		r.Unavailable(topic)
	}
}

func (m multi) LeaseLost(events int) {
	for _, r := range m {
		r.LeaseLost(events)
	}
}

func (m multi) Claim(events int, d time.Duration) {
	for _, r := range m {
		r.Claim(events, d)
	}
}

func (m multi) Mark(d time.Duration, failed bool) {
	for _, r := range m {
		r.Mark(d, failed)
	}
}

func (m multi) Backlog(b outbox.Backlog) {
	for _, r := range m {
		r.Backlog(b)
	}
}

func (m multi) BacklogFailed() {
	for _, r := range m {
		r.BacklogFailed()
	}
}

func (m multi) DestinationCall(destination string, d time.Duration, ok bool) {
	for _, r := range m {
		r.DestinationCall(destination, d, ok)
	}
}

func (m multi) Held(destination, reason string) {
	for _, r := range m {
		if hr, ok := r.(HeldRecorder); ok {
			hr.Held(destination, reason)
		}
	}
}

func (m multi) DestinationUnavailable(destination string, down bool) {
	for _, r := range m {
		r.DestinationUnavailable(destination, down)
	}
}

func (m multi) Subscriptions(running, total int) {
	for _, r := range m {
		r.Subscriptions(running, total)
	}
}

func (m multi) Written(topic string, duplicate bool) {
	for _, r := range m {
		r.Written(topic, duplicate)
	}
}

func (m multi) WriteInvalid(field string) {
	for _, r := range m {
		r.WriteInvalid(field)
	}
}

func (m multi) WriteCall(d time.Duration, outcome string) {
	for _, r := range m {
		r.WriteCall(d, outcome)
	}
}
