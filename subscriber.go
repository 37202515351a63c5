package outbox

import (
	"context"
	cryptorand "crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/watermill-outbox/outbox/internal/dialect"
	"math/rand/v2"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// Subscriber is a Watermill message.Subscriber over the outbox table: each subscription leases
// batches of pending events (FOR UPDATE SKIP LOCKED, see the PostgreSQL docs on SELECT's locking
// clause), so several relays share one table; it keeps strict order per ordering key while
// different keys and unordered events go concurrently; and it turns Ack into published and Nack
// (or DeliveryTimeout) into a retry with backoff or, after MaxAttempts, a dead letter.
//
// While a full batch is out, each subscription claims the next one (at most one batch ahead,
// its lease renewed from the claim on) and writes the previous batch's marks; a key of the
// batch out is not claimed again before its marks land.
//
// Delivery is at least once: a relay that stops between delivering and marking lets the lease
// expire and the batch is delivered again. Every message carries the event id as its UUID.
//
// A Subscriber is safe for concurrent use. Close stops every subscription.
type Subscriber struct {
	db     execer
	s      *schema
	cfg    SubscriberConfig
	excl   []topicFilter
	logger watermill.LoggerAdapter

	closing   chan struct{}
	closeMu   sync.RWMutex // held for reading while a subscription starts, for writing by Close
	closed    bool
	closeOnce sync.Once
	wg        sync.WaitGroup
	warn      func(msg string, err error, fields watermill.LogFields)
	claims    atomic.Int64
	// tokenPrefix is RelayName plus a random nonce of this Subscriber: fencing tokens stay
	// unique even when two processes share a RelayName.
	tokenPrefix string
	outagesMu   sync.Mutex
	outages     map[*subscription][]Outage // see Outages
	probe       *wakeProbe                 // nil without a wake probe (wakeprobe.go)
}

// NewSubscriber returns a Subscriber reading the outbox table through db: a *pgxpool.Pool,
// *sql.DB (pgx stdlib driver) or a watermill-sql v4 Beginner (BeginnerFromPgx over a pool,
// BeginnerFromStdSQL); for DialectSQLite a *sql.DB of a SQLite driver opened with SQLiteDSN
// (relays in several processes may share the file: each claim is one write transaction); for
// DialectMySQL a *sql.DB of github.com/go-sql-driver/mysql. A
// *pgx.Conn is refused (it runs one statement at a time). A transaction is refused: the relay
// runs each statement on its own. A nil logger means watermill.NopLogger. Errors: a *ConfigError
// for an invalid config or handle. It runs no SQL.
//
// Over a *pgxpool.Pool or a pgx stdlib *sql.DB, also inside a watermill-sql Beginner
// (BeginnerFromPgx, BeginnerFromStdSQL), each relay statement runs in a transaction of
// its own, sent with BEGIN, its settings (SET LOCAL jit, plan_cache_mode, synchronous_commit)
// and COMMIT in one round trip: no setting outlives the transaction, so the relay works
// behind a transaction pooler. Every pgx.QueryExecMode works on a direct connection; through
// PgBouncer in transaction mode every mode but QueryExecModeCacheStatement (its named
// prepared statements live on one server connection; PgBouncer 1.21+ can track them with
// max_prepared_statements). A LISTEN-based wakeup (wakeup/pgnotify) needs a session
// connection: give it a direct DSN.
func NewSubscriber(db any, cfg SubscriberConfig, logger watermill.LoggerAdapter) (*Subscriber, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	s, err := cfg.Schema.compile()
	if err != nil {
		return nil, err
	}
	if err := checkHandle(db, cfg.Schema.Dialect); err != nil {
		return nil, err
	}
	ex, err := newRelayExecer(db, !cfg.SyncCommit)
	if err != nil {
		return nil, err
	}
	if ex.InTx() {
		return nil, &ConfigError{Field: "db", Reason: "the subscriber needs a pool or DB, not a transaction", Err: ErrUnsupportedDB}
	}
	if _, single := db.(*pgx.Conn); single {
		return nil, &ConfigError{Field: "db", Reason: "a *pgx.Conn runs one statement at a time; the subscriber runs several at once: use a *pgxpool.Pool", Err: ErrUnsupportedDB}
	}
	var probeEx execer
	if _, ok := s.d.(dialect.WakeProber); ok && cfg.WakeProbeInterval > 0 {
		if probeEx, err = newExecer(db); err != nil {
			return nil, err
		}
	}
	return newSubscriber(ex, probeEx, s, cfg, logger), nil
}

// newSubscriberOn returns a Subscriber whose relay runs the statements of the dialect d on ex,
// with no wake probe: the relay simulation's in-memory table. cfg is validated as by
// NewSubscriber.
func newSubscriberOn(ex execer, d dialect.Dialect, cfg SubscriberConfig, logger watermill.LoggerAdapter) (*Subscriber, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	s, err := cfg.Schema.compileWith(d)
	if err != nil {
		return nil, err
	}
	return newSubscriber(ex, nil, s, cfg, logger), nil
}

// newSubscriber builds a Subscriber over a validated config: ex runs the relay's statements,
// probeEx the wake probe's (nil: no probe).
func newSubscriber(ex, probeEx execer, s *schema, cfg SubscriberConfig, logger watermill.LoggerAdapter) *Subscriber {
	excl := make([]topicFilter, len(cfg.ExcludeTopics))
	for i, p := range cfg.ExcludeTopics {
		excl[i], _ = parseTopicPattern("", p)
	}
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	// The table as the user wrote it: s.table is quoted for SQL, and quoted again by loggers.
	scope := watermill.LogFields{"relay": cfg.RelayName, "table": strings.Join(s.t.Parts, ".")}
	var nonce [6]byte
	_, _ = cryptorand.Read(nonce[:])
	sub := &Subscriber{db: ex, s: s, cfg: cfg, excl: excl, logger: logger.With(scope), closing: make(chan struct{}),
		tokenPrefix: cfg.RelayName + "#" + hex.EncodeToString(nonce[:]) + "#"}
	if w, ok := logger.(WarnLogger); ok {
		sub.warn = func(msg string, err error, fields watermill.LogFields) { w.Warn(msg, err, scope.Add(fields)) }
	}
	if p, ok := s.d.(dialect.WakeProber); ok && probeEx != nil {
		sub.probe = &wakeProbe{s: sub, p: p, ex: probeEx, interval: cfg.WakeProbeInterval, subs: map[chan struct{}]struct{}{}}
	}
	return sub
}

// Subscribe returns the messages of the topics that topic selects: an exact name, a prefix
// pattern ending in '*' ("library.*"), or "*" for every topic, minus
// SubscriberConfig.ExcludeTopics. '_' and '%' are ordinary characters. The channel is closed
// when ctx ends or the Subscriber closes. Each message must be acked or nacked; see Subscriber
// for what each means. Errors: a *ConfigError for a bad pattern, a *TableNotFoundError when
// the outbox table does not exist (run Migrate), ErrClosed after Close.
func (s *Subscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	sub, err := s.newSubscription(ctx, topic)
	if err != nil {
		return nil, err
	}
	out := make(chan *message.Message)
	sub.emit = func(ctx, mctx context.Context, b []*item) bool { return sub.deliverEach(ctx, mctx, b, out) }
	if err := sub.start(func() { close(out) }); err != nil {
		return nil, err
	}
	return out, nil
}

// Batch is a claimed batch for destinations that take many messages per call (Kafka): the
// messages in sequence order, so one ordering key's events appear in order. Ack or Nack every
// message; the subscriber waits for all (up to DeliveryTimeout) before marking. After the first
// failed message of an ordering key, the key's later messages are released without counting
// an attempt — even those the destination acked, which are delivered again after the failed
// one — so the outbox never records a key's events out of order.
type Batch struct {
	Messages []*message.Message
}

// SubscribeBatches is Subscribe for batch destinations: it emits each claimed batch whole (see
// Batch). Concurrency does not apply. Errors as Subscribe.
func (s *Subscriber) SubscribeBatches(ctx context.Context, topic string) (<-chan Batch, error) {
	sub, err := s.newSubscription(ctx, topic)
	if err != nil {
		return nil, err
	}
	out := make(chan Batch)
	sub.emit = func(ctx, mctx context.Context, b []*item) bool { return sub.deliverBatch(ctx, mctx, b, out) }
	if err := sub.start(func() { close(out) }); err != nil {
		return nil, err
	}
	return out, nil
}

// Close stops every subscription: no new message is emitted, the messages out get up to
// SubscriberConfig.CloseTimeout to be acked or nacked (their contexts stay live meanwhile),
// marks are written, and every output channel is closed when Close returns. A stop charges no
// attempt: messages still unanswered then are released (lease cleared, attempts unchanged) and
// their contexts canceled, and a Nack with context.Canceled during the stop counts nothing.
// The same holds when the context given to Subscribe ends (a Watermill Router's Close).
// Idempotent; always returns nil.
func (s *Subscriber) Close() error {
	s.closeOnce.Do(func() {
		s.closeMu.Lock()
		s.closed = true
		close(s.closing)
		s.closeMu.Unlock()
	})
	s.wg.Wait()
	return nil
}

func (s *Subscriber) selection(topic string) (topicSelection, error) {
	inc, err := parseTopicPattern("topic", topic)
	if err != nil {
		return topicSelection{}, err
	}
	return topicSelection{include: inc, excludes: s.excl}, nil
}

// subscription is one Subscribe call's poll loop.
type subscription struct {
	s     *Subscriber
	sel   topicSelection
	relay dialect.Relay // the dialect's claim, renew and mark statements
	// cursor is where the next claim's key skip scan resumes.
	cursor string
	// oldest is how many of the oldest claimable keyed events the next claim walks and locks
	// (SKIP LOCKED) to find its keys (PostgreSQL): about twice the keys the last full batch
	// needed, so a concurrent relay's walk skips only those keys and finds others; doubled (up
	// to BatchSize) after each batch that was not full; back to about twice the last batch's
	// keys after a claim that found claimable keyed events but leased nothing.
	oldest int
	// During splitFor claims, a claim leases at most splitLimit keyed events of any keys:
	// the runs of half the last batch's keys (at most maxHotKeys keys), set when a claim
	// beside that batch's marks found claimable keyed events but leased nothing, so one half
	// of a few hot keys is claimed while the other half's marks are written (PostgreSQL).
	// Capped claims that fill up with long runs (on average at least MaxRunPerKey/2) renew
	// it; many short runs let it end.
	splitLimit int
	splitFor   int
	// serialFor counts the next polls that wait for the previous batch's marks before
	// claiming: set when one hot key's events were all the claimable work there was, or when
	// a claim beside the marks found nothing even though the split was on (another relay
	// holds the other half).
	serialFor int
	// lastKeyCount is the number of distinct ordering keys of the last batch that leased
	// events; walked the number of keys the last claim's oldest-keyed walk found (claimable
	// keyed events exist), -1 when the claim does not report it (SQLite).
	lastKeyCount int
	walked       int64
	// lastClaimed is how many events the last claim leased (its size hint for the next).
	lastClaimed int
	// heldPolls counts the polls in a row whose claim leased nothing although its walk found
	// claimable keyed events: their keys are held by another relay (or by a batch of this
	// one). The wait after such a poll doubles with each, up to heldWait (see pollWait).
	heldPolls int
	// lowUnordered and lowKeyed are where the claim's unordered scan and oldest-keyed walk
	// start (sequence >= low; PostgreSQL): after a full batch, its lowest unordered and
	// keyed sequence, so that a claim in a long backlog does not step over the index entries
	// of every event the relay already processed (until VACUUM removes them they grew a
	// 1M-event drain's claim from 21 to 27 ms). Events below them that become claimable again
	// (retries, released or expired leases) are found when the lows go back to 0: after a
	// batch that was not full, and after lowClaims full batches in a row (lowAge).
	lowUnordered, lowKeyed int64
	lowAge                 int
	// With Capabilities.Floors (PostgreSQL) the scans start at floors instead (see floors.go):
	// fl, the head checks' per-key lows, the sweeper below the floors, and contFollow: which
	// of contKeys are followed (see item.follow).
	fl         dialect.FloorTracker
	lows       *keyLows
	sweep      *sweeper
	contFollow map[string]bool
	// refind is a sequence the next claim lowers the keyed floor to (0: none; see refindFrom):
	// a followed key's events from there may lie below the floor with no continuation left to
	// lease them.
	refind int64
	// keyScanIn is how many more claims leave out the key skip scan, keyScanEvery how many the
	// last backoff was (PostgreSQL floors): a skip scan that found no claimable head of a key the
	// relay does not know (the known keys' heads come from their lows) doubles the backoff up to
	// maxKeyScanBackoff; one that found some ends it.
	keyScanIn, keyScanEvery int
	// Eager locking (SQLite, see ClaimParams.Eager and eagerClaim): woken is set when the
	// subscription's last wait ended with a wakeup signal (events were just committed) and
	// cleared when one ended with the poll interval; fullRun counts the claims in a row that
	// leased a whole batch. Only the subscription's goroutine uses them.
	woken   bool
	fullRun int
	// contKeys, contFrom, contAfter and contToken are the next claim's continuations
	// (Capabilities.Continuations: PostgreSQL, MariaDB/MySQL): the keys whose run in the last
	// batch (claimed under contToken) held MaxRunPerKey events and was acked whole, with the
	// run's first and last sequence. The next claim may lease such a key's following events
	// while that batch's marks are still being written, because the events before them are
	// this relay's own, already delivered (see the cont fragment of the PostgreSQL claim).
	contKeys   []string
	contAfter  []int64
	contFrom   []int64
	contStreak map[string]int // continued batches in a row, per key in contKeys
	contToken  string
	// contMarks is the marks of the batch contKeys continue (see leased.prev).
	contMarks *marks
	// contLeftOut: the last delivered batch left a key out of its continuations (see
	// continueRuns).
	contLeftOut bool

	// outages are the destinations found unavailable, by UnavailableError.Destination (see
	// outage.go); their topics are left out of claims but for one probe event at a time.
	outages map[string]*outage
	// retryDue is the earliest time (relay clock, UnixNano; 0 = none) at which an event this
	// relay failed is due again, so the relay polls then instead of after PollInterval.
	retryDue atomic.Int64

	// emit delivers a claimed batch: it emits messages while ctx lasts; the messages'
	// contexts derive from mctx, which outlives ctx by CloseTimeout at a stop (see deliver).
	emit   func(ctx, mctx context.Context, b []*item) bool
	ctx    context.Context
	cancel context.CancelFunc
	// deliveries is the parent of the message contexts: it ends CloseTimeout after ctx ends
	// (or as soon as the subscription's goroutine returns), not with ctx, so that a stop
	// lets the messages out finish (see SubscriberConfig.CloseTimeout). It keeps ctx's values.
	deliveries     context.Context
	stopDeliveries context.CancelFunc
	// marking is the previous batch's marks; nil before the first. Marks run while the next
	// batch is delivered and the one after it claimed: that batch's events stay leased (so no
	// claim takes them, nor a later event of their keys) until the marks land.
	marking *marks
	// next is the batch claimed while the current one was out (see poll), delivered next;
	// nil when none is. noPrefetch counts the next batches delivered without a claim beside
	// them (a claim beside the last one leased nothing while claimable keyed events waited:
	// their keys were held by the batch out, e.g. a few hot keys).
	next       *leased
	noPrefetch int
}

// marks is one batch's mark statement, written beside the delivery of the batches after it.
type marks struct {
	done chan struct{} // closed when the statement is over
	// unconfirmed holds the ordering keys of the batch whose acks the statement did not write
	// (it failed, or the lease had passed to another relay): the continuation events of those
	// keys (see leased.prev) are released instead of marked published, so they go out again
	// after the events before them. Written before done is closed.
	unconfirmed map[string]bool
}

// leased is a claimed batch from its claim to the end of its delivery. Its lease is renewed
// from the claim on (three times per LeaseDuration), so a batch claimed while the previous one
// is out keeps its lease while it waits.
type leased struct {
	token string
	items []*item
	// prev is the marks of the batch whose runs this claim continued (subscription.contKeys),
	// nil when it continued none: its continuation acks are written only once those marks
	// wrote the previous run's acks (see confirm, flusher).
	prev *marks
	// full: the claim leased a whole batch or stopped at its key scan bound, so more work is
	// likely waiting and the next batch is claimed while this one is out. held: every key
	// the claim's walk found is in the batch (a few hot keys), which holds no unordered
	// event, so a claim beside it would find nothing; their runs are continued after it.
	full, held bool
	// prefetched: claimed while the previous batch was out (its topics may have been paused
	// since).
	prefetched bool
	// bctx ends emitting (a stop, a lost lease); mctx ends the messages out (CloseTimeout
	// after a stop, a lost lease at once); lost ends both.
	bctx, mctx context.Context
	lost       func()
	fl         *flusher
	stopRenew  func()
}

func (s *Subscriber) newSubscription(ctx context.Context, topic string) (*subscription, error) {
	sel, err := s.selection(topic)
	if err != nil {
		return nil, err
	}
	// A missing or outdated table fails here, not in every claim or mark of the relay; a
	// lookup that fails (a database down) leaves the relay to wait it out as it does for any
	// outage.
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	err = checkTable(cctx, s.s, s.db)
	cancel()
	if errors.Is(err, ErrTableNotFound) || errors.Is(err, ErrTableOutdated) {
		return nil, err
	}
	sub := &subscription{s: s, sel: sel, oldest: s.cfg.BatchSize, walked: -1}
	if s.s.caps.Floors {
		sub.lows, sub.sweep = &keyLows{}, &sweeper{every: sweepInterval}
	}
	sub.relay = s.s.d.NewRelay(s.s.t, dialect.RelayConfig{BatchSize: s.cfg.BatchSize, MaxRunPerKey: s.cfg.MaxRunPerKey, KeyScan: s.cfg.KeyScan,
		LeaseDuration: s.cfg.LeaseDuration, MaxAttempts: s.cfg.MaxAttempts, RetryBase: s.cfg.RetryBase, RetryMax: s.cfg.RetryMax}, sel.dialect())
	sub.ctx, sub.cancel = context.WithCancel(ctx)
	sub.deliveries, sub.stopDeliveries = context.WithCancel(context.WithoutCancel(ctx))
	return sub, nil
}

// start runs the subscription's goroutines; it returns ErrClosed after Close.
func (sub *subscription) start(done func()) error {
	s := sub.s
	s.closeMu.RLock()
	defer s.closeMu.RUnlock()
	if s.closed {
		sub.cancel()
		sub.stopDeliveries()
		return ErrClosed
	}
	s.wg.Add(2)
	go func() {
		defer s.wg.Done()
		select {
		case <-s.closing:
		case <-sub.ctx.Done():
		}
		sub.cancel()
		// The stop: the messages out get CloseTimeout to be answered (see deliver).
		t := time.NewTimer(s.cfg.CloseTimeout)
		defer t.Stop()
		select {
		case <-t.C:
			s.logger.Info("outbox: close timeout; the messages still out are released", watermill.LogFields{"close_timeout": s.cfg.CloseTimeout.String()})
		case <-sub.deliveries.Done():
		}
		sub.stopDeliveries()
	}()
	go func() {
		defer s.wg.Done()
		defer done()
		defer sub.stopDeliveries()
		defer sub.cancel()
		sub.run()
	}()
	return nil
}

// waitMarks waits until the previous batch's marks are written.
func (sub *subscription) waitMarks() {
	if sub.marking != nil {
		<-sub.marking.done
	}
}

func (sub *subscription) run() {
	s := sub.s
	defer sub.waitMarks()
	defer sub.releaseNext()
	defer func() {
		// The subscription stops treating its destinations as unavailable: say so
		// (Hooks.OnOutage with Ended), or an observer's gauge stays up for good.
		now := time.Now()
		for _, o := range sub.outages {
			sub.outageHook(o, now)
		}
		sub.outages = nil
		sub.publishOutages()
	}()
	var wake <-chan struct{}
	if s.cfg.Wakeup != nil {
		wake = s.cfg.Wakeup.Listen(sub.ctx, sub.sel.match)
	}
	var probed <-chan struct{}
	if s.probe != nil {
		probed = s.probe.listen(sub.ctx)
	}
	sub.takeBack()
	if sw, ok := sub.relay.(dialect.Sweeper); ok && sub.sweep != nil {
		var wg sync.WaitGroup
		defer wg.Wait()
		wg.Add(1)
		go func() {
			defer wg.Done()
			sub.sweep.run(sub.ctx, sub, sw)
		}()
	}
	var (
		failures   int // polls failed in a row
		failedFrom time.Time
	)
	probeWoken := false // this poll was started by the wake probe
	for sub.ctx.Err() == nil {
		again, err := sub.poll()
		if probeWoken && err == nil {
			if again {
				s.probe.workedWake()
			} else {
				s.probe.emptyWake()
			}
		}
		probeWoken = false
		if err != nil {
			if sub.ctx.Err() != nil {
				return
			}
			failures++
			if failures == 1 {
				failedFrom = time.Now()
				s.logger.Error("outbox: poll failed; retrying with backoff", err, nil)
			} else {
				s.logger.Debug("outbox: poll failed again", watermill.LogFields{"error": err.Error(), "failures": failures})
			}
		} else if failures > 0 {
			s.logger.Info("outbox: database answers again; polling resumed", watermill.LogFields{
				"failed_polls": failures, "unavailable_for": time.Since(failedFrom).Round(time.Millisecond).String()})
			failures = 0
		}
		if again && err == nil {
			continue
		}
		wait := pollWait(s.cfg.PollInterval, sub.heldPolls)
		if failures > 0 {
			wait = pollRetryWait(failures, s.cfg.PollInterval)
		}
		now := time.Now()
		if due := sub.retryDue.Load(); due != 0 {
			if d := time.Unix(0, due).Sub(now); d < wait {
				wait = max(d, 0)
			}
		}
		if at := sub.nextProbeAt(now); !at.IsZero() && at.Sub(now) < wait {
			wait = max(at.Sub(now), 0)
		}
		timer := time.NewTimer(wait)
		select {
		case <-sub.ctx.Done():
		case <-timer.C:
			sub.woken = false
		case <-wake:
			sub.woken = true
		case <-probed:
			sub.woken, probeWoken = true, true
		}
		timer.Stop()
		if due := sub.retryDue.Load(); due != 0 && time.Now().UnixNano() >= due {
			sub.retryDue.CompareAndSwap(due, 0)
		}
	}
}

// pollWait is the wait after a poll that leased nothing, the held-th in a row whose claim
// found claimable keyed events of keys held elsewhere (0: not such a poll): PollInterval,
// doubled for each such poll up to heldWait (never less than PollInterval). A relay beside
// another that holds a few hot keys (their runs continued batch after batch) otherwise ran a
// claim every PollInterval that found nothing: with 10 hot keys, two relays and a 10 ms
// PollInterval, 70 of one relay's 188 claims leased nothing, at about 6k buffers each (the
// walk and the floors' candidates step over the other relay's leased events), CPU the relay
// holding the keys was short of on two cores. Events committed meanwhile still wake it
// (Wakeup), and a key the other relay leaves out (continueRuns) waits at most heldWait.
func pollWait(pollInterval time.Duration, held int) time.Duration {
	if held <= 0 || pollInterval >= heldWait {
		return pollInterval
	}
	return min(pollInterval<<min(held, 8), heldWait)
}

// heldWait bounds the backoff of pollWait.
const heldWait = 100 * time.Millisecond

// pollRetryWait is the wait after the n-th failed poll in a row: 100 ms doubling, at most
// maxPollRetryWait (and PollInterval), so that a relay claims within about half a second
// of the database accepting connections again.
func pollRetryWait(n int, pollInterval time.Duration) time.Duration {
	return min(100*time.Millisecond<<min(n-1, 10), maxPollRetryWait, pollInterval)
}

const maxPollRetryWait = 500 * time.Millisecond

// item is one claimed event on its way out.
type item struct {
	ev   *Event
	id   string // ev.ID's string form, computed once
	rank int64  // position in its key's run, 1 for the head; 0 for unordered
	cont bool   // leased as a continuation of the previous batch's run of its key
	// follow: the key was claimed below the keyed floor (a retry, or an event an operator took
	// back from the dead letters) or continued as such, so its later events lie below the floor
	// too: its run, acked whole, is continued like a full one (see continueRuns), since no walk
	// finds those events any more (PostgreSQL floors).
	follow bool
	// eager: claimed with eager locking, and so are its batch's marks (see eagerClaim).
	eager  bool
	msg    *message.Message
	hold   *errHolder
	cancel context.CancelFunc // cancels msg's context once it is answered
	state  int
	err    error
	perm   bool // a failure the destination called permanent: dead-lettered now
	// notAttempted: released because the destination never judged it (ErrNotAttempted)
	notAttempted bool
	// acked is set by the goroutine that sees the Ack, for the flusher (state is read only
	// once the batch is over); flushed is the flusher's (flushNone, flushWritten,
	// flushRefused), read by mark after the flusher stopped.
	acked   atomic.Bool
	flushed int
}

const (
	stateClaimed   = iota // not emitted
	stateAcked            // delivered
	stateFailed           // counts an attempt
	stateReleased         // lease given back, no attempt
	stateAbandoned        // emitted, no answer within CloseTimeout of a stop: released, no attempt
	// stateUnavailable: the destination was unavailable (ErrUnavailable); released with
	// last_error noted, no attempt
	stateUnavailable
)

// failed records a Nack's error: a failure, a permanent failure, an unavailable destination or
// a delivery not attempted (released).
func (it *item) failed(err error) {
	if err == nil {
		err = ErrNacked
	}
	it.err = err
	switch classify(err) {
	case classNotAttempted:
		it.state, it.notAttempted = stateReleased, true
	case classUnavailable:
		it.state = stateUnavailable
	case classPermanent:
		it.state, it.perm = stateFailed, true
	default:
		it.state = stateFailed
	}
}

// poll claims one batch (or takes the one claimed beside the previous batch), delivers it
// while it claims the next (at most one batch ahead, see prefetch), and starts writing its
// marks. It reports whether to poll again at once: events were claimed, or keys remain
// unexamined.
func (sub *subscription) poll() (again bool, err error) {
	s := sub.s
	b := sub.next
	sub.next = nil
	if b == nil {
		token := s.tokenPrefix + strconv.FormatInt(s.claims.Add(1), 10)
		if o := sub.dueProbe(time.Now()); o != nil {
			return sub.probe(token, o)
		}
		if sub.serialFor > 0 {
			sub.serialFor--
			sub.waitMarks()
		}
		inflight := false // the previous batch's marks are being written beside this claim
		if sub.marking != nil {
			select {
			case <-sub.marking.done:
			default:
				inflight = true
			}
		}
		splitting := sub.splitFor > 0 // before claim counts this claim off
		var more bool
		b, more, err = sub.claimLeased(token)
		if err == nil && b == nil && inflight {
			// The claim ran beside the previous batch's marks and leased nothing: poll again as
			// soon as they land, since the batch's keys may have more events waiting for them.
			// When the walk found such claimable keyed events and the batch held a few keys,
			// the next claims take the runs of half of those keys each (one half is claimed
			// while the other half's marks are written); with one key, or when that split was
			// already on (another relay holds the other half), they wait for the marks first
			// instead of claiming nothing beside them.
			sub.waitMarks()
			if sub.walked > 0 {
				switch n := sub.lastKeyCount; {
				case splitting:
					sub.splitFor, sub.serialFor = splitClaims, splitClaims
				case n > 1 && n <= maxHotKeys:
					sub.splitLimit, sub.splitFor = min(s.cfg.BatchSize, (n+1)/2*s.cfg.MaxRunPerKey), splitClaims
				case n == 1:
					sub.serialFor = splitClaims
				}
			}
			return true, nil
		}
		if err == nil && b == nil && sub.walked > 0 {
			sub.heldPolls++
		} else {
			sub.heldPolls = 0
		}
		if err != nil || b == nil {
			return more, err
		}
	}
	deliver := sub.deliverable(b)
	delivered := make(chan struct{})
	go func() {
		defer close(delivered)
		sub.deliver(b, deliver)
	}()
	if sub.mayPrefetch(b) {
		sub.next, err = sub.prefetch()
	}
	<-delivered
	sub.noteOutcomes(b.items, nil)
	sub.waitMarks()
	sub.confirm(b)
	sub.continueRuns(b.token, deliver)
	m := &marks{done: make(chan struct{})}
	sub.marking, sub.contMarks = m, m
	go func() {
		defer close(m.done)
		var err error
		m.unconfirmed, err = sub.mark(b.token, b.items)
		if err != nil {
			s.logger.Error("outbox: writing marks failed; the events are delivered again after their lease", err, watermill.LogFields{"token": b.token})
		}
	}()
	if err != nil && sub.ctx.Err() == nil {
		// The claim beside the batch failed: the poll loop backs off as after any failed claim.
		return true, err
	}
	return true, nil
}

// claimLeased claims a batch under token (see claim) and starts renewing its lease; nil when
// it leased nothing. It uses the continuations set by the last delivered batch.
func (sub *subscription) claimLeased(token string) (b *leased, more bool, err error) {
	var prev *marks
	if len(sub.contKeys) > 0 {
		prev = sub.contMarks
	}
	walkLimit := sub.oldest
	items, more, err := sub.claim(token)
	sub.contKeys, sub.contAfter, sub.contFrom = sub.contKeys[:0], sub.contAfter[:0], sub.contFrom[:0]
	if err != nil || len(items) == 0 {
		sub.contStreak = nil // the streaks ended: the next batch starts them over
		return nil, more, err
	}
	b = sub.lease(token, items, prev)
	b.full = more || len(items) >= sub.s.cfg.BatchSize
	keys := map[string]bool{}
	for _, it := range items {
		keys[it.ev.OrderingKey] = true
	}
	// The walk ended before its limit (it saw every claimable keyed event) and found no key
	// the batch does not hold.
	b.held = !keys[""] && sub.walked > 0 && sub.walked <= int64(len(keys)) && sub.walked < int64(walkLimit)
	return b, more, nil
}

// mayPrefetch reports whether to claim the next batch while b is out: b was full (a batch
// that was not full found the backlog drained; the poll after it claims what came meanwhile) and
// does not hold every key its claim's walk found (leased.held), the last batch left no key out
// of its continuations (that key is held by the marks being written; the claim after b takes
// it), no outage probe is due (it is claimed on its own, after b), no claim is to wait for
// marks (serialFor), and no claim beside a batch came back empty lately (noPrefetch).
func (sub *subscription) mayPrefetch(b *leased) bool {
	if !sub.s.s.caps.ClaimAhead {
		return false
	}
	if sub.noPrefetch > 0 {
		sub.noPrefetch--
		return false
	}
	return b.full && !b.held && !sub.contLeftOut && sub.serialFor == 0 && sub.ctx.Err() == nil && sub.dueProbe(time.Now()) == nil
}

// prefetch claims the next batch while the current one is out, beside the previous batch's
// marks. Per-key order needs nothing more: every claim leaves out the keys whose head is
// leased, so the keys of the batch out (and of the batch being marked) are not claimed again
// before their marks land — but for continuations, which follow a run acked whole (see
// contKeys; they continue the batch before the one out). A claim that leased nothing while
// claimable keyed events waited (their keys are the batch's out, e.g. a few hot keys) turns
// prefetching off for splitClaims batches: those keys are continued after the batch instead.
func (sub *subscription) prefetch() (*leased, error) {
	token := sub.s.tokenPrefix + strconv.FormatInt(sub.s.claims.Add(1), 10)
	marking := sub.marking
	if marking != nil {
		select {
		case <-marking.done:
			marking = nil
		default:
		}
	}
	b, _, err := sub.claimLeased(token)
	if err == nil && b == nil && marking != nil {
		// It ran beside the previous batch's marks and leased nothing (on MariaDB a claim
		// beside a mark may lock none of the rows it found, though the mark holds others):
		// claim again once they landed.
		<-marking.done
		token = sub.s.tokenPrefix + strconv.FormatInt(sub.s.claims.Add(1), 10)
		b, _, err = sub.claimLeased(token)
	}
	if err != nil {
		return nil, err
	}
	if b == nil {
		if sub.walked > 0 {
			sub.noPrefetch = splitClaims
		}
		return nil, nil
	}
	b.prefetched = true
	return b, nil
}

// releaseNext gives back the lease of a batch claimed ahead but not delivered (the
// subscription stops): its events are released with no attempt and no delivery start counted.
func (sub *subscription) releaseNext() {
	b := sub.next
	if b == nil {
		return
	}
	sub.next = nil
	b.stopRenew()
	b.lost()
	for _, it := range b.items {
		it.state = stateReleased
	}
	sub.waitMarks()
	if _, err := sub.mark(b.token, b.items); err != nil {
		sub.s.logger.Error("outbox: releasing a batch claimed ahead failed; it is claimed again after its lease", err, watermill.LogFields{"token": b.token})
	}
}

// lease starts renewing a claimed batch's lease and returns it, ready for deliver.
func (sub *subscription) lease(token string, items []*item, prev *marks) *leased {
	b := &leased{token: token, items: items, prev: prev, fl: sub.newFlusher(token)}
	var stopEmit, stopMsgs context.CancelFunc
	b.bctx, stopEmit = context.WithCancel(sub.ctx)
	b.mctx, stopMsgs = context.WithCancel(sub.deliveries)
	b.lost = func() { stopEmit(); stopMsgs() }
	b.stopRenew = sub.renewWhileOut(token, items, b.lost, b.fl)
	return b
}

// deliverable returns the events of a claimed batch to emit: each key's gap-free run from its
// head, without poison events (dropPoison) and, in a batch claimed ahead, without the events
// of topics paused since (dropPaused); the rest is released.
func (sub *subscription) deliverable(b *leased) []*item {
	deliver, release := splitRuns(b.items)
	for _, it := range release {
		it.state = stateReleased
	}
	deliver = sub.dropPoison(deliver)
	if b.prefetched {
		deliver = sub.dropPaused(deliver)
	}
	return deliver
}

// deliver emits a claimed batch's deliverable events while flushing its acks every
// MarkInterval; it returns when every emitted event was answered, or was left unanswered by a
// stop (after CloseTimeout) or a lost lease (at once), and ends the batch's lease renewal.
func (sub *subscription) deliver(b *leased, deliver []*item) {
	defer func() { b.stopRenew(); b.lost() }()
	if len(deliver) == 0 {
		return
	}
	b.fl.start(deliver, b.prev)
	sub.emit(b.bctx, b.mctx, deliver)
	b.fl.stop()
}

// probe delivers one event of an outage's topics (see outage.go) and writes its mark before
// returning. A probe that finds nothing to claim leaves the outage open (the topics' events
// may be held or leased elsewhere) and waits for the next probe.
func (sub *subscription) probe(token string, o *outage) (again bool, err error) {
	sub.waitMarks()
	items, err := sub.probeClaim(token, o)
	if err != nil {
		o.nextProbe = time.Now().Add(sub.probeWait(o, time.Now()))
		return false, err
	}
	b := sub.lease(token, items, nil)
	sub.deliver(b, sub.deliverable(b))
	sub.noteOutcomes(items, o)
	if _, err := sub.mark(token, items); err != nil {
		sub.s.logger.Error("outbox: writing marks failed; the events are delivered again after their lease", err, watermill.LogFields{"token": token})
	}
	// Poll at once when the outage ended; otherwise the ordinary claim of the other topics.
	return true, nil
}

// dropPoison takes out of deliver (in sequence order) the events whose deliveries started more
// than MaxDeliveryStarts times without an outcome — a relay stopped or crashed while delivering
// each time — and dead-letters them (ErrPoisonEvent); their keys' later events are released.
func (sub *subscription) dropPoison(deliver []*item) []*item {
	limit := sub.s.cfg.MaxDeliveryStarts
	var (
		out    []*item
		poison map[string]bool
	)
	for i, it := range deliver {
		k := it.ev.OrderingKey
		switch {
		case k != "" && poison[k]:
			it.state = stateReleased
		case it.ev.DeliveryStarts > limit:
			it.state, it.perm = stateFailed, true
			it.err = fmt.Errorf("%w: %d deliveries started without an outcome (SubscriberConfig.MaxDeliveryStarts %d)", ErrPoisonEvent, it.ev.DeliveryStarts-1, limit)
			if out == nil {
				out = append(make([]*item, 0, len(deliver)), deliver[:i]...)
			}
			if k != "" {
				if poison == nil {
					poison = map[string]bool{}
				}
				poison[k] = true
			}
			continue
		}
		if out != nil && it.state != stateReleased {
			out = append(out, it)
		}
	}
	if out == nil {
		return deliver
	}
	return out
}

// dropPaused takes out of deliver (in sequence order) the events of topics paused by an
// outage that opened after their batch was claimed ahead, and their keys' later events: they
// are released without an attempt, as if the claim had left them out.
func (sub *subscription) dropPaused(deliver []*item) []*item {
	if len(sub.outages) == 0 {
		return deliver
	}
	paused := map[string]bool{}
	for _, t := range sub.pausedTopics(time.Now()) {
		paused[t] = true
	}
	if len(paused) == 0 {
		return deliver
	}
	out := deliver[:0:0]
	held := map[string]bool{}
	for _, it := range deliver {
		k := it.ev.OrderingKey
		if paused[it.ev.Topic] || (k != "" && held[k]) {
			it.state = stateReleased
			if k != "" {
				held[k] = true
			}
			continue
		}
		out = append(out, it)
	}
	return out
}

// noteRetry records that an event this relay failed is due again at next (now and next
// from the mark's clock), so that run polls then. Safe for concurrent use.
func (sub *subscription) noteRetry(now, next time.Time) {
	due := time.Now().Add(next.Sub(now)).UnixNano()
	for {
		cur := sub.retryDue.Load()
		if (cur != 0 && cur <= due) || sub.retryDue.CompareAndSwap(cur, due) {
			return
		}
	}
}

// confirm releases, instead of marking published, b's acked continuation events (see
// leased.prev) whose keys' previous events the marks they follow did not write as published:
// publishing them would put them before those events, which go out again after their lease
// (at least once, in order).
func (sub *subscription) confirm(b *leased) {
	if b.prev == nil {
		return
	}
	<-b.prev.done
	if len(b.prev.unconfirmed) == 0 {
		return
	}
	for _, it := range b.items {
		if it.cont && it.state == stateAcked && b.prev.unconfirmed[it.ev.OrderingKey] {
			it.state = stateReleased
		}
	}
}

// continueRuns sets the next claim's continuations from a delivered batch: every ordering
// key whose run held MaxRunPerKey events, or was followed (item.follow), all acked
// (Capabilities.Continuations: PostgreSQL and MariaDB/MySQL; SQLite's single writer needs none).
// A key continued contRounds batches in a row is left out once (one key per batch, never a
// batch's only key, never a followed key): its next run goes to whichever relay claims it first
// after this batch's marks, so that several relays end up sharing a few hot keys instead of
// the first one keeping them all.
func (sub *subscription) continueRuns(token string, deliver []*item) {
	// Continuations no claim used (the batch delivered now was claimed ahead, and no claim
	// ran after the batch they continue): a followed key's are lost with them.
	for i, k := range sub.contKeys {
		if sub.contFollow[k] {
			sub.refindFrom(sub.contAfter[i] + 1)
		}
	}
	sub.contKeys, sub.contAfter, sub.contFrom, sub.contToken = sub.contKeys[:0], sub.contAfter[:0], sub.contFrom[:0], token
	sub.contFollow, sub.contLeftOut = nil, false
	if !sub.s.s.caps.Continuations || sub.ctx.Err() != nil {
		return
	}
	type run struct {
		n                 int
		first, last, miss int64 // miss: the first event not acked (0: the run was acked whole)
		follow            bool
	}
	runs := map[string]*run{}
	var order []string
	for _, it := range deliver { // in sequence order
		k := it.ev.OrderingKey
		if k == "" {
			continue
		}
		r := runs[k]
		if r == nil {
			r = &run{first: it.ev.Sequence}
			runs[k] = r
			order = append(order, k)
		}
		r.n++
		r.last = it.ev.Sequence
		if it.state != stateAcked && r.miss == 0 {
			r.miss = it.ev.Sequence
		}
		r.follow = r.follow || it.follow
	}
	rounds := make(map[string]int, len(order))
	dropped := false
	for _, k := range order {
		r := runs[k]
		if r.miss > 0 && r.follow {
			// Not continued: the event not acked and the key's events after it lie below the
			// floor. One that failed is found by the retry scan when due, and the rest wait for
			// it; one released without an attempt (an outage, a stop) has no next_attempt_at.
			sub.refindFrom(r.miss)
		}
		if r.miss == 0 && (r.n >= sub.s.cfg.MaxRunPerKey || r.follow) {
			n := sub.contStreak[k] + 1
			if n > contRounds && !dropped && len(order) > 1 && !r.follow {
				dropped, sub.contLeftOut = true, true
				continue
			}
			rounds[k] = n
			sub.contKeys = append(sub.contKeys, k)
			sub.contAfter = append(sub.contAfter, r.last)
			sub.contFrom = append(sub.contFrom, r.first)
			if r.follow {
				if sub.contFollow == nil {
					sub.contFollow = map[string]bool{}
				}
				sub.contFollow[k] = true
			}
		}
	}
	sub.contStreak = rounds
}

// refindFrom has the next claim lower the keyed floor to seq (see refind) when the
// subscription has floors. A followed key (item.follow) lies below the keyed floor, where only
// its continuation finds its events once its run is delivered (the floor moved past them while
// they waited for a retrying or dead-lettered event); when that continuation is lost (a run not
// acked whole, continuations no claim used, a claim that did not lease them), the floor goes
// back to the key's next event instead of leaving it to the sweep (sweepInterval). The claim
// after that walks from there once (the entries of events published since), and the floor then
// stays at the key's first pending event until it is published.
func (sub *subscription) refindFrom(seq int64) {
	if sub.sweep != nil && seq > 0 && (sub.refind == 0 || seq < sub.refind) {
		sub.refind = seq
	}
}

// contRounds is how many batches in a row a key may be continued before it is left out once
// (see continueRuns). Measured with 10 hot keys and two relays (BenchmarkDrain): 4 let the keys
// spread over both relays; without it the first relay kept all ten and the second only polled.
const contRounds = 4

// maxKeyScanBackoff is the most claims in a row that leave out the key skip scan after it found
// no head of a key the relay does not know (see subscription.keyScanIn).
const maxKeyScanBackoff = 16

// lowClaims is how many full batches in a row may start their scans at the lows (see
// subscription.lowUnordered) before a claim scans from the start again.
const lowClaims = 16

// advanceLows sets the next claim's scan starts after a claim that leased items.
func (sub *subscription) advanceLows(items []*item) {
	if len(items) < sub.s.cfg.BatchSize || sub.lowAge >= lowClaims {
		sub.lowUnordered, sub.lowKeyed, sub.lowAge = 0, 0, 0
		return
	}
	sub.lowAge++
	var u, k int64
	for _, it := range items { // in sequence order
		switch {
		case it.ev.OrderingKey == "" && u == 0:
			u = it.ev.Sequence
		case it.ev.OrderingKey != "" && k == 0:
			k = it.ev.Sequence
		}
	}
	if u > 0 {
		sub.lowUnordered = u
	}
	if k > 0 {
		sub.lowKeyed = k
	}
}

// splitClaims is how many claims cap keyed events at the runs of half the last batch's keys
// (renewed while capped claims fill up with long runs) or wait for the marks first, once a
// claim beside the marks found their keys all still leased; then the relay tries whole
// batches again. maxHotKeys is the most keys a batch may hold for that: with more keys, other
// keys are claimable beside the marks.
const (
	splitClaims = 16
	maxHotKeys  = 64
)

// splitRuns keeps, for each ordering key, only the run that starts at the key's head with no
// gap (a run member skipped by SKIP LOCKED or changed concurrently breaks the run); the rest is
// released. Items are in sequence order.
func splitRuns(items []*item) (deliver, release []*item) {
	next := map[string]int64{}
	broken := map[string]bool{}
	for _, it := range items {
		k := it.ev.OrderingKey
		if k == "" {
			deliver = append(deliver, it)
			continue
		}
		want, ok := next[k]
		if !ok {
			want = 1
		}
		if broken[k] || it.rank != want {
			broken[k] = true
			release = append(release, it)
			continue
		}
		next[k] = want + 1
		deliver = append(deliver, it)
	}
	return deliver, release
}

// maxEagerFullRun bounds eager locking while a relay drains a backlog: after this many claims
// in a row that leased a whole batch, claims (and their marks) wait through SQLite's busy
// handler like the writers until a claim leases less than a batch. A relay claiming back to
// back and retrying for the lock every 250 µs would otherwise take it at every turn from
// writers sleeping up to 100 ms in the busy handler.
const maxEagerFullRun = 4

// eagerClaim reports whether the next claim, and its batch's marks, take SQLite's write lock
// eagerly (ClaimParams.Eager): while the subscription's waits end with wakeup signals (writers
// are committing; set by the poll loop, cleared by a wait that ran out), within
// maxEagerFullRun whole batches in a row. A subscription without a Wakeup never is. The marks
// follow their batch's claim (item.eager), not the claims made beside them.
func (sub *subscription) eagerClaim() bool {
	switch dialect.SQLiteEager.Load() {
	case dialect.EagerFirstAfterWake:
		w := sub.woken
		sub.woken = false
		return w
	case dialect.EagerNever:
		return false
	}
	return sub.woken && sub.fullRun < maxEagerFullRun
}

// claim leases the next batch, leaving the topics of outages out. more reports that the key
// skip scan stopped at its KeyScan bound, so keys after the cursor are still unexamined and the
// next poll should not wait.
func (sub *subscription) claim(token string) (items []*item, more bool, err error) {
	s := sub.s
	began := time.Now()
	sub.walked = -1
	p := &dialect.ClaimParams{Token: token, Limit: s.cfg.BatchSize, SizeHint: min(s.cfg.BatchSize, max(16, sub.lastClaimed)), Oldest: sub.oldest, Cursor: sub.cursor,
		LowUnordered: sub.lowUnordered, LowKeyed: sub.lowKeyed, ContToken: sub.contToken, Paused: sub.pausedTopics(began)}
	if sub.sweep != nil {
		sub.fl.Lower(sub.sweep.take())
		sub.fl.Lower(sub.refind, 0)
		sub.refind = 0
		p.LowKeyed, p.LowUnordered, p.KeyLows = sub.fl.Keyed, sub.fl.Unordered, sub.lows.params()
		if p.NoKeyScan = sub.keyScanIn > 0; p.NoKeyScan {
			sub.keyScanIn--
		}
	}
	if sub.splitFor > 0 {
		p.Limit = sub.splitLimit
	}
	for i, k := range sub.contKeys {
		p.Cont = append(p.Cont, dialect.Continuation{Key: k, From: sub.contFrom[i], After: sub.contAfter[i]})
	}
	follow := sub.contFollow
	p.Eager = sub.eagerClaim()
	// A claim after one that leased less than a whole batch reads first (SQLite): it may well
	// find nothing, and then it never takes the write lock. Idle relays polling through the
	// busy handler otherwise queue with the writers for the lock at every poll (50 relays at
	// a 20 ms poll starved publishers past their 10 s busy timeout in watermill's universal
	// suite).
	p.ReadFirst = sub.fullRun == 0 && !dialect.SQLiteNoReadFirst.Load()
	res, err := sub.relay.Claim(sub.ctx, s.db, p)
	if err != nil {
		sub.lostFollowed(p.Cont, follow, nil)
		return nil, false, fmt.Errorf("outbox: claim from %s: %w", s.s.table, err)
	}
	if len(res.Events) >= p.Limit {
		sub.fullRun++
	} else {
		sub.fullRun = 0
	}
	sub.walked = res.Walked
	sub.lastClaimed = len(res.Events)
	items = sub.itemsOf(res.Events)
	for _, it := range items {
		it.eager = p.Eager
	}
	cursor, scanned := res.Cursor, res.Scanned
	sort.Slice(items, func(i, j int) bool { return items[i].ev.Sequence < items[j].ev.Sequence })
	if len(sub.contKeys) > 0 {
		// The claim reads continuation keys' runs only after their previous events, never
		// through the walk or the key scan.
		cont := make(map[string]bool, len(sub.contKeys))
		for _, k := range sub.contKeys {
			cont[k] = true
		}
		for _, it := range items {
			it.cont = cont[it.ev.OrderingKey]
		}
		sub.lostFollowed(p.Cont, follow, items)
	}
	keys, keyed := map[string]struct{}{}, 0
	for _, it := range items {
		if it.ev.OrderingKey != "" {
			keys[it.ev.OrderingKey] = struct{}{}
			keyed++
		}
	}
	switch {
	case len(items) >= s.cfg.BatchSize || (len(items) > 0 && sub.splitFor > 0):
		sub.oldest = min(s.cfg.BatchSize, max(2*len(keys), 16))
	case len(items) == 0 && sub.walked > 0:
		// Claimable keyed events whose keys are held (by this relay's marks or another
		// relay): keep the walk short, for a shorter claim and fewer locks in the way of
		// the relay that holds them.
		sub.oldest = min(s.cfg.BatchSize, max(2*sub.lastKeyCount, 16))
	case len(items) > 0:
		// Grow the walk step by step, not at once: its row locks are what a concurrent
		// relay's runs skip, so a walk of BatchSize rows after one short batch (short
		// because of that relay) shortened that relay's batches in turn.
		sub.oldest = min(s.cfg.BatchSize, 2*sub.oldest)
	}
	if len(items) > 0 {
		sub.lastKeyCount = len(keys)
	}
	if res.Floors != nil && sub.sweep != nil {
		if !p.NoKeyScan && res.Scanned != nil && *res.Scanned > 0 {
			if res.Floors.ScanHeads > 0 {
				sub.keyScanEvery = 0
			} else {
				sub.keyScanEvery = min(max(2*sub.keyScanEvery, 1), maxKeyScanBackoff)
			}
			sub.keyScanIn = sub.keyScanEvery
		}
		now := time.Now()
		sub.fl.Update(res.Floors, now)
		if ll, ok := sub.relay.(dialect.LockLooker); ok && sub.fl.LookAtLocks(now) {
			// xmin waits for a transaction that may not be the outbox's (see FloorTracker).
			if holders, err := ll.LockHolders(sub.ctx, s.db); err == nil {
				sub.fl.CheckLocks(holders, now)
			} else {
				s.logger.Debug("outbox: reading the table's lock holders failed", watermill.LogFields{"error": err.Error()})
			}
		}
		s.logger.Trace("outbox: claim floors", watermill.LogFields{"keyed": sub.fl.Keyed, "unordered": sub.fl.Unordered, "xmin": res.Floors.Xmin})
		sub.sweep.keyed.Store(sub.fl.Keyed)
		sub.sweep.unordered.Store(sub.fl.Unordered)
		for _, it := range items {
			k := it.ev.OrderingKey
			it.follow = k != "" && (it.ev.Sequence < p.LowKeyed || (it.cont && follow[k]))
		}
	} else {
		sub.advanceLows(items)
	}
	if sub.splitFor > 0 {
		sub.splitFor--
		// Still a few hot keys filling the capped claim with long runs (at least half of
		// MaxRunPerKey on average): keep splitting. Many short runs end the split.
		if keyed >= sub.splitLimit && 2*keyed >= len(keys)*s.cfg.MaxRunPerKey {
			sub.splitFor = splitClaims
		}
	}
	rankRuns(items)
	if sub.lows != nil {
		sub.lows.note(items)
	}
	// Resume the key skip scan after the last key it reached; start over once it reached the
	// end of the keys.
	switch {
	case p.NoKeyScan: // the cursor waits for the next skip scan
	case scanned != nil && *scanned >= int64(s.cfg.KeyScan) && cursor != nil:
		sub.cursor, more = *cursor, true
	default:
		sub.cursor = ""
	}
	fields := watermill.LogFields{"events": len(items), "token": token, "duration": time.Since(began), "walked": res.Walked, "key_scan": !p.NoKeyScan}
	if res.Scanned != nil {
		fields["keys_scanned"] = *res.Scanned
	}
	s.logger.Trace("outbox: claimed", fields)
	if h := s.cfg.Hooks.OnClaim; h != nil {
		h(ClaimInfo{Events: len(items), Duration: time.Since(began)})
	}
	return items, more, nil
}

// lostFollowed notes the followed continuations of conts (follow: contFollow when the claim
// began) that the claim's items (in sequence order) do not continue: the key had no event
// left, or its next run could not be leased yet (the marks before it had not landed and its
// lease was short, or another relay holds it). See refindFrom.
func (sub *subscription) lostFollowed(conts []dialect.Continuation, follow map[string]bool, items []*item) {
	for _, c := range conts {
		if follow[c.Key] && !slices.ContainsFunc(items, func(it *item) bool { return it.cont && it.ev.OrderingKey == c.Key }) {
			sub.refindFrom(c.After + 1)
		}
	}
}

// probeClaim leases one event of o's topics (the oldest claimable, in key order like any
// claim), or none.
func (sub *subscription) probeClaim(token string, o *outage) ([]*item, error) {
	began := time.Now()
	topics := make([]string, 0, len(o.topics))
	for t := range o.topics {
		topics = append(topics, t)
	}
	// The oldest 16 keyed events are walked for the one event leased.
	res, err := sub.relay.Claim(sub.ctx, sub.s.db, &dialect.ClaimParams{Token: token, Limit: 1, Oldest: 16, Probe: topics})
	if err != nil {
		return nil, fmt.Errorf("outbox: probe claim from %s: %w", sub.s.s.table, err)
	}
	items := sub.itemsOf(res.Events)
	if h := sub.s.cfg.Hooks.OnClaim; h != nil {
		h(ClaimInfo{Events: len(items), Duration: time.Since(began), Probe: true})
	}
	rankRuns(items)
	return items, nil
}

// rankRuns ranks the events of a claim that leases only gap-free runs without reporting ranks
// (SQLite: one writer, no SKIP LOCKED gaps): 1 for a key's head, then 2, 3 … Items are in
// sequence order.
func rankRuns(items []*item) {
	ranks := map[string]int64{}
	for _, it := range items {
		if it.rank >= 0 {
			continue
		}
		it.rank = 0
		if k := it.ev.OrderingKey; k != "" {
			ranks[k]++
			it.rank = ranks[k]
		}
	}
}

// itemsOf returns the items of a claim's leased events.
func (sub *subscription) itemsOf(evs []dialect.Claimed) []*item {
	items := make([]*item, 0, len(evs))
	for _, c := range evs {
		ev := Event{Sequence: c.Sequence, Topic: c.Topic, Payload: c.Payload, CreatedAt: c.CreatedAt, Attempts: c.Attempts,
			DeliveryStarts: c.DeliveryStarts, OrderingKey: deref(c.OrderingKey), LastError: deref(c.LastError)}
		ev.ID, _ = uuid.Parse(c.ID)
		switch c.Headers {
		case "{}":
			// No headers (the column's default): nothing to decode.
			ev.Headers = map[string]string{}
		case "null":
			// JSON null decodes to no map, as json.Unmarshal would.
		default:
			if err := json.Unmarshal([]byte(c.Headers), &ev.Headers); err != nil {
				ev.Headers = map[string]string{"outbox-headers-error": err.Error()}
			}
		}
		if len(c.Extra) > 0 {
			ev.Extra = make(map[string]any, len(c.Extra))
			for i, col := range sub.s.s.cfg.ExtraColumns {
				ev.Extra[col.Name] = c.Extra[i]
			}
		}
		items = append(items, &item{ev: &ev, id: ev.ID.String(), rank: c.Rank})
	}
	return items
}

// newMessage builds the Watermill message of an event.
func (sub *subscription) newMessage(ctx context.Context, it *item) *message.Message {
	ev := it.ev
	msg := message.NewMessage(it.id, ev.Payload)
	for k, v := range ev.Headers {
		msg.Metadata[k] = v
	}
	msg.Metadata[MetadataEventID] = it.id
	msg.Metadata[MetadataTopic] = ev.Topic
	if ev.OrderingKey != "" {
		msg.Metadata[MetadataOrderingKey] = ev.OrderingKey
	}
	msg.Metadata[MetadataSequence] = strconv.FormatInt(ev.Sequence, 10)
	msg.Metadata[MetadataAttempt] = strconv.Itoa(ev.Attempts + max(ev.DeliveryStarts, 1))
	it.hold = &errHolder{}
	mctx, cancel := context.WithCancel(&eventContext{Context: ctx, ev: ev, hold: it.hold})
	msg.SetContext(mctx)
	it.msg, it.cancel = msg, cancel
	return msg
}

// await waits for msg's answer and records it in it; mctx ending (CloseTimeout after a stop,
// or a lost lease) leaves it unanswered (stateAbandoned). The DeliveryTimeout ends with timeout
// (a batch's, shared) or expire (one message's timer); the other is nil.
func (sub *subscription) await(mctx context.Context, it *item, timeout <-chan struct{}, expire <-chan time.Time) {
	defer it.cancel()
	select {
	case <-it.msg.Acked():
		it.state = stateAcked
		it.acked.Store(true)
	case <-it.msg.Nacked():
		it.failed(it.hold.get())
	case <-timeout:
		sub.timedOut(it)
	case <-expire:
		sub.timedOut(it)
	case <-mctx.Done():
		// An answer given before the stop counts, whichever the select saw first.
		select {
		case <-it.msg.Acked():
			it.state = stateAcked
			it.acked.Store(true)
		case <-it.msg.Nacked():
			it.failed(it.hold.get())
		default:
			it.state = stateAbandoned
		}
	}
	stopped := mctx.Err() != nil // CloseTimeout after a stop, or a lost lease
	if it.state == stateFailed && !it.perm && (sub.ctx.Err() != nil || stopped) &&
		(errors.Is(it.err, context.Canceled) || stopped && errors.Is(it.err, ErrNacked)) {
		// The relay is stopping and the delivery failed because its context was canceled by
		// that stop (a handler that returned ctx.Err() under a Router without RecordError is
		// a bare Nack): the destination did not judge the event, so no attempt is counted
		// (it is released and delivered again).
		it.state, it.err = stateReleased, nil
	}
}

// timedOut records that it's DeliveryTimeout passed unanswered.
func (sub *subscription) timedOut(it *item) {
	it.state, it.err = stateFailed, ErrDeliveryTimeout
	if sub.ctx.Err() != nil {
		// The DeliveryTimeout passed while the relay waits for its stop (CloseTimeout):
		// the stop, not the destination, ends the delivery; no attempt is counted.
		it.state, it.err = stateAbandoned, nil
	}
}

// lane is one ordering key's run (or one unordered event): delivered one after another.
type lane struct {
	items []*item
	pos   int
}

// deliverEach emits items one message at a time: each lane's next item only after the previous
// was acked, up to Concurrency messages out at once. It returns false if it stopped early.
func (sub *subscription) deliverEach(ctx, mctx context.Context, items []*item, out chan<- *message.Message) bool {
	var lanes []*lane
	byKey := map[string]*lane{}
	laneOf := make(map[*item]*lane, len(items))
	for _, it := range items {
		k := it.ev.OrderingKey
		l := byKey[k]
		if l == nil || k == "" {
			l = &lane{}
			lanes = append(lanes, l)
			if k != "" {
				byKey[k] = l
			}
		}
		l.items = append(l.items, it)
		laneOf[it] = l
	}
	ready := make([]*lane, len(lanes))
	copy(ready, lanes)
	results := make(chan *item, len(items))
	inflight, stopped := 0, false
	var downTopics map[string]bool
	for {
		for !stopped && inflight < sub.s.cfg.Concurrency && len(ready) > 0 {
			l := ready[0]
			ready = ready[1:]
			if ctx.Err() != nil {
				// Stopped (closing, or the lease was lost): a select with a reader waiting
				// would pick the send half of the time.
				stopped = true
				continue
			}
			it := l.items[l.pos]
			if downTopics[it.ev.Topic] {
				continue // released below, with the rest of its lane
			}
			msg := sub.newMessage(mctx, it)
			select {
			case out <- msg:
			case <-ctx.Done():
				stopped = true
				continue
			}
			inflight++
			// A timer, not a context.WithTimeout: one allocation less per message.
			timer := time.NewTimer(sub.s.cfg.DeliveryTimeout)
			go func() {
				sub.await(mctx, it, nil, timer.C)
				timer.Stop()
				results <- it
			}()
		}
		if inflight == 0 {
			break
		}
		it := <-results
		inflight--
		l := laneOf[it]
		switch it.state {
		case stateAcked:
			l.pos++
			if l.pos < len(l.items) {
				ready = append(ready, l)
			}
		case stateFailed, stateUnavailable:
			for _, rest := range l.items[l.pos+1:] {
				rest.state = stateReleased
			}
			if it.state == stateUnavailable {
				// The rest of the batch's events of this topic stay unsent: released
				// without an attempt, like the refused one.
				if downTopics == nil {
					downTopics = map[string]bool{}
				}
				downTopics[it.ev.Topic] = true
			}
		}
	}
	for _, it := range items {
		if it.state == stateClaimed {
			it.state = stateReleased
		}
	}
	return !stopped
}

// deliverBatch emits the whole batch at once and waits for every answer.
func (sub *subscription) deliverBatch(ctx, mctx context.Context, items []*item, out chan<- Batch) bool {
	b := Batch{Messages: make([]*message.Message, len(items))}
	for i, it := range items {
		b.Messages[i] = sub.newMessage(mctx, it)
	}
	release := func() bool {
		for _, it := range items {
			it.state = stateReleased
		}
		return false
	}
	if ctx.Err() != nil {
		return release()
	}
	select {
	case out <- b:
	case <-ctx.Done():
		return release()
	}
	tctx, cancel := context.WithTimeout(context.Background(), sub.s.cfg.DeliveryTimeout)
	defer cancel()
	var wg sync.WaitGroup
	for _, it := range items {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sub.await(mctx, it, tctx.Done(), nil)
		}()
	}
	wg.Wait()
	failedKey := map[string]bool{}
	for _, it := range items {
		k := it.ev.OrderingKey
		if k == "" {
			continue
		}
		if it.state == stateAbandoned {
			// Unanswered at the stop: it is released and delivered again, so nothing of its
			// key after it may be recorded as published.
			failedKey[k] = true
			continue
		}
		if failedKey[k] {
			// Even when the destination acked it: marking it published would put it before
			// the failed event it follows. It is delivered again after that one (at least
			// once, in order).
			it.state, it.err = stateReleased, nil
			continue
		}
		if it.state == stateFailed || it.state == stateUnavailable || it.state == stateReleased {
			// Released: not attempted (ErrNotAttempted, or cut short by a stop).
			failedKey[k] = true
		}
	}
	return ctx.Err() == nil
}

