package wakeup

import (
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/watermill-outbox/outbox"
)

// Wakeup is one wakeup mechanism, both sides: the writer side signals the topics of committed
// events (Signal), the relay side is the outbox.Wakeup that subscriptions listen on (Listen).
// Every implementation in this module is safe for concurrent use.
type Wakeup interface {
	outbox.Wakeup
	// Signal tells relays that events of topics have been committed. Call it after COMMIT
	// (RunInTx, RunInSQLTx and Collector do). It never blocks on the transport and returns
	// nothing: a signal that cannot be sent is logged and lost, which only delays delivery
	// until the relays' next poll. An empty topic wakes every relay. Signals after Close are
	// dropped.
	Signal(topics ...string)
	// Close stops the listener and the writer side, sending signals still pending (bounded by
	// a few seconds). Channels returned by Listen stay open, receiving nothing more, until
	// their context ends. Idempotent.
	Close() error
}

// PublisherConfigurer is implemented by a Wakeup whose writer side travels inside the writing
// transaction (pgnotify in InTransaction mode): RunInTx, RunInSQLTx and Collector pass the
// publisher config through PublisherConfig before building the Publisher.
type PublisherConfigurer interface {
	// PublisherConfig returns cfg with the fields this wakeup needs set (for example
	// NotifyChannel). It must not change the fields it does not own.
	PublisherConfig(cfg outbox.PublisherConfig) outbox.PublisherConfig
}

// Defaults of Reconnect and of the coalescing window.
const (
	// DefaultInitialBackoff is Reconnect.InitialBackoff's default.
	DefaultInitialBackoff = 100 * time.Millisecond
	// DefaultMaxBackoff is Reconnect.MaxBackoff's default.
	DefaultMaxBackoff = 10 * time.Second
	// DefaultWindow is the default coalescing window of the writer side (Coalescer): at most
	// one batch of signals per window, the first one of a quiet period sent at once. Under
	// sustained writes a signal waits at most this long; a relay that busy is polling
	// back-to-back anyway, so the window costs it nothing, while it caps the transport's
	// messages (pgnotify: NOTIFY transactions) at 200/s.
	DefaultWindow = 5 * time.Millisecond
	// FailuresBeforeError is the number of consecutive failures of a listener (or of a
	// writer's transport) from which each further failure is logged at ERROR rather than WARN.
	FailuresBeforeError = 5
)

// Reconnect shapes the backoff of a listener that lost its connection (and of a writer side
// whose transport fails). The zero value means the defaults.
type Reconnect struct {
	// InitialBackoff is the wait before the first reconnect attempt after a failure; it
	// doubles with each consecutive failure (±20% jitter). Default 100ms; negative is a
	// configuration error.
	InitialBackoff time.Duration
	// MaxBackoff caps the wait between attempts. Default 10s, at least InitialBackoff;
	// negative is a configuration error.
	MaxBackoff time.Duration
}

func (r *Reconnect) setDefaults() {
	if r.InitialBackoff == 0 {
		r.InitialBackoff = DefaultInitialBackoff
	}
	if r.MaxBackoff == 0 {
		r.MaxBackoff = max(DefaultMaxBackoff, r.InitialBackoff)
	}
}

// WithDefaults returns r with zero fields set to their defaults.
func (r Reconnect) WithDefaults() Reconnect {
	r.setDefaults()
	return r
}

// Validate returns a *outbox.ConfigError naming the first invalid field (prefixed with
// prefix, e.g. "pgnotify.Config.Reconnect"), or nil. Zero fields are valid.
func (r Reconnect) Validate(prefix string) error {
	switch {
	case r.InitialBackoff < 0:
		return &outbox.ConfigError{Field: prefix + ".InitialBackoff", Reason: "must not be negative"}
	case r.MaxBackoff < 0:
		return &outbox.ConfigError{Field: prefix + ".MaxBackoff", Reason: "must not be negative"}
	}
	r.setDefaults()
	if r.MaxBackoff < r.InitialBackoff {
		return &outbox.ConfigError{Field: prefix + ".MaxBackoff", Reason: fmt.Sprintf("%s is below InitialBackoff (%s)", r.MaxBackoff, r.InitialBackoff)}
	}
	return nil
}

// backoff returns the wait after the given number of consecutive failures (≥ 1), with ±20%
// jitter.
func (r Reconnect) backoff(failures int, jitter float64) time.Duration {
	d := r.InitialBackoff
	for i := 1; i < failures && d < r.MaxBackoff; i++ {
		d *= 2
	}
	d = min(d, r.MaxBackoff)
	return time.Duration(float64(d) * (0.8 + 0.4*jitter))
}

// logFailure logs the n-th consecutive failure: WARN (outbox.WarnLogger, or Info with
// severity=WARN) below FailuresBeforeError, ERROR from then on.
func logFailure(l watermill.LoggerAdapter, msg string, err error, n int, fields watermill.LogFields) {
	f := fields.Copy()
	f["consecutive_failures"] = n
	if n >= FailuresBeforeError {
		l.Error(msg, err, f)
		return
	}
	if w, ok := l.(outbox.WarnLogger); ok {
		w.Warn(msg, err, f)
		return
	}
	f["severity"] = "WARN"
	f["error"] = err.Error()
	l.Info(msg, f)
}

func orNop(l watermill.LoggerAdapter) watermill.LoggerAdapter {
	if l == nil {
		return watermill.NopLogger{}
	}
	return l
}
