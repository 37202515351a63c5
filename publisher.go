package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/watermill-outbox/outbox/internal/dialect"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
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

// row is one validated event ready for the INSERT.
type row struct {
	id      uuid.UUID
	topic   string
	payload []byte
	headers []byte
	okey    *string
	ikey    *string
	extra   map[string]any
}

func (p *Publisher) rowFromMessage(i int, topic string, msg *message.Message) (row, error) {
	r := row{topic: topic}
	if msg == nil {
		return r, &ValidationError{Index: i, Field: "message", Reason: "nil message"}
	}
	if msg.UUID != "" {
		id, err := uuid.Parse(msg.UUID)
		if err != nil {
			return r, &ValidationError{Index: i, Field: "uuid", Reason: fmt.Sprintf("%q is not a UUID (use outbox.NewMessage or watermill.NewUUID)", msg.UUID)}
		}
		r.id = id
	}
	okey := msg.Metadata.Get(MetadataOrderingKey)
	if okey == "" && p.cfg.OrderingKey != nil {
		okey = p.cfg.OrderingKey(topic, msg)
	}
	ikey := msg.Metadata.Get(MetadataIdempotencyKey)
	if ikey == "" && p.cfg.IdempotencyKey != nil {
		ikey = p.cfg.IdempotencyKey(topic, msg)
	}
	var headers map[string]string
	for k, v := range msg.Metadata {
		if isReservedMetadata(k) {
			continue
		}
		if headers == nil {
			headers = make(map[string]string, len(msg.Metadata))
		}
		headers[k] = v
	}
	return p.finishRow(i, r, msg.Payload, p.injectHeaders(msg.Context(), headers), okey, ikey, extraColumnsOf(msg))
}

func (p *Publisher) rowFromInput(i int, in EventInput) (row, error) {
	r := row{id: in.ID, topic: in.Topic}
	var payload []byte
	raw, isBytes := in.Payload.([]byte)
	if p.s.cfg.PayloadType == PayloadBytea && isBytes {
		payload = raw
	} else {
		b, err := EncodePayload(in.Payload)
		if err != nil {
			return r, &ValidationError{Index: i, Field: "payload", Reason: err.Error()}
		}
		payload = b
	}
	return p.finishRow(i, r, payload, in.Headers, in.OrderingKey, in.IdempotencyKey, in.ExtraColumns)
}

// finishRow runs the validation checks and encodes headers.
func (p *Publisher) finishRow(i int, r row, payload []byte, headers map[string]string, okey, ikey string, extra map[string]any) (row, error) {
	if r.topic == "" {
		return r, &ValidationError{Index: i, Field: "topic", Reason: "empty"}
	}
	if reason := checkText(r.topic); reason != "" {
		return r, &ValidationError{Index: i, Field: "topic", Reason: reason}
	}
	if okey != "" {
		if reason := checkText(okey); reason != "" {
			return r, &ValidationError{Index: i, Field: "ordering_key", Reason: reason}
		}
		r.okey = &okey
	}
	if ikey != "" {
		if reason := checkText(ikey); reason != "" {
			return r, &ValidationError{Index: i, Field: "idempotency_key", Reason: reason}
		}
		r.ikey = &ikey
	}
	if p.s.cfg.PayloadType.isJSON() {
		if reason := ValidatePayload(payload); reason != "" {
			return r, &ValidationError{Index: i, Field: "payload", Reason: reason}
		}
		if max := p.s.caps.MaxJSONDepth; max > 0 && jsonDepth(payload) > max {
			return r, &ValidationError{Index: i, Field: "payload", Reason: fmt.Sprintf("nested deeper than %d levels, which %s refuses", max, p.s.caps.JSONDepthRule)}
		}
	} else if payload == nil {
		payload = []byte{}
	}
	r.payload = payload
	for k := range headers {
		if isReservedMetadata(k) {
			// The relay sets the reserved keys from the columns; stored (EventInput.Headers,
			// InjectHeaders) they were emitted as if the event had that ordering key, table …
			// They are dropped, as Publish drops them from a message's metadata. The caller's
			// map is not modified.
			kept := make(map[string]string, len(headers))
			for k, v := range headers {
				if !isReservedMetadata(k) {
					kept[k] = v
				}
			}
			headers = kept
			break
		}
	}
	for k, v := range headers {
		if k == "" {
			return r, &ValidationError{Index: i, Field: "headers", Reason: "empty header name"}
		}
		if reason := checkHeaderName(k); reason != "" {
			return r, &ValidationError{Index: i, Field: "headers", Reason: fmt.Sprintf("name %q: %s", k, reason)}
		}
		if reason := checkHeader(v); reason != "" {
			return r, &ValidationError{Index: i, Field: "headers", Reason: fmt.Sprintf("value of %q: %s", k, reason)}
		}
	}
	if len(headers) == 0 {
		r.headers = []byte("{}")
	} else {
		b, err := json.Marshal(headers)
		if err != nil {
			return r, &ValidationError{Index: i, Field: "headers", Reason: err.Error()}
		}
		r.headers = b
	}
	for name := range extra {
		switch {
		case isRelayOwned(name):
			return r, &ValidationError{Index: i, Field: "extra_columns", Reason: fmt.Sprintf("column %q is written by the relay or the database", name)}
		case !p.s.extra[name]:
			return r, &ValidationError{Index: i, Field: "extra_columns", Reason: fmt.Sprintf("unknown column %q (declare it in SchemaConfig.ExtraColumns)", name)}
		}
	}
	if err := p.s.checkScope(i, r.ikey, extra); err != nil {
		return r, err
	}
	r.extra = extra
	if r.id == uuid.Nil {
		id, err := uuid.NewV7()
		if err != nil {
			return r, fmt.Errorf("outbox: new UUIDv7: %w", err)
		}
		r.id = id
	}
	return r, nil
}

