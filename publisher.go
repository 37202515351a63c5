package outbox

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
)

// DefaultMaxOrderingKeysPerCall is PublisherConfig.MaxOrderingKeysPerCall's default.
const DefaultMaxOrderingKeysPerCall = 1000

// PublisherConfig configures a Publisher. The zero value is valid: the default table, ordering
// and idempotency keys only from message metadata.
type PublisherConfig struct {
	// Schema names the outbox table; it must match the table's Migrate config.
	Schema SchemaConfig
	// OrderingKey, when set, gives the ordering key of a message that has none in its metadata
	// (SetOrderingKey). Returning "" means unordered. It must be safe for concurrent use.
	OrderingKey func(topic string, msg *message.Message) string
	// IdempotencyKey, when set, gives the idempotency key of a message that has none in its
	// metadata (SetIdempotencyKey). Returning "" means none.
	IdempotencyKey func(topic string, msg *message.Message) string
	// MaxOrderingKeysPerCall caps the distinct ordering keys of one Publish/Enqueue call, and
	// on PostgreSQL its distinct ordering keys and idempotency keys together (an idempotency
	// key is locked too, so that concurrent transactions writing it wait for each other
	// instead of failing). Each key holds one slot of PostgreSQL's shared lock table until
	// COMMIT (about 7.8k slots with default settings), so a call over the cap is refused with a
	// *ValidationError before any SQL. The cap is per call: a transaction that publishes many calls with fresh keys should
	// stay well below the lock table's size. Zero means DefaultMaxOrderingKeysPerCall (1000);
	// negative is a configuration error.
	MaxOrderingKeysPerCall int
	// OnInserted, when set, is called after a Publish/Enqueue call inserted events, with the
	// distinct topics of the events it inserted (duplicates of an idempotency key excluded).
	// Inside a transaction the events are not committed yet: it is the hook for sending
	// wakeup signals after COMMIT (package wakeup collects them and sends them once the
	// transaction committed). It runs synchronously; it must be fast.
	OnInserted func(topics []string)
	// NotifyChannel, when set, makes every insert statement also run
	// pg_notify(NotifyChannel, topic) once per distinct topic it inserted, inside the writer's
	// transaction (PostgreSQL delivers at COMMIT, drops on ROLLBACK, folds duplicates). The
	// payload is the topic, or "" when the topic is longer than MaxNotifyTopicBytes (a
	// listener then wakes every relay). Exact, but every notifying COMMIT holds PostgreSQL's
	// cluster-wide notify-queue lock through its WAL flush, which cuts concurrent write
	// throughput; package wakeup's after-commit notifier is the default for that reason.
	// At most 63 bytes (a PostgreSQL identifier).
	NotifyChannel string
	// InjectHeaders, when set, is called for each event with the context of its write (the
	// message's Context() for Publish and PublishEvents, ctx for Enqueue and EnqueueMany) and
	// a set function that adds a header unless the event already has it; package tracing's
	// InjectHeaders stores the caller's trace context (traceparent/tracestate) this way. The
	// headers are validated like the others. It must be safe for concurrent use and fast.
	InjectHeaders func(ctx context.Context, set func(key, value string))
	// OnWrite, when set, is called once at the end of every Publish, PublishEvents, Enqueue
	// and EnqueueMany call that was given at least one event, with its outcome (WriteInfo);
	// package metrics' Observer.OnWrite counts written events, validation errors by field and
	// the call's duration with it. Inside a transaction the events are not committed yet.
	// It runs synchronously on the caller's goroutine; it must be safe for concurrent use and
	// fast.
	OnWrite func(WriteInfo)
}

// WriteInfo is the outcome of one Publisher call, for PublisherConfig.OnWrite.
type WriteInfo struct {
	// Events are the stored events in input order (Duplicate set for an idempotency key that
	// already existed); nil when Err is set.
	Events []Event
	// Duration is the call's time from its start to its return: validation, header
	// injection, the insert statement(s) and, for EnqueueMany in a transaction, its savepoint.
	Duration time.Duration
	// Err is the call's error: nil, a *ValidationError (nothing was written; errors.As gives
	// the Field), or a database error.
	Err error
}

// MaxNotifyTopicBytes is the longest topic sent as a NOTIFY payload (PostgreSQL's limit is
// 8000 bytes); a longer topic is sent as "" (wake every relay).
const MaxNotifyTopicBytes = 255 * 4

func (c *PublisherConfig) setDefaults() {
	if c.MaxOrderingKeysPerCall == 0 {
		c.MaxOrderingKeysPerCall = DefaultMaxOrderingKeysPerCall
	}
}

// Validate returns a *ConfigError naming the first invalid field, or nil.
func (c PublisherConfig) Validate() error {
	if err := c.validateOwn(); err != nil {
		return err
	}
	return c.Schema.Validate()
}

