// Package memory is a dialect.Dialect that keeps the outbox table in Go memory: the relay
// simulation runs the real Subscriber over it under testing/synctest, where every time it
// reads (time.Now) is the bubble's virtual clock. It follows the semantics of the SQL dialects
// (the PostgreSQL claim and mark statements, the SQLite take-back) without SQL: one mutex
// serialises every operation, so each is atomic, as one statement or transaction is.
//
// A test inspects the table with Rows and injects faults with a Hook (an error before or after
// any claim, renew, mark or take-back) and with an Executor's Kill (a relay process killed
// with -9: nothing it sends afterwards reaches the table).
package memory

import (
	"context"
	"errors"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/watermill-outbox/outbox/internal/dialect"
)

// ErrKilled is returned by every operation run through a killed Executor.
var ErrKilled = errors.New("memory: executor killed")

// ErrNoSQL is returned by Executor.Query and Exec: the memory table runs no SQL.
var ErrNoSQL = errors.New("memory: the in-memory table runs no SQL")

// Row is one event with its delivery state, as stored. A zero time is SQL NULL.
type Row struct {
	Sequence       int64
	ID             string
	Topic          string
	Payload        []byte
	Headers        string
	OrderingKey    *string
	IdempotencyKey *string
	Extra          *string
	CreatedAt      time.Time
	PublishedAt    time.Time
	DeadLetteredAt time.Time
	NextAttemptAt  time.Time
	LeaseUntil     time.Time
	LeasedBy       string
	Attempts       int
	DeliveryStarts int
	// LastError is nil before the first failure or unavailable answer.
	LastError *string
	// LastErrorClass is one of the dialect.Class* values, "" before the first.
	LastErrorClass string
}

// Key returns the row's ordering key, "" for an unordered event.
func (r *Row) Key() string {
	if r.OrderingKey == nil {
		return ""
	}
	return *r.OrderingKey
}

// pending: neither published nor dead-lettered.
func (r *Row) pending() bool { return r.PublishedAt.IsZero() && r.DeadLetteredAt.IsZero() }

// Op names an operation a Hook sees.
type Op string

// The operations a Hook sees.
const (
	OpClaim    Op = "claim"
	OpRenew    Op = "renew"
	OpMark     Op = "mark"
	OpTakeBack Op = "takeback"
)

// Hook is called before (after false) and after (after true) each claim, renew, mark and
// take-back, outside the table's lock, with the Executor the operation runs on. An error
// before the operation fails it with nothing written; an error after it is returned in place
// of the operation's result, whose writes stay (a commit whose answer was lost). It must be
// safe for concurrent use.
type Hook func(op Op, after bool, ex dialect.Executor) error

// Option configures a DB.
type Option func(*DB)

// WithCapabilities replaces the default capabilities (see New).
func WithCapabilities(c dialect.Capabilities) Option { return func(d *DB) { d.caps = c } }

// WithHook installs h (nil: none).
func WithHook(h Hook) Option { return func(d *DB) { d.hook = h } }

// DB is the in-memory outbox table and its dialect.Dialect. Safe for concurrent use. Every
// table name maps to the same rows: a DB is one table.
type DB struct {
	caps dialect.Capabilities
	hook Hook

	mu   sync.Mutex
	rows []*Row // ascending Sequence
	idem map[string]*Row
	seq  int64
}

var _ dialect.Dialect = (*DB)(nil)

// New returns an empty table. The default capabilities are SkipLocked, Continuations,
// ClaimAhead, FlushAcks and DatabaseClock, with Floors off.
func New(opts ...Option) *DB {
	d := &DB{idem: map[string]*Row{}, caps: dialect.Capabilities{SkipLocked: true, Continuations: true, ClaimAhead: true,
		FlushAcks: true, DatabaseClock: true, Title: "memory"}}
	for _, o := range opts {
		o(d)
	}
	return d
}

// SetHook replaces the hook (nil: none); operations already past their hook keep the old one.
func (d *DB) SetHook(h Hook) {
	d.mu.Lock()
	d.hook = h
	d.mu.Unlock()
}

