package outbox

import (
	"sync"

	"github.com/ThreeDotsLabs/watermill/message"
)

type errHolderKey struct{}

// errHolder carries a handler's error from RecordError to the subscriber's Nack handling.
type errHolder struct {
	mu  sync.Mutex
	err error
}

func (h *errHolder) set(err error) {
	h.mu.Lock()
	h.err = err
	h.mu.Unlock()
}

func (h *errHolder) get() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.err
}

// SetNackError records err as the reason of msg's coming Nack, for a message emitted by the
// Subscriber; the subscriber stores it in last_error. For any other message it does nothing.
// Call it before msg.Nack(). Safe for concurrent use.
func SetNackError(msg *message.Message, err error) {
	if h, ok := msg.Context().Value(errHolderKey{}).(*errHolder); ok && err != nil {
		h.set(err)
	}
}

// RecordError is a Watermill router middleware that records a handler's error with
// SetNackError, so the Nack that the router sends stores it in last_error (Watermill's Nack
// carries no reason). Put it outermost, before retry middlewares, so the final error counts.
func RecordError(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		msgs, err := h(msg)
		if err != nil {
			SetNackError(msg, err)
		}
		return msgs, err
	}
}

// NackError implements engine.Answerer.
func (h *errHolder) NackError() error { return h.get() }
