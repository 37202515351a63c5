package forwarder

import (
	"errors"
	"fmt"
)

// ErrHeldBack is the cause recorded for a message of a batch that was not published because an
// earlier message of its ordering key in the same batch failed. The subscriber releases such a
// message without counting an attempt (see outbox.Batch), and it follows the failed one later.
var ErrHeldBack = errors.New("forwarder: held back behind a failed event of the same ordering key")

// ErrNoTopic is the cause recorded for a message whose destination topic cannot be told: it has
// no outbox-topic metadata (it did not come from an outbox Subscriber), or Config.Topic returned
// "".
var ErrNoTopic = errors.New("forwarder: no destination topic")

// ErrAlreadyRunning is returned by Run when the Forwarder runs already.
var ErrAlreadyRunning = errors.New("forwarder: already running")

// ErrClosed is returned by Run after Close.
var ErrClosed = errors.New("forwarder: closed")

// ErrMissingResult is the cause recorded when a BatchPublisher returned fewer results than
// messages: a message without a result counts as failed.
var ErrMissingResult = errors.New("forwarder: batch publisher returned no result for the message")

// PublishError is the error of one failed publish: the event, the destination topic and the
// destination's error (Err, reached with errors.Is/As through Unwrap). It is what the
// forwarder records (through outbox.SetNackError) in last_error.
type PublishError struct {
	EventID string
	// Topic is the destination topic (after Config.Topic).
	Topic string
	Err   error
}

// Error names the destination topic and the cause. The event id is left out: the relay's log
// line and last_error already belong to the event, and the destination's error often names it.
func (e *PublishError) Error() string {
	return fmt.Sprintf("forwarder: publish to %q: %v", e.Topic, e.Err)
}

// Unwrap returns the destination's error.
func (e *PublishError) Unwrap() error { return e.Err }
