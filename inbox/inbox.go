package inbox

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/watermill-outbox/outbox"
)

// Defaults of Config.
const (
	// DefaultMaxRetries is Config.MaxRetries' default.
	DefaultMaxRetries = 5
	// DefaultRetryBase is Config.RetryBase's default.
	DefaultRetryBase = 10 * time.Millisecond
	// DefaultRetryMax is Config.RetryMax's default.
	DefaultRetryMax = time.Second
	// MaxKeyLength is the longest dedup key (and Consumer) the inbox table holds, in bytes.
	MaxKeyLength = 255
)

// ErrNoKey is returned (wrapped) for a message whose dedup key is empty (Config.Key returned ""
// or msg.UUID is empty): it cannot be recorded, so it is not processed.
var ErrNoKey = errors.New("outbox inbox: message has no dedup key")

// ErrNoTopic is returned (wrapped) when the handler returned messages but neither
// Config.PublishTopic nor Config.Topic names their outbox topic. The transaction is rolled back.
var ErrNoTopic = errors.New("outbox inbox: no outbox topic for the handler's messages")

// HandlerFunc processes one message inside the inbox transaction tx (pgx.Tx or *sql.Tx, per
// the DB). Its writes through tx commit together with the inbox record and with the returned
// messages, which are written to the outbox table in the same transaction (Config.PublishTopic
// or Config.Topic names their topic). msg.Context() carries tx too (TxFromContext). Returning an
// error rolls everything back and nacks the message. It must not commit or roll back tx.
type HandlerFunc[T any] func(msg *message.Message, tx T) ([]*message.Message, error)

// Config configures an Inbox. Consumer is required; every other zero field means its default.
type Config struct {
	// Schema names the inbox table; it must match the table's Migrate config. Its Dialect is
	// also the outbox table's: set Outbox.Schema.Dialect the same.
	Schema SchemaConfig
	// Consumer names the consuming service or handler: the first half of the inbox key, so
	// several consumers of one message each process it once. 1..255 bytes of valid UTF-8
	// without NUL; required.
	Consumer string
	// Key returns a message's dedup key (1..255 bytes of valid UTF-8 without NUL); nil means msg.UUID. KeyFromMetadata
	// reads a metadata field; package inbox/kafkakey builds "topic/partition/offset" from
	// watermill-kafka's context. It must be safe for concurrent use; an error or "" nacks the
	// message (ErrNoKey).
	Key func(msg *message.Message) (string, error)
	// Outbox configures the outbox Publisher that writes the handler's returned messages into
	// the outbox table, in the inbox transaction. Its Schema.Dialect must be Schema.Dialect.
	Outbox outbox.PublisherConfig
	// PublishTopic is the outbox topic of the handler's returned messages; Topic, when set,
	// chooses per message instead. With neither, a handler that returns messages fails with
	// ErrNoTopic. A topic the outbox would refuse (invalid UTF-8, a NUL, more than
	// outbox.MaxTextLength characters) is a configuration error.
	PublishTopic string
	// Topic, when set, gives the outbox topic of each returned message (consecutive messages
	// of one topic go in one INSERT). Returning "" fails with ErrNoTopic. It must be safe for
	// concurrent use.
	Topic func(msg *message.Message) string
	// MaxRetries is how many times a transaction that failed with a serialization failure or a
	// deadlock (SQLSTATE 40001 / 40P01) is run again, handler included, before the message is
	// nacked. Default DefaultMaxRetries (5); negative is a configuration error.
	MaxRetries int
	// RetryBase is the wait before the first rerun; the n-th waits min(RetryBase·2^(n-1),
	// RetryMax) with ±50 % jitter (so concurrent losers do not collide again). Default
	// DefaultRetryBase (10ms); negative is a configuration error.
	RetryBase time.Duration
	// RetryMax caps the wait between reruns. Default DefaultRetryMax (1s), or RetryBase when
	// that is longer; a non-zero value below RetryBase is a configuration error.
	RetryMax time.Duration
}

func (c *Config) setDefaults() {
	if c.MaxRetries == 0 {
		c.MaxRetries = DefaultMaxRetries
	}
	if c.RetryBase == 0 {
		c.RetryBase = DefaultRetryBase
	}
	if c.RetryMax == 0 {
		c.RetryMax = max(DefaultRetryMax, c.RetryBase)
	}
}

