// Package engine is the relay: it leases batches of pending events from the outbox table
// through a dialect.Relay, emits them as Watermill messages, and writes each batch's outcome
// back. The root package keeps the public Watermill face (Subscriber, its config, hooks and
// errors) and reaches the engine through Config, Host and Hooks.
//
// One subscription (one Subscribe call) is a pipeline of stages run by its poll goroutine:
//
//   - pace (pace.go): when to poll — the poll interval, wakeups, the wake probe, due retries
//     and outage probes, backoff after failed polls;
//   - claim (claim.go): the claim statement and the adaptive policies that shape it (walk
//     sizing, hot-key splitting, key lows and floors, the key scan's cursor);
//   - select (select.go): which claimed events go out (each key's gap-free run, no poison
//     event, nothing of a topic paused since a batch claimed ahead);
//   - deliver (deliver.go): emitting messages per key lane or as one batch and awaiting
//     their answers, with the lease renewed (renew.go) and acks flushed (flush.go) meanwhile;
//   - settle (outage.go, continuations.go): outages opened or closed by the answers, and the
//     runs the next claim may continue;
//   - mark (mark.go): the fenced mark statement, written beside the next batch's delivery.
//
// poll.go ties them together, with claim-ahead (the next batch claimed while one is out);
// takeback.go releases an earlier same-name relay's leases at the start, floors.go holds the
// PostgreSQL floors' key lows and sweeper, and wakeprobe.go the wake probe shared by a
// Relay's subscriptions.
package engine

import (
	"context"
	"errors"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-outbox/outbox/internal/dialect"
)

// The engine's errors; the root package exports them under the same names.
var (
	ErrClosed          = errors.New("outbox: closed")
	ErrNacked          = errors.New("outbox: message nacked")
	ErrLeaseLost       = errors.New("outbox: lease lost to another relay")
	ErrPoisonEvent     = errors.New("outbox: poison event: its deliveries kept ending without an outcome (relay stopped, or not attempted)")
	ErrDeliveryTimeout = errors.New("outbox: delivery timeout: message neither acked nor nacked")
)

// Config is the relay's settings with the root package's defaults applied.
type Config struct {
	RelayName                                       string
	BatchSize, MaxRunPerKey, KeyScan                int
	MaxAttempts, Concurrency, MaxDeliveryStarts     int
	LeaseDuration, PollInterval, DeliveryTimeout    time.Duration
	CloseTimeout, MarkInterval, RetryBase, RetryMax time.Duration
	UnavailableBackoff, UnavailableBackoffMax       time.Duration
	UnavailableDeadLetterAfter                      time.Duration
	WakeProbeInterval                               time.Duration
	// SweepInterval is how often a subscription with floors sweeps below them (0: 30 s).
	SweepInterval time.Duration
	// TakeBack: a subscription starts by releasing the unexpired leases of an earlier relay
	// of the same RelayName (see takeback.go).
	TakeBack bool
	// Wakeup, when set, returns a channel that receives a value whenever events of a topic
	// match accepts may have been committed, until ctx ends.
	Wakeup func(ctx context.Context, match func(topic string) bool) <-chan struct{}
	// Destination, when set, names the destination of an event's message before the
	// per-message path emits it ("" for none): outages and flow control are then kept per
	// destination (see destinations.go). Called from the delivery goroutines.
	Destination func(topic string, msg *message.Message) string
	// Limits returns a destination's flow control (the zero Limit: none); nil: none. Called
	// once per destination while its state is kept.
	Limits func(dest string) Limit
	// SQLiteEager and SQLiteNoReadFirst select the SQLite claims' locking policy (see
	// eagerClaim); benchmarks compare policies with them.
	SQLiteEager       int32
	SQLiteNoReadFirst bool
}

// Class is how the relay treats a delivery error (see Host.Classify).
type Class int

// The failure classes: an ordinary failure (backoff, MaxAttempts), unavailable (no attempt,
// the destination paused), permanent (dead letter now), not attempted (released, nothing
// counted).
const (
	ClassFailure Class = iota
	ClassUnavailable
	ClassPermanent
	ClassNotAttempted
)

// Answerer is the root package's per-message record of a Nack's reason.
type Answerer interface {
	// NackError returns the error given with the message's Nack (nil: none).
	NackError() error
}

// Host is what the engine needs of the root package: the Watermill side of events and the
// meaning of destination errors. Its functions are called from many goroutines at once.
type Host struct {
	// Event converts a claimed row into the value Message receives (the root's *Event) and
	// returns the event id in its canonical form.
	Event func(c *dialect.Claimed) (ev any, id string)
	// Message builds the message of an event (Event's value and id) to emit with a context
	// derived from ctx; cancel ends that context once the message is answered.
	Message func(ctx context.Context, ev any, id string) (msg *message.Message, a Answerer, cancel context.CancelFunc)
	// Classify returns the class of a delivery error.
	Classify func(err error) Class
	// Unavailable reports whether err says its destination is unavailable, and names it.
	Unavailable func(err error) (ok bool, destination string, retryAfter time.Duration)
	// DeliveryError wraps err as the error of a failed delivery of the event id of topic.
	DeliveryError func(id, topic string, err error) error
}