// Rows returns a copy of every row, in sequence order.
func (d *DB) Rows() []Row {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]Row, len(d.rows))
	for i, r := range d.rows {
		out[i] = *r
	}
	return out
}

// Executor is a dialect.Executor for the memory table: it runs no SQL (Query and Exec fail
// with ErrNoSQL) and only carries the Kill switch. The zero value is ready; safe for concurrent use.
type Executor struct {
	killed atomic.Bool
}

// Kill makes every later operation through e fail with ErrKilled, before it touches the
// table; an operation already past that check completes (it was committed before the kill).
func (e *Executor) Kill() { e.killed.Store(true) }

// Killed reports whether Kill was called.
func (e *Executor) Killed() bool { return e.killed.Load() }

// Query implements dialect.Executor: ErrNoSQL.
func (e *Executor) Query(context.Context, string, ...any) (dialect.Rows, error) { return nil, ErrNoSQL }

// Exec implements dialect.Executor: ErrNoSQL.
func (e *Executor) Exec(context.Context, string, ...any) (int64, error) { return 0, ErrNoSQL }

// InTx implements dialect.Executor: false.
func (e *Executor) InTx() bool { return false }

// OneShot implements dialect.Executor: args unchanged.
func (e *Executor) OneShot(args []any) []any { return args }

// Handle implements dialect.Executor: e.
func (e *Executor) Handle() any { return e }