// renewWhileOut renews the batch's lease three times per LeaseDuration until the returned
// function is called (from its claim to the end of its delivery). When a renewal finds the lease no longer held (it expired and another
// relay took the events over), it calls lost, which stops emitting the rest of the batch.
func (sub *subscription) renewWhileOut(token string, items []*item, lost func(), fl *flusher) (stop func()) {
	s := sub.s
	seqs := make([]int64, len(items))
	for i, it := range items {
		seqs[i] = it.ev.Sequence
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(s.cfg.LeaseDuration / 3)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				ctx, cancel := context.WithTimeout(context.Background(), s.cfg.LeaseDuration/3)
				// Rows whose acks the flusher wrote are no longer leased: expect the rest.
				fl.mu.Lock()
				n, err := sub.relay.Renew(ctx, s.db, token, seqs)
				want := int64(len(seqs) - fl.written)
				fl.mu.Unlock()
				cancel()
				switch {
				case err != nil:
					s.logger.Error("outbox: lease renewal failed", err, watermill.LogFields{"token": token})
				case n < want:
					lost()
					s.logger.Error("outbox: lease lost; the rest of the batch is left to the relay that took it over", nil,
						watermill.LogFields{"token": token, "held": n, "claimed": len(seqs)})
					if h := s.cfg.Hooks.OnLeaseLost; h != nil {
						h(LeaseLostInfo{Token: token, Events: int(want - n)})
					}
					return
				}
			}
		}
	}()
	return func() { close(done); wg.Wait() }
}