// Validate returns an *outbox.ConfigError naming the first invalid field, or nil. Zero fields
// other than Consumer are valid (defaults).
func (c Config) Validate() error {
	bad := func(field, reason string) error {
		return &outbox.ConfigError{Field: "inbox.Config." + field, Reason: reason}
	}
	switch {
	case c.Consumer == "":
		return bad("Consumer", "required: name the consuming service or handler")
	case len(c.Consumer) > MaxKeyLength:
		return bad("Consumer", fmt.Sprintf("%d bytes: at most %d", len(c.Consumer), MaxKeyLength))
	case textProblem(c.Consumer) != "":
		return bad("Consumer", textProblem(c.Consumer))
	case c.PublishTopic != "" && textProblem(c.PublishTopic) != "":
		return bad("PublishTopic", textProblem(c.PublishTopic))
	case utf8.RuneCountInString(c.PublishTopic) > outbox.MaxTextLength:
		return bad("PublishTopic", fmt.Sprintf("%d characters: at most %d", utf8.RuneCountInString(c.PublishTopic), outbox.MaxTextLength))
	case c.MaxRetries < 0:
		return bad("MaxRetries", "must not be negative")
	case c.RetryBase < 0:
		return bad("RetryBase", "must not be negative")
	case c.RetryMax < 0:
		return bad("RetryMax", "must not be negative")
	case c.RetryMax != 0 && c.RetryMax < c.RetryBase:
		return bad("RetryMax", "must be at least RetryBase")
	case c.Outbox.Schema.Dialect != c.Schema.Dialect:
		return bad("Outbox.Schema.Dialect", fmt.Sprintf("%s, but the inbox table's dialect is %s: both tables are written in one transaction", c.Outbox.Schema.Dialect, c.Schema.Dialect))
	}
	if err := c.Schema.Validate(); err != nil {
		return err
	}
	return c.Outbox.Validate()
}

// Stats counts what an Inbox did since it was built.
type Stats struct {
	// Processed counts messages whose transaction committed with the handler's work.
	Processed uint64
	// Duplicates counts messages skipped because their key was recorded already.
	Duplicates uint64
	// Retries counts transactions run again after a serialization failure or deadlock.
	Retries uint64
	// Failed counts messages that returned an error (rolled back, nacked).
	Failed uint64
}

// Inbox runs consume → process → produce in one transaction per message: the inbox record
// (consumer, key), the handler's own writes and the handler's returned messages (written to the
// outbox table) commit together or not at all, so a redelivered message changes nothing. Use
// Handler (a Watermill no-publisher handler) or Middleware (around an ordinary Watermill
// handler) with a Router; the router acks after the commit and nacks on an error.
//
// Two concurrent deliveries of one message: the second's insert of the inbox row waits for the
// first's transaction, then skips (it committed) or processes (it rolled back). Transactions
// that fail with a serialization failure or deadlock are run again (Config.MaxRetries).
//
// An Inbox is safe for concurrent use.
type Inbox[T any] struct {
	db     DB[T]
	cfg    Config
	s      *schema
	logger watermill.LoggerAdapter

	processed, duplicates, retries, failed atomic.Uint64
}

// New returns an Inbox over db (FromPgx or FromSQL). A nil logger means watermill.NopLogger.
// Errors: an *outbox.ConfigError for an invalid config, a zero DB, or a DB whose driver is of
// another dialect than cfg.Schema.Dialect. It runs no SQL: create the tables with Migrate and
// outbox.Migrate.
func New[T any](db DB[T], cfg Config, logger watermill.LoggerAdapter) (*Inbox[T], error) {
	if db.start == nil {
		return nil, &outbox.ConfigError{Field: "db", Reason: "zero DB: build it with inbox.FromPgx or inbox.FromSQL", Err: outbox.ErrUnsupportedDB}
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	if db.driver != "" && db.driver != cfg.Schema.Dialect.String() {
		return nil, &outbox.ConfigError{Field: "inbox.Config.Schema.Dialect", Reason: fmt.Sprintf("the database is %s but the dialect is %s", db.driver, cfg.Schema.Dialect), Err: outbox.ErrUnsupportedDB}
	}
	s, err := cfg.Schema.compile()
	if err != nil {
		return nil, err
	}
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	return &Inbox[T]{db: db, cfg: cfg, s: s, logger: logger.With(watermill.LogFields{"inbox": s.table, "consumer": cfg.Consumer})}, nil
}

// Stats returns the counters so far. Safe for concurrent use.
func (in *Inbox[T]) Stats() Stats {
	return Stats{Processed: in.processed.Load(), Duplicates: in.duplicates.Load(), Retries: in.retries.Load(), Failed: in.failed.Load()}
}

// Handler returns a Watermill no-publisher handler (Router.AddConsumerHandler) that runs h for
// every message in the inbox transaction. It returns nil (the router acks) after the commit,
// also for a duplicate, and the error (the router nacks) after a rollback.
func (in *Inbox[T]) Handler(h HandlerFunc[T]) message.NoPublishHandlerFunc {
	return func(msg *message.Message) error {
		_, err := in.Process(msg, h)
		return err
	}
}

// Middleware is a Watermill handler middleware that runs the handler it wraps in the inbox
// transaction: the handler finds the transaction with TxFromContext[T](msg.Context()), and
// the messages it returns are written to the outbox table in that transaction instead of
// being published by the router (the wrapped handler returns none to the router). Put it
// innermost, after retry middlewares, so each attempt is one transaction.
func (in *Inbox[T]) Middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		_, err := in.Process(msg, func(m *message.Message, _ T) ([]*message.Message, error) { return h(m) })
		return nil, err
	}
}

