package wakeup

import (
	"context"
	"sync/atomic"
)

// InProcess is the wakeup for relays in the same process as the writers: Signal dispatches to
// the listening subscriptions at once (a non-blocking send on each matching channel). It has no
// connection, so it never drops; every Listen channel receives one value at once, as with
// every implementation. Safe for concurrent use.
type InProcess struct {
	hub    *Hub
	closed atomic.Bool
}

// NewInProcess returns an in-process wakeup.
func NewInProcess() *InProcess {
	h := NewHub()
	h.SetSubscribed(true)
	return &InProcess{hub: h}
}

// Listen implements outbox.Wakeup (see Hub.Listen).
func (w *InProcess) Listen(ctx context.Context, accept func(topic string) bool) <-chan struct{} {
	return w.hub.Listen(ctx, accept)
}

// Signal wakes the subscriptions that serve topics (an empty topic wakes all). Dropped after
// Close.
func (w *InProcess) Signal(topics ...string) {
	if w.closed.Load() {
		return
	}
	for _, t := range topics {
		w.hub.Dispatch(t)
	}
}

// Hub returns the Hub the signals are dispatched through.
func (w *InProcess) Hub() *Hub { return w.hub }

// Close makes later signals no-ops. Idempotent; returns nil.
func (w *InProcess) Close() error {
	w.closed.Store(true)
	return nil
}

var _ Wakeup = (*InProcess)(nil)