// markSets is one mark statement's input: the sequences of each outcome, in parallel with
// their per-event values (failed: errs, perm, jitters; unavailable: notes).
type markSets struct {
	acked, released, unavailable, failed []int64
	abandoned                            []int64 // unanswered at a stop: released, the start uncounted
	notes, errs                          []string
	keep                                 []bool // per unavailable: keep delivery_starts (not attempted)
	perm                                 []bool
	jitters                              []float64
	eager                                bool // the batch was claimed eagerly (see eagerClaim)
}

// errText is the last_error form of err: valid UTF-8 without NUL (PostgreSQL text refuses it).
func errText(err error) string {
	return strings.ToValidUTF8(strings.ReplaceAll(err.Error(), "\x00", "\uFFFD"), "\uFFFD")
}

// mark writes the batch's outcome in one statement, conditioned on the fencing token: acks
// become published, failures a retry with backoff or a dead letter, releases give the lease
// back, unavailable events are released with last_error noted and no attempt counted. Acks
// already written by the flusher (see flushAcks) are skipped. It runs even while the
// subscriber is closing. unconfirmed holds the ordering keys of acks that were not written.
func (sub *subscription) mark(token string, items []*item) (unconfirmed map[string]bool, err error) {
	var (
		m     markSets
		byseq = map[int64]*item{}
	)
	m.eager = len(items) > 0 && items[0].eager
	for _, it := range items {
		seq := it.ev.Sequence
		switch it.state {
		case stateAcked:
			if it.flushed == flushWritten {
				continue
			}
			if it.flushed == flushRefused {
				if k := it.ev.OrderingKey; k != "" {
					if unconfirmed == nil {
						unconfirmed = map[string]bool{}
					}
					unconfirmed[k] = true
				}
				continue
			}
			m.acked = append(m.acked, seq)
		case stateReleased:
			if it.notAttempted && it.err != nil && sub.ctx.Err() == nil {
				// Not attempted outside a stop (a dropped connection): released with
				// last_error noted and its start kept, so an event that always ends so (it
				// kills its connection) is dead-lettered by MaxDeliveryStarts instead of
				// being sent again without end and without backoff.
				m.unavailable = append(m.unavailable, seq)
				m.notes = append(m.notes, errText(it.err))
				m.keep = append(m.keep, true)
				break
			}
			m.released = append(m.released, seq)
		case stateUnavailable:
			m.unavailable = append(m.unavailable, seq)
			m.notes = append(m.notes, errText(it.err))
			m.keep = append(m.keep, false)
		case stateFailed:
			m.failed = append(m.failed, seq)
			m.errs = append(m.errs, errText(it.err))
			m.perm = append(m.perm, it.perm)
			m.jitters = append(m.jitters, 0.9+0.2*rand.Float64())
		case stateAbandoned:
			m.abandoned = append(m.abandoned, seq)
			continue
		default:
			continue
		}
		byseq[seq] = it
	}
	if len(byseq) == 0 && len(m.abandoned) == 0 {
		return unconfirmed, nil
	}
	results, err := sub.writeMarks(token, m)
	// The keys whose acks were not written: every key of the batch when the statement failed.
	written := make(map[int64]bool, len(results))
	if err == nil {
		for _, r := range results {
			written[r.Seq] = true
		}
	}
	for _, seq := range m.acked {
		if k := byseq[seq].ev.OrderingKey; k != "" && !written[seq] {
			if unconfirmed == nil {
				unconfirmed = map[string]bool{}
			}
			unconfirmed[k] = true
		}
	}
	if err != nil {
		return unconfirmed, fmt.Errorf("outbox: mark batch %s: %w", token, err)
	}
	if sub.lows != nil {
		sub.lows.noteWritten(items, func(it *item) bool {
			return it.state == stateAcked && (it.flushed == flushWritten || written[it.ev.Sequence])
		})
	}
	sub.leaseLost(token, len(byseq)-len(results))
	sub.reportMarks(results, byseq, false)
	return unconfirmed, nil
}

