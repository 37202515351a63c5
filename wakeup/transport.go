package wakeup

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
)

// Transport describes the two halves of a wakeup over some connection (a broker, a
// database); FromTransport assembles them into a Wakeup with the guarantees of this package
// (coalesced non-blocking writer side, shared reconnecting listener, per-topic dispatch). The
// implementations of this module's subpackages are built this way.
type Transport struct {
	// Name identifies the transport in logs ("pgnotify", "redis", …).
	Name string
	// Send sends one batch of distinct topics (the empty topic: wake every relay). It is
	// called from one goroutine at a time. Nil makes Signal a no-op (a wakeup whose writer side
	// travels elsewhere, as pgnotify's in-transaction mode).
	Send func(ctx context.Context, topics []string) error
	// Listen is the listener's Session, started on the first Listen call and run until Close
	// by RunListener, dispatching into the Hub it is given. Nil means the value only writes.
	Listen func(ctx context.Context, hub *Hub, subscribed func()) error
	// Window is the writer side's coalescing window. Zero means DefaultWindow.
	Window time.Duration
	// Reconnect shapes the backoff of the listener and of failed sends.
	Reconnect Reconnect
	// Close, when set, releases the transport's resources once the listener and the writer
	// side have stopped.
	Close func() error
	// Logger receives the listener's and the writer side's logs. Nil means
	// watermill.NopLogger.
	Logger watermill.LoggerAdapter
}

// TransportWakeup is a Wakeup assembled by FromTransport. Safe for concurrent use.
type TransportWakeup struct {
	t        Transport
	hub      *Hub
	co       *Coalescer // nil without Send
	ctx      context.Context
	cancel   context.CancelFunc
	start    sync.Once
	wg       sync.WaitGroup
	closeMu  sync.Mutex
	closed   bool
	closeErr error
}

// FromTransport assembles t into a Wakeup. The writer side's goroutine starts at once; the
// listener starts with the first Listen call. Call Close to stop both.
func FromTransport(t Transport) *TransportWakeup {
	t.Logger = orNop(t.Logger)
	w := &TransportWakeup{t: t, hub: NewHub()}
	w.ctx, w.cancel = context.WithCancel(context.Background())
	if t.Send != nil {
		w.co = NewCoalescer(t.Window, t.Send, t.Reconnect, t.Logger.With(watermill.LogFields{"wakeup_writer": t.Name}))
	}
	return w
}

// Listen implements outbox.Wakeup: the channel receives a value once the shared listener is
// subscribed (and after each reconnect), and whenever a signal arrives for a topic accept
// accepts; it is closed when ctx ends. The first call starts the listener. After Close it
// still returns a channel, which receives nothing and is closed when ctx ends.
func (w *TransportWakeup) Listen(ctx context.Context, accept func(topic string) bool) <-chan struct{} {
	ch := w.hub.Listen(ctx, accept)
	if w.t.Listen != nil {
		w.start.Do(func() {
			w.closeMu.Lock()
			defer w.closeMu.Unlock()
			if w.closed {
				return
			}
			w.wg.Add(1)
			go func() {
				defer w.wg.Done()
				RunListener(w.ctx, w.hub, w.t.Reconnect, w.t.Logger, w.t.Name, func(ctx context.Context, subscribed func()) error {
					return w.t.Listen(ctx, w.hub, subscribed)
				})
			}()
		})
	}
	return ch
}

// Signal hands topics to the writer side (see Wakeup.Signal); it never blocks.
func (w *TransportWakeup) Signal(topics ...string) {
	if w.co != nil {
		w.co.Signal(topics...)
	}
}

// Hub returns the Hub the listener dispatches into (for tests and custom dispatch).
func (w *TransportWakeup) Hub() *Hub { return w.hub }

// Close stops the listener, sends pending signals (bounded by a few seconds), stops the writer
// side and calls Transport.Close. Idempotent: later calls return the first call's error.
func (w *TransportWakeup) Close() error {
	w.closeMu.Lock()
	defer w.closeMu.Unlock()
	if w.closed {
		return w.closeErr
	}
	w.closed = true
	w.cancel()
	w.wg.Wait()
	var errs []error
	if w.co != nil {
		errs = append(errs, w.co.Close())
	}
	if w.t.Close != nil {
		errs = append(errs, w.t.Close())
	}
	w.closeErr = errors.Join(errs...)
	return w.closeErr
}

var _ Wakeup = (*TransportWakeup)(nil)