// validateOwn checks the fields other than Schema.
func (c PublisherConfig) validateOwn() error {
	if c.MaxOrderingKeysPerCall < 0 {
		return &ConfigError{Field: "PublisherConfig.MaxOrderingKeysPerCall", Reason: "must not be negative"}
	}
	if len(c.NotifyChannel) > 63 || strings.ContainsRune(c.NotifyChannel, 0) {
		return &ConfigError{Field: "PublisherConfig.NotifyChannel", Reason: "at most 63 bytes, no NUL"}
	}
	return nil
}

// plainSchema is a SchemaConfig without extra columns or a scope (comparable): the key of
// compiled schemas that NewPublisher reuses.
type plainSchema struct {
	table       string
	payloadType PayloadType
	dialect     Dialect
	fillFactor  int
}

// publisherSchemas caches compiled plain schemas (plainSchema -> *schema; a compiled schema is
// never written after compile): one Publisher per transaction is the normal use, and
// compiling the same config for each was a measurable share of a write's client CPU.
var publisherSchemas sync.Map

// publisherSchema returns c compiled, reusing an earlier compilation of a plain config.
func publisherSchema(c SchemaConfig) (*schema, error) {
	if len(c.ExtraColumns) > 0 || len(c.IdempotencyScope) > 0 {
		return c.compile()
	}
	key := plainSchema{c.Table, c.PayloadType, c.Dialect, c.FillFactor}
	if s, ok := publisherSchemas.Load(key); ok {
		return s.(*schema), nil
	}
	s, err := c.compile()
	if err != nil {
		return nil, err
	}
	publisherSchemas.Store(key, s)
	return s, nil
}

// Publisher is a Watermill message.Publisher that writes each message as a row of the outbox
// table through the database handle it was built with. With a transaction (pgx.Tx, *sql.Tx or a
// watermill-sql Tx) the events commit with the caller's COMMIT and vanish with its ROLLBACK;
// with a pool or DB they commit at once.
//
// A Publisher is as safe for concurrent use as its handle: over a pool or *sql.DB yes; over a
// transaction no (a transaction runs one statement at a time). Construction is cheap: one
// Publisher per transaction is the normal use.
//
// Writers that put several ordering keys in one transaction take a per-key lock for each: two
// transactions that take the same keys in opposite orders can deadlock, so publish
// shortly before COMMIT, or take keys in one order.
type Publisher struct {
	ex     execer
	s      *schema
	cfg    PublisherConfig
	logger watermill.LoggerAdapter
}

// NewPublisher returns a Publisher writing through db: a pgx.Tx, *pgx.Conn or *pgxpool.Pool, a
// *sql.Tx, *sql.DB or *sql.Conn (pgx stdlib driver), or a watermill-sql v4 ContextExecutor
// (TxFromPgx, TxFromStdSQL); for DialectSQLite and DialectMySQL a *sql.Tx, *sql.DB or
// *sql.Conn of their driver (NotifyChannel is then a *ConfigError: they have no LISTEN/NOTIFY). A nil logger means watermill.NopLogger. Errors: a *ConfigError for
// an invalid config, a dialect whose package the program does not import (see DialectSQLite),
// or an unsupported handle (ErrUnsupportedDB). It runs no SQL.
func NewPublisher(db any, cfg PublisherConfig, logger watermill.LoggerAdapter) (*Publisher, error) {
	cfg.setDefaults()
	if err := cfg.validateOwn(); err != nil {
		return nil, err
	}
	s, err := publisherSchema(cfg.Schema)
	if err != nil {
		return nil, err
	}
	if !s.caps.Notify && cfg.NotifyChannel != "" {
		return nil, &ConfigError{Field: "PublisherConfig.NotifyChannel", Reason: s.caps.Title + " has no LISTEN/NOTIFY: use an in-process wakeup (OnInserted) instead"}
	}
	if err := checkHandle(db, cfg.Schema.Dialect); err != nil {
		return nil, err
	}
	ex, err := newExecer(db)
	if err != nil {
		return nil, err
	}
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	return &Publisher{ex: ex, s: s, cfg: cfg, logger: logger}, nil
}

// Publish writes msgs as events of topic in one statement, in the given order (consecutive
// sequences unless another writer interleaves). The context is the first message's. A message
// whose idempotency key is already stored is skipped without error. Errors: a *ValidationError
// (before any SQL: the caller's transaction stays usable), or the database error wrapped with
// context — which, inside a transaction, aborts it on PostgreSQL: an event id that is already
// stored (give a re-published message a new id, e.g. with NewMessage), or an extra-column
// value the column type refuses. EnqueueMany runs in a savepoint instead. On MariaDB/MySQL
// such an error aborts only the statement (the transaction stays usable), except a deadlock
// (error 1213), after which InnoDB has rolled the whole transaction back. In REPEATABLE READ
// or SERIALIZABLE transactions a concurrent insert of the same idempotency key fails with a
// serialization error (SQLSTATE 40001): retry the transaction.
func (p *Publisher) Publish(topic string, msgs ...*message.Message) error {
	if len(msgs) == 0 {
		return nil
	}
	ctx := context.Background()
	if msgs[0] != nil {
		ctx = msgs[0].Context()
	}
	_, err := p.publish(ctx, topic, msgs, p.cfg.OnWrite != nil)
	return err
}