// Result tells what Process did with a message.
type Result int

const (
	// ResultProcessed: the handler ran and its transaction committed.
	ResultProcessed Result = iota + 1
	// ResultDuplicate: the message's key was recorded already; nothing else was written.
	ResultDuplicate
)

// Process runs h for msg in one transaction as Handler does, and tells whether it processed the
// message or skipped a duplicate. The transaction's context is msg.Context() (with the
// transaction added for h). Errors: ErrNoKey or ErrNoTopic (wrapped), an *outbox.ValidationError
// for a returned message the outbox refuses, h's error, or the database error; after any error
// nothing of the message was committed.
func (in *Inbox[T]) Process(msg *message.Message, h HandlerFunc[T]) (Result, error) {
	res, err := in.process(msg, h)
	if err != nil {
		in.failed.Add(1)
	}
	return res, err
}

func (in *Inbox[T]) process(msg *message.Message, h HandlerFunc[T]) (Result, error) {
	key, err := in.key(msg)
	if err != nil {
		return 0, err
	}
	base := msg.Context()
	// Every return (a panic in the handler included) gives the message its own context back,
	// without the ended transaction.
	defer msg.SetContext(base)
	var topic *string
	if t := message.SubscribeTopicFromCtx(base); t != "" && len(t) <= MaxKeyLength {
		topic = &t
	}
	for attempt := 0; ; attempt++ {
		res, err := in.attempt(base, msg, key, topic, h)
		if err == nil || !retryable(err) || attempt >= in.cfg.MaxRetries {
			return res, err
		}
		in.retries.Add(1)
		wait := backoff(in.cfg.RetryBase, in.cfg.RetryMax, attempt)
		in.logger.Debug("inbox transaction failed with a serialization failure or deadlock, running it again", watermill.LogFields{"message_id": key, "attempt": attempt + 1, "wait": wait, "err": err})
		select {
		case <-base.Done():
			return 0, errors.Join(err, base.Err())
		case <-time.After(wait):
		}
	}
}

// attempt runs one transaction for msg.
func (in *Inbox[T]) attempt(ctx context.Context, msg *message.Message, key string, topic *string, h HandlerFunc[T]) (res Result, err error) {
	args := in.s.d.insertArgs([]any{in.cfg.Consumer, key, topic})
	tx, n, err := in.db.start(ctx, in.s.insertSQL, args)
	if err != nil {
		return 0, fmt.Errorf("outbox inbox: begin and record message %q in %s: %w", key, in.s.table, err)
	}
	done := false
	defer func() {
		if !done {
			// The commits set done first, so a transaction already ended here was ended by the
			// handler itself (HandlerFunc must not commit or roll back tx): if it committed, the
			// message is recorded and its redelivery will be skipped, so say so.
			switch rbErr := in.db.abort(context.WithoutCancel(ctx), tx); {
			case isTxDone(rbErr):
				err = errors.Join(err, errors.New("outbox inbox: the handler ended the inbox transaction itself (a HandlerFunc must not commit or roll back tx): whether the message was recorded is unknown"))
			case rbErr != nil:
				err = errors.Join(err, fmt.Errorf("outbox inbox: rollback: %w", rbErr))
			}
		}
	}()
	if n == 0 {
		done = true
		if err := in.db.commit(context.WithoutCancel(ctx), tx); err != nil {
			return 0, fmt.Errorf("outbox inbox: commit: %w", err)
		}
		in.duplicates.Add(1)
		in.logger.Debug("inbox: message processed already, skipped", watermill.LogFields{"message_id": key})
		return ResultDuplicate, nil
	}
	msg.SetContext(withTx(ctx, tx))
	out, err := h(msg, tx)
	if err != nil {
		return 0, err
	}
	if len(out) > 0 {
		if err := in.publish(ctx, tx, out); err != nil {
			return 0, err
		}
	}
	// The work is done: commit even when the message's context was cancelled meanwhile (a
	// router closing). A commit whose answer is lost (the connection dropped) may still have
	// committed; the redelivery then finds the inbox row and skips.
	done = true
	if err := in.db.commit(context.WithoutCancel(ctx), tx); err != nil {
		return 0, fmt.Errorf("outbox inbox: commit: %w", err)
	}
	in.processed.Add(1)
	in.logger.Trace("inbox: message processed", watermill.LogFields{"message_id": key, "published": len(out)})
	return ResultProcessed, nil
}