// insert writes rows. Without events (and without idempotency keys) it returns nil events.
func (p *Publisher) insert(ctx context.Context, rows []row, events bool) ([]Event, error) {
	if ctx == nil {
		ctx = context.Background()
	}
	n := len(rows)
	in := &dialect.InsertParams{Table: p.s.t, Rows: make([]dialect.InsertRow, n), Notify: p.cfg.NotifyChannel, MaxNotifyTopicBytes: MaxNotifyTopicBytes}
	// One event (the common Publish) has no duplicate id and at most one key (the cap is at
	// least 1): no maps.
	var seenID map[uuid.UUID]int
	var distinctKeys, distinctIdem map[string]struct{}
	// On PostgreSQL every distinct idempotency key takes a lock too (the insert locks them in
	// one sorted pass with the ordering keys, so concurrent calls wait instead of failing on
	// the unique index), counted against the same cap.
	lockIdem := p.cfg.Schema.Dialect == DialectPostgreSQL
	if n > 1 {
		seenID, distinctKeys, distinctIdem = make(map[uuid.UUID]int, n), map[string]struct{}{}, map[string]struct{}{}
	}
	idem := false
	for i, r := range rows {
		if j, dup := seenID[r.id]; dup {
			return nil, &ValidationError{Index: i, Field: "uuid", Reason: fmt.Sprintf("same id as event #%d of this call", j)}
		}
		in.Rows[i] = dialect.InsertRow{ID: r.id.String(), Topic: r.topic, Payload: r.payload, Headers: string(r.headers), OrderingKey: r.okey, IdempotencyKey: r.ikey}
		if n > 1 {
			seenID[r.id] = i
		}
		if r.okey != nil && n > 1 {
			distinctKeys[*r.okey] = struct{}{}
			if len(distinctKeys)+len(distinctIdem) > p.cfg.MaxOrderingKeysPerCall {
				return nil, &ValidationError{Index: i, Field: "ordering_key", Reason: fmt.Sprintf("more than %d distinct ordering and idempotency keys in one call (PublisherConfig.MaxOrderingKeysPerCall)", p.cfg.MaxOrderingKeysPerCall)}
			}
		}
		if r.ikey != nil && n > 1 && lockIdem {
			distinctIdem[*r.ikey] = struct{}{}
			if len(distinctKeys)+len(distinctIdem) > p.cfg.MaxOrderingKeysPerCall {
				return nil, &ValidationError{Index: i, Field: "idempotency_key", Reason: fmt.Sprintf("more than %d distinct ordering and idempotency keys in one call (PublisherConfig.MaxOrderingKeysPerCall)", p.cfg.MaxOrderingKeysPerCall)}
			}
		}
		idem = idem || r.ikey != nil
		for c := range r.extra {
			if !slices.Contains(in.ExtraNames, c) {
				in.ExtraNames = append(in.ExtraNames, c)
			}
		}
	}
	if len(in.ExtraNames) > 0 {
		sort.Strings(in.ExtraNames)
		for i, r := range rows {
			if len(r.extra) == 0 {
				continue
			}
			b, err := EncodePayload(r.extra)
			if err != nil {
				return nil, &ValidationError{Index: i, Field: "extra_columns", Reason: err.Error()}
			}
			s := string(b)
			in.Rows[i].Extra = &s
		}
	}
	// Without idempotency keys every row is inserted or the statement fails: a caller that
	// needs no events needs nothing back.
	in.NoReturn = !events && !idem
	start := time.Now()
	stored, err := p.s.d.Insert(ctx, p.ex, in)
	var conflict *dialect.IdempotencyConflict
	switch {
	case errors.As(err, &conflict):
		return nil, &IdempotencyConflictError{Index: conflict.Index, Key: conflict.Key}
	case err != nil && p.s.d.MissingTable(err):
		return nil, &TableNotFoundError{Table: p.s.table, Err: err}
	case err != nil:
		return nil, fmt.Errorf("outbox: insert into %s: %w", p.s.table, err)
	case in.NoReturn:
		p.logWritten(n, start)
		if p.cfg.OnInserted != nil {
			var topics []string
			for _, r := range rows {
				topics = appendNew(topics, r.topic)
			}
			p.cfg.OnInserted(topics)
		}
		return nil, nil
	case p.s.caps.ResolvesRows:
		// One answer per row, in order: inserted, or stored in its scope (Duplicate).
		if len(stored) != n {
			return nil, fmt.Errorf("outbox: insert into %s: %d events returned for %d", p.s.table, len(stored), n)
		}
		out := make([]Event, n)
		for i, st := range stored {
			out[i] = storedEvent(st)
		}
		return p.written(out, start), nil
	}
	byID := make(map[string]Event, n)
	byKey := map[string]Event{}
	for _, st := range stored {
		ev := storedEvent(st)
		if ev.IdempotencyKey != "" {
			if _, seen := byKey[ev.IdempotencyKey]; !seen || !ev.Duplicate {
				byKey[ev.IdempotencyKey] = ev
			}
		}
		if !ev.Duplicate {
			byID[ev.ID.String()] = ev
		}
	}
	if idem && (p.s.scoped() || len(in.ExtraNames) > 0) {
		out, err := p.resolveByScope(ctx, rows, byID)
		if err != nil {
			return nil, err
		}
		return p.written(out, start), nil
	}
	out := make([]Event, n)
	var missing []string
	for i, r := range rows {
		if ev, ok := byID[in.Rows[i].ID]; ok {
			out[i] = ev
			continue
		}
		if r.ikey == nil {
			return nil, fmt.Errorf("outbox: insert into %s: event %s not returned", p.s.table, in.Rows[i].ID)
		}
		ev, ok := byKey[*r.ikey]
		if !ok {
			missing = append(missing, *r.ikey)
			continue
		}
		ev.Duplicate = true
		out[i] = ev
	}
	if len(missing) > 0 {
		// A concurrent transaction committed this key while the statement waited on it: its
		// row is newer than the statement's snapshot (READ COMMITTED), so read it again.
		if err := p.readStored(ctx, missing, byKey); err != nil {
			return nil, err
		}
		for i, r := range rows {
			if out[i].Sequence != 0 {
				continue
			}
			ev, ok := byKey[*r.ikey]
			if !ok {
				return nil, fmt.Errorf("outbox: insert into %s: idempotency key %q neither inserted nor found", p.s.table, *r.ikey)
			}
			ev.Duplicate = true
			out[i] = ev
		}
	}
	return p.written(out, start), nil
}