// Relay is the engine of one Subscriber: its subscriptions share the database handle, the
// fencing token prefix, the wake probe and the outage list. Safe for concurrent use. Its
// fields are set by New and read-only afterwards, but for those under a lock (closed,
// outages) or atomic (claims), written by any subscription's goroutines and by Close.
type Relay struct {
	db    dialect.Executor
	d     dialect.Dialect
	caps  dialect.Capabilities
	t     *dialect.Table
	table string // t quoted, for messages
	cfg   Config
	host  Host
	hooks Hooks

	logger watermill.LoggerAdapter
	warn   func(msg string, err error, fields watermill.LogFields) // nil: WARN as INFO

	closing   chan struct{}
	closeMu   sync.RWMutex // held for reading while a subscription starts, for writing by Close
	closed    bool
	closeOnce sync.Once
	wg        sync.WaitGroup
	// claims numbers the fencing tokens; tokenPrefix is RelayName plus a random nonce of this
	// Relay: tokens stay unique even when two processes share a RelayName.
	claims      atomic.Int64
	tokenPrefix string
	outagesMu   sync.Mutex
	outages     map[*subscription][]Outage // written by each subscription's poll goroutine
	probe       *wakeProbe                 // nil without a wake probe (wakeprobe.go)
	limits      *limiters                  // per-destination flow control; nil without Limits
}

// Params is what New needs besides Config: the table, its dialect, and the handles.
type Params struct {
	DB      dialect.Executor // the relay's statements
	ProbeDB dialect.Executor // the wake probe's (nil: no wake probe)
	Dialect dialect.Dialect
	Table   *dialect.Table
	// Quoted is Table quoted by the dialect, for messages.
	Quoted      string
	TokenPrefix string
	Host        Host
	Hooks       Hooks
	Logger      watermill.LoggerAdapter
	Warn        func(msg string, err error, fields watermill.LogFields)
}

// New returns a Relay; it runs no SQL.
func New(cfg Config, p Params) *Relay {
	r := &Relay{db: p.DB, d: p.Dialect, caps: p.Dialect.Capabilities(), t: p.Table, table: p.Quoted, cfg: cfg, host: p.Host,
		hooks: p.Hooks, logger: p.Logger, warn: p.Warn, closing: make(chan struct{}), tokenPrefix: p.TokenPrefix}
	if cfg.Destination != nil && cfg.Limits != nil {
		r.limits = &limiters{limits: cfg.Limits}
	}
	if pr, ok := p.Dialect.(dialect.WakeProber); ok && p.ProbeDB != nil {
		r.probe = &wakeProbe{s: r, p: pr, ex: p.ProbeDB, interval: cfg.WakeProbeInterval, subs: map[chan struct{}]struct{}{}}
	}
	return r
}

// Selection is the topics a subscription claims: the dialect's form and a matcher for
// wakeups.
type Selection struct {
	Dialect dialect.TopicSelection
	Match   func(topic string) bool
}

// Subscribe starts a subscription of sel that emits each claimed batch's messages one at a
// time on out, each ordering key's after the previous was acked, up to Concurrency at once.
// done is called when the subscription has stopped. Errors: ErrClosed after Close.
func (r *Relay) Subscribe(ctx context.Context, sel Selection, out chan<- *message.Message, done func()) error {
	sub := r.newSubscription(ctx, sel)
	sub.emit = func(ctx, mctx context.Context, b []*item) bool { return sub.deliverEach(ctx, mctx, b, out) }
	return sub.start(done)
}

// SubscribeBatches is Subscribe for batch destinations: send emits a claimed batch's messages
// whole (it returns false when ctx ended first).
func (r *Relay) SubscribeBatches(ctx context.Context, sel Selection, send func(ctx context.Context, msgs []*message.Message) bool, done func()) error {
	sub := r.newSubscription(ctx, sel)
	sub.emit = func(ctx, mctx context.Context, b []*item) bool { return sub.deliverBatch(ctx, mctx, b, send) }
	return sub.start(done)
}

// Close stops every subscription (see the root's Subscriber.Close) and waits for them.
func (r *Relay) Close() {
	r.closeOnce.Do(func() {
		r.closeMu.Lock()
		r.closed = true
		close(r.closing)
		r.closeMu.Unlock()
	})
	r.wg.Wait()
}

// Outages returns the destinations the subscriptions treat as unavailable, sorted by
// destination.
func (r *Relay) Outages() []Outage {
	r.outagesMu.Lock()
	defer r.outagesMu.Unlock()
	var out []Outage
	for _, m := range r.outages {
		out = append(out, m...)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Destination < out[j].Destination })
	return out
}

// Announce wakes the relays that watch the table with a wake probe (see wakeprobe.go).
func (r *Relay) Announce(ctx context.Context) { r.announce(ctx) }

func (r *Relay) logWarn(msg string, err error, fields watermill.LogFields) {
	if r.warn != nil {
		r.warn(msg, err, fields)
		return
	}
	f := fields.Copy()
	f["severity"] = "WARN"
	f["error"] = err.Error()
	r.logger.Info(msg, f)
}