// begin runs the hook before op and locks the table; it fails when ex is a killed Executor or
// ctx has ended. The caller unlocks with end, which runs the hook after op.
func (d *DB) begin(ctx context.Context, ex dialect.Executor, op Op) error {
	d.mu.Lock()
	h := d.hook
	d.mu.Unlock()
	if h != nil && op != "" {
		if err := h(op, false, ex); err != nil {
			return err
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	d.mu.Lock()
	if e, ok := ex.(*Executor); ok && e.Killed() {
		d.mu.Unlock()
		return ErrKilled
	}
	return nil
}

// end unlocks the table and runs the hook after op; its error replaces err when err is nil.
func (d *DB) end(ex dialect.Executor, op Op, err error) error {
	h := d.hook
	d.mu.Unlock()
	if h != nil && op != "" && err == nil {
		return h(op, true, ex)
	}
	return err
}

// Name implements dialect.Dialect.
func (d *DB) Name() string { return "memory" }

// Capabilities implements dialect.Dialect.
func (d *DB) Capabilities() dialect.Capabilities { return d.caps }

// Quote implements dialect.Dialect.
func (d *DB) Quote(t *dialect.Table) string { return dialect.DoubleQuote(t.Parts...) }

// Statements implements dialect.Dialect: none.
func (d *DB) Statements(*dialect.Table) []string { return nil }

// Migrate implements dialect.Dialect: the table always exists.
func (d *DB) Migrate(context.Context, dialect.Executor, *dialect.Table) error { return nil }

// ScopeMigration implements dialect.Dialect: none.
func (d *DB) ScopeMigration(*dialect.Table) ([]string, error) { return nil, nil }

// TableExists implements dialect.Dialect: true.
func (d *DB) TableExists(ctx context.Context, ex dialect.Executor, _ *dialect.Table) (bool, error) {
	if err := d.begin(ctx, ex, ""); err != nil {
		return false, err
	}
	return true, d.end(ex, "", nil)
}

// Columns implements dialect.Dialect: every column of the outbox table.
func (d *DB) Columns(ctx context.Context, ex dialect.Executor, t *dialect.Table) (map[string]bool, error) {
	if err := d.begin(ctx, ex, ""); err != nil {
		return nil, err
	}
	cols := map[string]bool{}
	for _, c := range []string{"sequence", "id", "topic", "payload", "headers", "ordering_key", "idempotency_key", "created_at",
		"published_at", "dead_lettered_at", "next_attempt_at", "lease_until", "leased_by", "attempts", "last_error",
		"last_error_class", "delivery_starts"} {
		cols[c] = true
	}
	for _, c := range t.Extra {
		cols[strings.ToLower(c.Name)] = true
	}
	return cols, d.end(ex, "", nil)
}

// MissingTable implements dialect.Dialect: never.
func (d *DB) MissingTable(error) bool { return false }

// Insert implements dialect.Dialect: the rows get ascending sequences and the DB's clock; a
// row whose idempotency key is stored (in any scope: the key is unique in the table) is
// returned as that stored event with Duplicate set and not written.
func (d *DB) Insert(ctx context.Context, ex dialect.Executor, p *dialect.InsertParams) ([]dialect.Stored, error) {
	if err := d.begin(ctx, ex, ""); err != nil {
		return nil, err
	}
	now := time.Now()
	out := make([]dialect.Stored, 0, len(p.Rows))
	for _, in := range p.Rows {
		if in.IdempotencyKey != nil {
			if r := d.idem[*in.IdempotencyKey]; r != nil {
				st := stored(r)
				st.Duplicate = true
				out = append(out, st)
				continue
			}
		}
		d.seq++
		r := &Row{Sequence: d.seq, ID: in.ID, Topic: in.Topic, Payload: append([]byte(nil), in.Payload...), Headers: in.Headers,
			OrderingKey: in.OrderingKey, IdempotencyKey: in.IdempotencyKey, Extra: in.Extra, CreatedAt: now}
		d.rows = append(d.rows, r)
		if in.IdempotencyKey != nil {
			d.idem[*in.IdempotencyKey] = r
		}
		out = append(out, stored(r))
	}
	return out, d.end(ex, "", nil)
}

func stored(r *Row) dialect.Stored {
	return dialect.Stored{Sequence: r.Sequence, ID: r.ID, Topic: r.Topic, OrderingKey: r.OrderingKey, IdempotencyKey: r.IdempotencyKey, CreatedAt: r.CreatedAt}
}

// ReadStored implements dialect.Dialect.
func (d *DB) ReadStored(ctx context.Context, ex dialect.Executor, _ *dialect.Table, keys []string) ([]dialect.Stored, error) {
	if err := d.begin(ctx, ex, ""); err != nil {
		return nil, err
	}
	var out []dialect.Stored
	for _, k := range keys {
		if r := d.idem[k]; r != nil {
			out = append(out, stored(r))
		}
	}
	return out, d.end(ex, "", nil)
}

// ResolveScoped implements dialect.Dialect: keys are unique in the whole table, and every
// stored event counts as Same (extra columns are not compared).
func (d *DB) ResolveScoped(ctx context.Context, ex dialect.Executor, _ *dialect.Table, probes []dialect.Probe) ([]dialect.Resolved, error) {
	if err := d.begin(ctx, ex, ""); err != nil {
		return nil, err
	}
	var out []dialect.Resolved
	for _, p := range probes {
		if r := d.idem[p.Key]; r != nil {
			out = append(out, dialect.Resolved{Index: p.Index, Stored: stored(r), Same: true})
		}
	}
	return out, d.end(ex, "", nil)
}

// find returns the row of seq, or nil. The caller holds d.mu.
func (d *DB) find(seq int64) *Row {
	i := sort.Search(len(d.rows), func(i int) bool { return d.rows[i].Sequence >= seq })
	if i < len(d.rows) && d.rows[i].Sequence == seq {
		return d.rows[i]
	}
	return nil
}

// remove deletes the rows for which drop is true and returns how many. The caller holds d.mu.
func (d *DB) remove(drop func(*Row) bool) int64 {
	kept := d.rows[:0]
	var n int64
	for _, r := range d.rows {
		if drop(r) {
			n++
			if r.IdempotencyKey != nil && d.idem[*r.IdempotencyKey] == r {
				delete(d.idem, *r.IdempotencyKey)
			}
			continue
		}
		kept = append(kept, r)
	}
	clear(d.rows[len(kept):])
	d.rows = kept
	return n
}