// publish writes out to the outbox table through tx, one INSERT per run of one topic.
func (in *Inbox[T]) publish(ctx context.Context, tx T, out []*message.Message) error {
	pub, err := outbox.NewPublisher(tx, in.cfg.Outbox, in.logger)
	if err != nil {
		return err
	}
	topicOf := func(m *message.Message) string {
		if in.cfg.Topic != nil && m != nil {
			return in.cfg.Topic(m)
		}
		return in.cfg.PublishTopic
	}
	for start := 0; start < len(out); {
		topic := topicOf(out[start])
		if topic == "" {
			return fmt.Errorf("%w (message #%d): set inbox.Config.PublishTopic or Topic", ErrNoTopic, start)
		}
		end := start + 1
		for end < len(out) && topicOf(out[end]) == topic {
			end++
		}
		if _, err := pub.PublishEvents(ctx, topic, out[start:end]...); err != nil {
			return err
		}
		start = end
	}
	return nil
}

func (in *Inbox[T]) key(msg *message.Message) (string, error) {
	key := msg.UUID
	if in.cfg.Key != nil {
		k, err := in.cfg.Key(msg)
		if err != nil {
			return "", fmt.Errorf("%w: %w", ErrNoKey, err)
		}
		key = k
	}
	switch {
	case key == "":
		return "", fmt.Errorf("%w (message %q)", ErrNoKey, msg.UUID)
	case len(key) > MaxKeyLength:
		return "", fmt.Errorf("%w: key of message %q is %d bytes, at most %d", ErrNoKey, msg.UUID, len(key), MaxKeyLength)
	case textProblem(key) != "":
		return "", fmt.Errorf("%w: key of message %q is %s", ErrNoKey, msg.UUID, textProblem(key))
	}
	return key, nil
}

// textProblem tells why s cannot be stored as text (PostgreSQL text holds valid UTF-8 without
// NUL), or "" when it can: a consumer, key or topic that fails this would fail every message
// at the database instead.
func textProblem(s string) string {
	switch {
	case !utf8.ValidString(s):
		return "not valid UTF-8"
	case strings.IndexByte(s, 0) >= 0:
		return "contains a NUL character"
	}
	return ""
}

// KeyFromMetadata returns a Config.Key that reads the dedup key from the metadata field name
// (an event id set by the producer, such as the outbox's "outbox-event-id"). A message without
// the field fails with ErrNoKey.
func KeyFromMetadata(name string) func(msg *message.Message) (string, error) {
	return func(msg *message.Message) (string, error) {
		if v := msg.Metadata.Get(name); v != "" {
			return v, nil
		}
		return "", fmt.Errorf("no metadata %q", name)
	}
}

// retryable reports whether err is a serialization failure (40001) or a deadlock (40P01):
// PostgreSQL's answers that say "run the transaction again".
func retryable(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "40001" || pgErr.Code == "40P01")
}

// backoff is the wait before rerun attempt+1: min(base·2^attempt, maxWait) ±50 %.
func backoff(base, maxWait time.Duration, attempt int) time.Duration {
	d := maxWait
	if attempt < 30 && base<<attempt < maxWait {
		d = base << attempt
	}
	return time.Duration(float64(d) * (0.5 + rand.Float64()))
}

type txKey struct{}

func withTx(ctx context.Context, tx any) context.Context { return context.WithValue(ctx, txKey{}, tx) }

// TxFromContext returns the inbox transaction of a message being processed (its
// msg.Context()), as the DB's transaction type: pgx.Tx (FromPgx) or *sql.Tx (FromSQL). ok is
// false outside an inbox handler or for another type.
func TxFromContext[T any](ctx context.Context) (tx T, ok bool) {
	tx, ok = ctx.Value(txKey{}).(T)
	return tx, ok
}