// written logs a finished write and calls OnInserted with the topics of the inserted events.
func (p *Publisher) written(out []Event, start time.Time) []Event {
	p.logWritten(len(out), start)
	if p.cfg.OnInserted != nil {
		var topics []string
		for _, ev := range out {
			if !ev.Duplicate {
				topics = appendNew(topics, ev.Topic)
			}
		}
		if len(topics) > 0 {
			p.cfg.OnInserted(topics)
		}
	}
	return out
}

// logWritten logs a finished write of n events (not built for the NopLogger: a write's fields
// cost an allocation).
func (p *Publisher) logWritten(n int, start time.Time) {
	if _, nop := p.logger.(watermill.NopLogger); !nop {
		p.logger.Trace("outbox: events written", watermill.LogFields{"table": p.s.table, "events": n, "took": time.Since(start)})
	}
}

// appendNew appends topic to topics unless it is there.
func appendNew(topics []string, topic string) []string {
	if slices.Contains(topics, topic) {
		return topics
	}
	return append(topics, topic)
}

func (p *Publisher) readStored(ctx context.Context, keys []string, byKey map[string]Event) error {
	stored, err := p.s.d.ReadStored(ctx, p.ex, p.s.t, keys)
	if err != nil {
		return fmt.Errorf("outbox: read stored events: %w", err)
	}
	for _, st := range stored {
		ev := storedEvent(st)
		byKey[ev.IdempotencyKey] = ev
	}
	return nil
}

// storedEvent is the Event of a stored row (no payload: the writer has it).
func storedEvent(st dialect.Stored) Event {
	ev := Event{Sequence: st.Sequence, Topic: st.Topic, CreatedAt: st.CreatedAt, Duplicate: st.Duplicate}
	ev.ID, _ = uuid.Parse(st.ID)
	ev.OrderingKey, ev.IdempotencyKey = deref(st.OrderingKey), deref(st.IdempotencyKey)
	return ev
}