// PublishEvents is Publish with an explicit context, returning the stored event of each message
// in input order: Duplicate is set, with the stored event's id and columns, for a message whose
// idempotency key already existed.
func (p *Publisher) PublishEvents(ctx context.Context, topic string, msgs ...*message.Message) ([]Event, error) {
	return p.publish(ctx, topic, msgs, true)
}

// publish is PublishEvents; without events (Publish, no OnWrite) it returns no events, and
// a write without idempotency keys then reads nothing back from the database.
func (p *Publisher) publish(ctx context.Context, topic string, msgs []*message.Message, events bool) (evs []Event, err error) {
	if len(msgs) == 0 {
		return nil, nil
	}
	if p.cfg.OnWrite != nil {
		defer p.onWrite(time.Now(), &evs, &err)
	}
	rows := make([]row, len(msgs))
	for i, msg := range msgs {
		r, err := p.rowFromMessage(i, topic, msg)
		if err != nil {
			return nil, err
		}
		rows[i] = r
	}
	return p.insert(ctx, rows, events)
}

// Enqueue writes one event whose payload is encoded with EncodePayload's rules. It returns the
// stored event (Duplicate set when the idempotency key already existed). Errors as EnqueueMany.
func (p *Publisher) Enqueue(ctx context.Context, in EventInput) (Event, error) {
	evs, err := p.EnqueueMany(ctx, []EventInput{in})
	if err != nil {
		return Event{}, err
	}
	return evs[0], nil
}

// EnqueueMany writes events in one statement and returns them in input order; for an
// idempotency key that already exists it returns the stored event with Duplicate set. Inside a
// transaction the statement runs in a savepoint, so a database error (another unique violation,
// a constraint of an extra column) leaves the caller's transaction usable. Errors: a
// *ValidationError before any SQL, or the database error wrapped with context.
func (p *Publisher) EnqueueMany(ctx context.Context, ins []EventInput) (evs []Event, err error) {
	if p.cfg.OnWrite != nil && len(ins) > 0 {
		defer p.onWrite(time.Now(), &evs, &err)
	}
	rows := make([]row, len(ins))
	for i, in := range ins {
		in.Headers = p.injectHeaders(ctx, in.Headers)
		r, err := p.rowFromInput(i, in)
		if err != nil {
			return nil, err
		}
		rows[i] = r
	}
	if len(rows) == 0 {
		return nil, nil
	}
	if !p.ex.InTx() {
		return p.insert(ctx, rows, true)
	}
	if _, err := p.ex.Exec(ctx, "SAVEPOINT outbox_enqueue"); err != nil {
		return nil, fmt.Errorf("outbox: savepoint: %w", err)
	}
	evs, err = p.insert(ctx, rows, true)
	if err != nil {
		if _, rbErr := p.ex.Exec(context.WithoutCancel(ctx), "ROLLBACK TO SAVEPOINT outbox_enqueue"); rbErr != nil {
			return nil, errors.Join(err, fmt.Errorf("outbox: rollback to savepoint: %w", rbErr))
		}
		return nil, err
	}
	if _, err := p.ex.Exec(ctx, "RELEASE SAVEPOINT outbox_enqueue"); err != nil {
		return nil, fmt.Errorf("outbox: release savepoint: %w", err)
	}
	return evs, nil
}

// onWrite calls PublisherConfig.OnWrite with a call's outcome.
func (p *Publisher) onWrite(start time.Time, evs *[]Event, err *error) {
	p.cfg.OnWrite(WriteInfo{Events: *evs, Duration: time.Since(start), Err: *err})
}

// Close does nothing and returns nil: the Publisher owns no resources (the handle is the
// caller's). It satisfies message.Publisher.
func (p *Publisher) Close() error { return nil }

// injectHeaders returns headers with those of PublisherConfig.InjectHeaders added (on a copy:
// the caller's map is never written).
func (p *Publisher) injectHeaders(ctx context.Context, headers map[string]string) map[string]string {
	if p.cfg.InjectHeaders == nil {
		return headers
	}
	copied := false
	p.cfg.InjectHeaders(ctx, func(k, v string) {
		if _, ok := headers[k]; ok {
			return
		}
		if !copied {
			headers, copied = maps.Clone(headers), true
			if headers == nil {
				headers = map[string]string{}
			}
		}
		headers[k] = v
	})
	return headers
}