// writeMarks runs the dialect's mark statement with a 30 s bound, also while closing.
func (sub *subscription) writeMarks(token string, m markSets) (results []markResult, err error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(sub.ctx), 30*time.Second)
	defer cancel()
	began := time.Now()
	results, err = sub.relay.Mark(ctx, sub.s.db, &dialect.MarkParams{Token: token, Acked: m.acked, Released: m.released,
		Unavailable: m.unavailable, Failed: m.failed, Abandoned: m.abandoned, Notes: m.notes, Errs: m.errs, Keep: m.keep,
		Perm: m.perm, Jitters: m.jitters, Eager: m.eager})
	if h := sub.s.cfg.Hooks.OnMark; h != nil {
		h(MarkInfo{Events: len(m.acked) + len(m.released) + len(m.unavailable) + len(m.failed), Duration: time.Since(began), Err: err})
	}
	return results, err
}

// leaseLost reports, once per batch, events whose marks the fencing refused: their lease had
// passed to another relay (it expired while they were out), which delivers them again.
func (sub *subscription) leaseLost(token string, n int) {
	if n == 0 {
		return
	}
	sub.s.logWarn(fmt.Sprintf("outbox: lease lost: %d events were taken over by another relay; their outcome here was not recorded", n), ErrLeaseLost,
		watermill.LogFields{"token": token, "events": n})
	if h := sub.s.cfg.Hooks.OnLeaseLost; h != nil {
		h(LeaseLostInfo{Token: token, Events: n})
	}
}

