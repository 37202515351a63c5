package outbox

import (
	"context"
	cryptorand "crypto/rand"
	"encoding/hex"
	"errors"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/watermill-outbox/outbox/internal/dialect"
	"github.com/watermill-outbox/outbox/internal/engine"
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
	db     execer // the operations' handle (Backlog, RetryDeadLettered …); the relay's too
	s      *schema
	cfg    SubscriberConfig
	excl   []topicFilter
	logger watermill.LoggerAdapter
	relay  *engine.Relay
}

// NewSubscriber returns a Subscriber reading the outbox table through db: a *pgxpool.Pool,
// *sql.DB (pgx stdlib driver) or a watermill-sql v4 Beginner (BeginnerFromPgx over a pool,
// BeginnerFromStdSQL); for DialectSQLite a *sql.DB of a SQLite driver opened with SQLiteDSN
// (relays in several processes may share the file: each claim is one write transaction); for
// DialectMySQL a *sql.DB of github.com/go-sql-driver/mysql. A
// *pgx.Conn is refused (it runs one statement at a time). A transaction is refused: the relay
// runs each statement on its own. A nil logger means watermill.NopLogger. DialectSQLite and
// DialectMySQL need their package imported (outbox/sqlite, outbox/mysql). Errors: a
// *ConfigError for an invalid config or handle, or a dialect whose package is not imported.
// It runs no SQL.
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
	sub := &Subscriber{db: ex, s: s, cfg: cfg, excl: excl, logger: logger.With(scope)}
	p := engine.Params{DB: ex, ProbeDB: probeEx, Dialect: s.d, Table: s.t, Quoted: s.table,
		TokenPrefix: cfg.RelayName + "#" + hex.EncodeToString(nonce[:]) + "#",
		Host: engine.Host{Event: eventOf(s), Message: newMessage, Classify: classify, Unavailable: unavailableDestination,
			DeliveryError: func(id, topic string, err error) error { return &DeliveryError{EventID: id, Topic: topic, Err: err} }},
		Hooks: cfg.Hooks.engine(), Logger: sub.logger}
	if w, ok := logger.(WarnLogger); ok {
		p.Warn = func(msg string, err error, fields watermill.LogFields) { w.Warn(msg, err, scope.Add(fields)) }
	}
	sub.relay = engine.New(cfg.engine(), p)
	return sub
}

// Subscribe returns the messages of the topics that topic selects: an exact name, a prefix
// pattern ending in '*' ("library.*"), or "*" for every topic, minus
// SubscriberConfig.ExcludeTopics. '_' and '%' are ordinary characters. The channel is closed
// when ctx ends or the Subscriber closes. Each message must be acked or nacked; see Subscriber
// for what each means. Errors: a *ConfigError for a bad pattern, a *TableNotFoundError when
// the outbox table does not exist (run Migrate), ErrClosed after Close.
func (s *Subscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	sel, err := s.subscription(ctx, topic)
	if err != nil {
		return nil, err
	}
	out := make(chan *message.Message)
	if err := s.relay.Subscribe(ctx, sel, out, func() { close(out) }); err != nil {
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
	sel, err := s.subscription(ctx, topic)
	if err != nil {
		return nil, err
	}
	out := make(chan Batch)
	send := func(ctx context.Context, msgs []*message.Message) bool {
		select {
		case out <- Batch{Messages: msgs}:
			return true
		case <-ctx.Done():
			return false
		}
	}
	if err := s.relay.SubscribeBatches(ctx, sel, send, func() { close(out) }); err != nil {
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
	s.relay.Close()
	return nil
}

func (s *Subscriber) selection(topic string) (topicSelection, error) {
	inc, err := parseTopicPattern("topic", topic)
	if err != nil {
		return topicSelection{}, err
	}
	return topicSelection{include: inc, excludes: s.excl}, nil
}

// subscription returns the engine's selection of topic, after checking the table: a missing or
// outdated table fails here, not in every claim or mark of the relay; a lookup that fails (a
// database down) leaves the relay to wait it out as it does for any outage.
func (s *Subscriber) subscription(ctx context.Context, topic string) (engine.Selection, error) {
	sel, err := s.selection(topic)
	if err != nil {
		return engine.Selection{}, err
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	err = checkTable(cctx, s.s, s.db)
	cancel()
	if errors.Is(err, ErrTableNotFound) || errors.Is(err, ErrTableOutdated) {
		return engine.Selection{}, err
	}
	return engine.Selection{Dialect: sel.dialect(), Match: sel.match}, nil
}

// WarnLogger is an optional extension of watermill.LoggerAdapter (which has no WARN level in
// v1.5): a logger given to NewSubscriber that implements it receives failed deliveries at
// WARN. Other loggers receive them at Info with the field severity=WARN.
type WarnLogger interface {
	Warn(msg string, err error, fields watermill.LogFields)
}
