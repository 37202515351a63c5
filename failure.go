package outbox

import (
	"errors"
	"fmt"
	"time"

	"github.com/watermill-outbox/outbox/internal/engine"
)

// ErrUnavailable is matched (errors.Is) by every *UnavailableError: the destination could not be
// reached or refused service as a whole, so the event itself is not at fault.
var ErrUnavailable = errors.New("outbox: destination unavailable")

// ErrPermanent is matched (errors.Is) by every *PermanentError: the event can never be delivered
// as it is, so retrying it is futile.
var ErrPermanent = errors.New("outbox: permanent failure")

// UnavailableError is a delivery error that says the destination is unavailable: it could not be
// connected to, reset the connection before it accepted anything, answered that it cannot serve
// at all (a Kafka broker without a leader or enough replicas, HTTP 502/503/504, HTTP 429).
//
// The Subscriber counts no attempt for such an event: it releases it (attempts unchanged,
// last_error noted, last_error_class "unavailable"), stops claiming the topics that
// Destination serves, and probes the destination with one event at a time with a growing
// backoff until one is delivered (SubscriberConfig.Unavailable). Destination names the destination for that pause and for the
// logs; events of topics whose errors name different destinations pause independently, and an
// empty name is one destination of its own. RetryAfter, when positive, is the least time before
// the next probe (an HTTP Retry-After, RFC 9110 §10.2.3), up to
// SubscriberConfig.UnavailableBackoffMax: a destination cannot pause its topics for longer
// between probes.
//
// It matches ErrUnavailable with errors.Is and its cause through Unwrap.
type UnavailableError struct {
	Destination string
	RetryAfter  time.Duration
	Err         error
}

func (e *UnavailableError) Error() string {
	name := e.Destination
	if name == "" {
		name = "destination"
	}
	if e.Err == nil {
		return "unavailable: " + name
	}
	return fmt.Sprintf("unavailable: %s: %v", name, e.Err)
}

// Is reports whether target is ErrUnavailable.
func (e *UnavailableError) Is(target error) bool { return target == ErrUnavailable }

// Unwrap returns the cause.
func (e *UnavailableError) Unwrap() error { return e.Err }

// Unavailable wraps err as an *UnavailableError of the unnamed destination; nil stays nil, and
// an error that already matches ErrUnavailable is returned unchanged.
func Unavailable(err error) error {
	if err == nil || errors.Is(err, ErrUnavailable) {
		return err
	}
	return &UnavailableError{Err: err}
}

// PermanentError is a delivery error that says this event can never be delivered as it is
// (too large for the destination, a header the transport cannot carry, an HTTP answer the
// webhook's configuration calls permanent). The Subscriber dead-letters such an event at once,
// at the failing attempt, with the error in last_error; it does not wait for MaxAttempts.
//
// It matches ErrPermanent with errors.Is and its cause through Unwrap.
type PermanentError struct {
	Err error
}

func (e *PermanentError) Error() string {
	if e.Err == nil {
		return "permanent failure"
	}
	return "permanent: " + e.Err.Error()
}

// Is reports whether target is ErrPermanent.
func (e *PermanentError) Is(target error) bool { return target == ErrPermanent }

// Unwrap returns the cause.
func (e *PermanentError) Unwrap() error { return e.Err }

// Permanent wraps err as a *PermanentError; nil stays nil, and an error that already matches
// ErrPermanent is returned unchanged.
func Permanent(err error) error {
	if err == nil || errors.Is(err, ErrPermanent) {
		return err
	}
	return &PermanentError{Err: err}
}

// ErrNotAttempted is matched (errors.Is) by every *NotAttemptedError: the destination never
// judged the event, so it is released and sent again with no attempt counted.
var ErrNotAttempted = errors.New("outbox: delivery not attempted")

// NotAttemptedError is a delivery error that says the event's outcome is unknown through no
// fault of the event or the destination's judgement of it: the relay stopped before the
// destination answered, or the connection or channel died with the message unconfirmed (no
// confirm, no ack, no error from the broker about this message). The Subscriber releases such
// an event (lease cleared, attempts and last_error unchanged) and claims it again; unlike
// UnavailableError it pauses nothing, so a destination that reconnects at once loses no time.
// It matches ErrNotAttempted with errors.Is and its cause through Unwrap.
type NotAttemptedError struct {
	Err error
}

func (e *NotAttemptedError) Error() string {
	if e.Err == nil {
		return "not attempted"
	}
	return "not attempted: " + e.Err.Error()
}

// Is reports whether target is ErrNotAttempted.
func (e *NotAttemptedError) Is(target error) bool { return target == ErrNotAttempted }

// Unwrap returns the cause.
func (e *NotAttemptedError) Unwrap() error { return e.Err }

// NotAttempted wraps err as a *NotAttemptedError; nil stays nil, and an error that already
// matches ErrNotAttempted is returned unchanged.
func NotAttempted(err error) error {
	if err == nil || errors.Is(err, ErrNotAttempted) {
		return err
	}
	return &NotAttemptedError{Err: err}
}

// classify returns how the Subscriber treats a delivery error: an ordinary failure (backoff,
// MaxAttempts), not attempted (released, nothing counted), unavailable (no attempt, destination
// paused) or permanent (dead letter now). Not attempted wins over the others (the destination
// did not answer about the event), then unavailable (a destination that is down cannot judge
// the event).
func classify(err error) engine.Class {
	switch {
	case err == nil:
		return engine.ClassFailure
	case errors.Is(err, ErrNotAttempted):
		return engine.ClassNotAttempted
	case errors.Is(err, ErrUnavailable):
		return engine.ClassUnavailable
	case errors.Is(err, ErrPermanent):
		return engine.ClassPermanent
	default:
		return engine.ClassFailure
	}
}

// unavailableDestination reports whether err matches ErrUnavailable, with the Destination and
// RetryAfter of its *UnavailableError.
func unavailableDestination(err error) (ok bool, dest string, retryAfter time.Duration) {
	var ue *UnavailableError
	if errors.As(err, &ue) {
		return errors.Is(err, ErrUnavailable), ue.Destination, ue.RetryAfter
	}
	return errors.Is(err, ErrUnavailable), "", 0
}