// reportMarks logs and calls the hooks for the rows a mark wrote; it runs after the
// connection went back to the pool. ackOnly: the rows are a flush's acks (whose items' state
// belongs to the delivering goroutines until the batch is over).
func (sub *subscription) reportMarks(results []markResult, byseq map[int64]*item, ackOnly bool) {
	s := sub.s
	for _, r := range results {
		it := byseq[r.Seq]
		ev := it.ev
		state := stateAcked
		if !ackOnly {
			state = it.state
		}
		switch state {
		case stateAcked:
			s.logger.Debug("outbox: delivered", watermill.LogFields{"event_id": it.id, "topic": ev.Topic})
			if h := s.cfg.Hooks.OnDelivered; h != nil {
				h(DeliveredInfo{EventID: it.id, Topic: ev.Topic, Attempts: r.Attempts + 1, Delay: r.Now.Sub(ev.CreatedAt)})
			}
		case stateFailed:
			derr := &DeliveryError{EventID: ev.ID.String(), Topic: ev.Topic, Err: it.err}
			info := FailedInfo{EventID: ev.ID.String(), Topic: ev.Topic, Attempts: r.Attempts, Err: derr, At: r.Now}
			fields := watermill.LogFields{"event_id": ev.ID.String(), "topic": ev.Topic, "attempts": r.Attempts}
			// The log line gives the event and topic as fields: its error is the cause alone
			// (derr would repeat them).
			logErr := error(derr)
			if it.err != nil {
				logErr = it.err
			}
			if r.Dead {
				if it.perm {
					fields["permanent"] = true
				}
				s.logger.Error("outbox: dead-lettered", logErr, fields)
				if h := s.cfg.Hooks.OnDeadLettered; h != nil {
					h(info)
				}
				continue
			}
			if r.Next != nil {
				info.NextAttemptAt = *r.Next
				fields["next_attempt_at"] = *r.Next
				sub.noteRetry(r.Now, *r.Next)
			}
			s.logWarn("outbox: delivery failed, will retry", logErr, fields)
			if h := s.cfg.Hooks.OnFailed; h != nil {
				h(info)
			}
		}
	}
}

// markResult is one row a mark wrote: the event's attempts and, for a failure, when it is tried
// next or whether it was dead-lettered, with the clock the mark used.
type markResult = dialect.MarkResult

// WarnLogger is an optional extension of watermill.LoggerAdapter (which has no WARN level in
// v1.5): a logger given to NewSubscriber that implements it receives failed deliveries at
// WARN. Other loggers receive them at Info with the field severity=WARN.
type WarnLogger interface {
	Warn(msg string, err error, fields watermill.LogFields)
}

func (s *Subscriber) logWarn(msg string, err error, fields watermill.LogFields) {
	if s.warn != nil {
		s.warn(msg, err, fields)
		return
	}
	f := fields.Copy()
	f["severity"] = "WARN"
	f["error"] = err.Error()
	s.logger.Info(msg, f)
}
