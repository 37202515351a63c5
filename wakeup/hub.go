package wakeup

import (
	"context"
	"sync"
)

// Hub fans signals out to the channels of Listen: the relay side shared by every
// implementation of this module, usable for custom transports. A transport calls Dispatch for
// each received topic, and SetSubscribed around the life of its subscription.
//
// Each Listen channel is buffered (one value) and coalescing: a signal that finds the channel
// full is folded into the value already there. A Hub is safe for concurrent use; its zero
// value is not usable, call NewHub.
type Hub struct {
	mu         sync.Mutex
	subs       map[*hubSub]struct{}
	subscribed bool
}

type hubSub struct {
	accept func(topic string) bool
	ch     chan struct{}
}

// NewHub returns an empty Hub, not subscribed.
func NewHub() *Hub {
	return &Hub{subs: map[*hubSub]struct{}{}}
}

// Listen implements outbox.Wakeup: the returned channel receives a value when Dispatch is
// called with a topic that accept accepts (a nil accept accepts every topic), for every
// DispatchAll, and once at once if the Hub is subscribed (else once when it becomes so). It is
// closed, and the listener removed, when ctx ends — never earlier. accept is called from the
// dispatching goroutine and must be fast and safe for concurrent use.
func (h *Hub) Listen(ctx context.Context, accept func(topic string) bool) <-chan struct{} {
	s := &hubSub{accept: accept, ch: make(chan struct{}, 1)}
	if ctx.Err() != nil {
		close(s.ch)
		return s.ch
	}
	h.mu.Lock()
	h.subs[s] = struct{}{}
	if h.subscribed {
		s.ch <- struct{}{}
	}
	h.mu.Unlock()
	context.AfterFunc(ctx, func() {
		h.mu.Lock()
		delete(h.subs, s)
		close(s.ch)
		h.mu.Unlock()
	})
	return s.ch
}

// Dispatch signals every listener whose accept accepts topic; an empty topic signals every
// listener ("wake everyone": a transport that could not carry the topic).
func (h *Hub) Dispatch(topic string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for s := range h.subs {
		if topic == "" || s.accept == nil || s.accept(topic) {
			notify(s.ch)
		}
	}
}

// DispatchAll signals every listener without consulting accept.
func (h *Hub) DispatchAll() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for s := range h.subs {
		notify(s.ch)
	}
}

// SetSubscribed records whether the transport is subscribed. Becoming subscribed signals
// every listener once (DispatchAll), so that subscriptions poll for events committed while
// nothing was listening; listeners that arrive while subscribed get that value at once.
func (h *Hub) SetSubscribed(subscribed bool) {
	h.mu.Lock()
	was := h.subscribed
	h.subscribed = subscribed
	h.mu.Unlock()
	if subscribed && !was {
		h.DispatchAll()
	}
}

// Subscribed reports what SetSubscribed last recorded.
func (h *Hub) Subscribed() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.subscribed
}

// Listeners returns the number of channels currently listening.
func (h *Hub) Listeners() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.subs)
}

func notify(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}
