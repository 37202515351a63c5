// Package dialect is the outbox's SQL layer: one Dialect per database (the packages
// internal/dialect/postgres, internal/dialect/sqlite and internal/dialect/mysql), each holding
// the SQL text of its database. The root package keeps every rule that does not depend on the
// database — validation, splitting runs, delivery, fencing decisions, backoff, hooks — and
// talks to the database only through this interface. Adding a database is adding a package
// that implements Dialect and passes the shared suite (internal/dialect/dialecttest and the
// root package's behavioural suite).
//
// Operations are named after what they do and take a params struct, in the manner of River's
// riverdriver. Every operation runs on the Executor it is given: the caller's transaction for
// the Publisher's writes, the relay's own handle for claims and marks.
package dialect

import (
	"context"
	"sync/atomic"
	"time"
)

// Rows is a query result.
type Rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
	Close()
}

// Executor runs statements on one database handle (a transaction, a connection or a pool).
type Executor interface {
	Query(ctx context.Context, sql string, args ...any) (Rows, error)
	Exec(ctx context.Context, sql string, args ...any) (int64, error)
	// InTx reports whether statements run inside a caller's transaction.
	InTx() bool
	// OneShot returns args for a statement that must be planned for its actual parameters
	// on every run (pgx: QueryExecModeExec prepended; other drivers: args unchanged).
	OneShot(args []any) []any
	// Handle is the handle the Executor wraps (*sql.DB, *sql.Tx, pgx.Tx …), for a dialect
	// that needs more than statements (a dedicated connection, BEGIN IMMEDIATE).
	Handle() any
}

// Payload is the payload column's storage.
type Payload int

const (
	// PayloadJSON is JSON text stored as written (the default).
	PayloadJSON Payload = iota
	// PayloadBytea is binary (bytea, BLOB, LONGBLOB).
	PayloadBytea
	// PayloadJSONB is PostgreSQL jsonb (JSON text elsewhere).
	PayloadJSONB
)

// IsJSON reports whether payloads are JSON.
func (p Payload) IsJSON() bool { return p != PayloadBytea }

// Column is a user-defined column: Name unquoted, Type DDL text.
type Column struct {
	Name string
	Type string
}

// Table is a validated outbox table: everything a dialect needs to write its SQL.
type Table struct {
	// Parts is the table name as configured: [table] or [schema, table], unquoted.
	Parts []string
	// IndexBase is the unquoted prefix of index names (short enough for every suffix).
	IndexBase string
	Payload   Payload
	Extra     []Column
	// Scope holds the idempotency scope columns (SchemaConfig.IdempotencyScope), or none.
	Scope []string
	// FillFactor is the PostgreSQL fillfactor; FillDefault is true when it was left to its
	// default (an existing table keeps its own then).
	FillFactor  int
	FillDefault bool
	// LockSeed seeds the hash of the per-ordering-key write locks (and Migrate's lock).
	LockSeed int64
}

// Name is the unquoted table name (its last part).
func (t *Table) Name() string { return t.Parts[len(t.Parts)-1] }

// Topic is one compiled topic pattern: every topic, an exact name or a prefix.
type Topic struct {
	All    bool
	Prefix bool   // Value is a prefix ("library." of "library.*")
	Value  string // the exact name or the prefix
}

// TopicSelection is a subscription's include pattern minus its excluded patterns.
type TopicSelection struct {
	Include  Topic
	Excludes []Topic
}

// RelayConfig holds the relay settings a claim's and a mark's SQL depend on.
type RelayConfig struct {
	BatchSize     int
	MaxRunPerKey  int
	KeyScan       int
	LeaseDuration time.Duration
	MaxAttempts   int
	RetryBase     time.Duration
	RetryMax      time.Duration
}

// Capabilities says what a dialect can do; the root package and the shared suites read it
// instead of asking which database this is.
type Capabilities struct {
	// Notify: the Publisher can announce commits to listeners in other processes through
	// the database (PostgreSQL LISTEN/NOTIFY).
	Notify bool
	// FlushAcks: acks may be written while a batch is still out (a second writer beside the
	// marks). SQLite has one writer: its acks wait for the batch's end.
	FlushAcks bool
	// Continuations: a claim may lease a key's next run while the marks of its previous run
	// are still being written (ClaimParams.Cont).
	Continuations bool
	// SkipLocked: relays share a table through row locks (FOR UPDATE SKIP LOCKED), and a
	// claim may lease a key's run partially (ranks come from the claim).
	SkipLocked bool
	// DatabaseClock: times (leases, retries, created_at) come from the database's clock;
	// otherwise from the writer's and the relay's clocks.
	DatabaseClock bool
	// SchemaQualified: the table name may be schema-qualified.
	SchemaQualified bool
	// FillFactor: SchemaConfig.FillFactor applies.
	FillFactor bool
	// Title is the database's name in messages ("SQLite").
	Title string
	// ClaimAhead: the relay claims the next batch while the current one is out. Off for
	// MariaDB/MySQL. A claim counts a delivery start for every event it leases, a batch
	// claimed ahead and never emitted included, so relays killed again and again (the MariaDB
	// kill trial kills one every few seconds while it holds 2,000 events) bring many events to
	// their last allowed start, which the relay makes one event at a time (suspect isolation).
	// With claim-ahead on, that trial lost nothing and dead-lettered nothing, but a restarted
	// relay then took 67–96 s instead of under 5 s to deliver what its predecessor held.
	ClaimAhead bool
	// Floors: the claim starts its scans at floors below which only published, dead-lettered,
	// blocked or retrying events lie, and reports the next floors' candidates (ClaimResult.Floors);
	// otherwise LowKeyed/LowUnordered are plain scan starts reset to 0 now and then.
	Floors bool
	// MaxJSONDepth is the deepest JSON nesting the database accepts (0: no limit the
	// Publisher checks), and JSONDepthRule what refuses deeper payloads, for the error.
	MaxJSONDepth  int
	JSONDepthRule string
}

// Dialect is one database's SQL. Implementations are safe for concurrent use.
type Dialect interface {
	// Name is "postgresql", "sqlite" or "mysql".
	Name() string
	Capabilities() Capabilities
	// Quote quotes the table name (schema-qualified where given) for SQL text and messages.
	Quote(t *Table) string

	// Schema.

	// Statements returns the idempotent DDL of t, one statement per element (SchemaSQL).
	Statements(t *Table) []string
	// Migrate creates or upgrades t, serialised against concurrent Migrates. A table whose
	// idempotency index does not match t.Scope is a *ScopeMismatch (possibly wrapped).
	Migrate(ctx context.Context, ex Executor, t *Table) error
	// ScopeMigration returns the statements that move an existing table's idempotency
	// index to t's scope.
	ScopeMigration(t *Table) ([]string, error)
	// TableExists reports whether t exists.
	TableExists(ctx context.Context, ex Executor, t *Table) (bool, error)
	// Columns returns the lower-cased column names of t (none when it does not exist).
	Columns(ctx context.Context, ex Executor, t *Table) (map[string]bool, error)

	// Publisher.

	// Insert writes the rows in the caller's transaction, in order, each ordering key's rows
	// after every earlier committed or in-flight row of that key (per-key commit order),
	// and returns one Stored per row, in input order: the inserted event, or for a row whose
	// idempotency key (in its scope) was already stored, that stored event with Duplicate set
	// (OnePerRow assembles this from what an INSERT … RETURNING gave back). An unscoped
	// table's stored event whose extra columns differ from the row's is an
	// *IdempotencyConflict. With p.NoReturn it may return nil. A failed Insert leaves the
	// caller's transaction as it was before the call where the database allows it.
	Insert(ctx context.Context, ex Executor, p *InsertParams) ([]Stored, error)
	// ReadStored reads the stored events of idempotency keys (unscoped table).
	ReadStored(ctx context.Context, ex Executor, t *Table, keys []string) ([]Stored, error)
	// ResolveScoped reads, for each probe, the stored event of its idempotency key in its
	// scope (Scope columns), and whether its extra columns agree (unscoped tables).
	ResolveScoped(ctx context.Context, ex Executor, t *Table, probes []Probe) ([]Resolved, error)

	// Relay.

	// NewRelay compiles the claim, renew and mark statements of one subscription.
	NewRelay(t *Table, cfg RelayConfig, sel TopicSelection) Relay
	// TakeBack releases the unexpired leases of an earlier relay of the same name: tokens
	// starting with Name, not with TokenPrefix, followed by 12 hex digits, '#', digits.
	TakeBack(ctx context.Context, ex Executor, t *Table, name, tokenPrefix string) (int64, error)

	// MissingTable reports whether err, from one of the dialect's statements, says that a
	// table it names does not exist (PostgreSQL 42P01, MySQL 1146, SQLite "no such table").
	MissingTable(err error) bool

	// Operations.

	RetryDead(ctx context.Context, ex Executor, t *Table, f DeadFilter) (int64, error)
	PurgeDead(ctx context.Context, ex Executor, t *Table, f DeadFilter) (int64, error)
	// CountDead returns how many dead-lettered events f selects: what PurgeDead would delete.
	CountDead(ctx context.Context, ex Executor, t *Table, f DeadFilter) (int64, error)
	ListDead(ctx context.Context, ex Executor, t *Table, f DeadFilter, limit int) ([]DeadRow, error)
	// Cleanup deletes up to batch rows whose column (published_at or dead_lettered_at) is
	// older than olderThan and returns how many it deleted.
	Cleanup(ctx context.Context, ex Executor, t *Table, column string, olderThan time.Duration, batch int) (int64, error)
	// CountOlder returns how many rows Cleanup of column and olderThan would delete, in all its
	// batches.
	CountOlder(ctx context.Context, ex Executor, t *Table, column string, olderThan time.Duration) (int64, error)
	Backlog(ctx context.Context, ex Executor, t *Table) (BacklogRow, error)
	BacklogByTopic(ctx context.Context, ex Executor, t *Table) ([]BacklogRow, error)

	// Replay (copies of published events, written back through Insert).

	// CountReplay returns how many published events f selects and the highest sequence among
	// them (0 when none), reading the published_at index over f's window.
	CountReplay(ctx context.Context, ex Executor, t *Table, f ReplayFilter) (n, maxSeq int64, err error)
	// ScanReplay returns up to limit published events f selects after the cursor (in
	// published_at, sequence order; a zero cursor starts at f.Since), as cursors.
	ScanReplay(ctx context.Context, ex Executor, t *Table, f ReplayFilter, after ReplayMark, limit int) ([]ReplayMark, error)
	// ReadReplay reads the events of seqs (by primary key) in sequence order, with their extra
	// columns as one JSON object (nil without extra columns). Missing sequences are left out.
	ReadReplay(ctx context.Context, ex Executor, t *Table, seqs []int64) ([]ReplayRow, error)
}

// ReplayFilter selects published events for a replay: published_at in [Since, Until), sequence
// at most MaxSeq (0: no bound), topic matching any of Topics (none: every topic), ordering key
// in Keys (none: any key, unordered events included).
type ReplayFilter struct {
	Since, Until time.Time
	Topics       []Topic
	Keys         []string
	MaxSeq       int64
}

// ReplayMark is a published event's place in the published_at index: ScanReplay's cursor.
type ReplayMark struct {
	PublishedAt time.Time
	Sequence    int64
}

// ReplayRow is a published event to copy: its columns as Insert takes them, and its extra
// columns as a JSON object (nil when the table has none).
type ReplayRow struct {
	Sequence    int64
	ID          string
	Topic       string
	Payload     []byte
	Headers     string
	OrderingKey *string
	Extra       *string
}

// InsertRow is one event to write. Payload is JSON text or binary (Table.Payload); Headers is
// a JSON object; Extra is a JSON object of extra column values, or nil.
type InsertRow struct {
	ID             string
	Topic          string
	Payload        []byte
	Headers        string
	OrderingKey    *string
	IdempotencyKey *string
	Extra          *string
}

// InsertParams is one Publisher write.
type InsertParams struct {
	Table *Table
	Rows  []InsertRow
	// ExtraNames are the extra columns any row sets, sorted.
	ExtraNames []string
	// Notify is the channel to announce the inserted topics on ("" for none; Capabilities.Notify).
	Notify string
	// MaxNotifyTopicBytes: longer topics are announced as "".
	MaxNotifyTopicBytes int
	// NoReturn: the caller needs no Stored values (no row has an idempotency key); a dialect
	// may then run the insert without RETURNING and return nil.
	NoReturn bool
}

// Stored is an event as stored: inserted by this call, or found by its idempotency key
// (Duplicate).
type Stored struct {
	Duplicate      bool
	Sequence       int64
	ID             string
	Topic          string
	OrderingKey    *string
	IdempotencyKey *string
	CreatedAt      time.Time
}

// Probe asks for the stored event of idempotency key Key with extra column values Extra
// (scope columns for a scoped table), for row Index of a write.
type Probe struct {
	Index int            `json:"o"`
	Key   string         `json:"k"`
	Extra map[string]any `json:"e"`
}

// Resolved is the answer to a Probe: Same is false when the stored event's extra columns
// differ from the probe's (an unscoped table: another tenant's key).
type Resolved struct {
	Index int
	Stored
	Same bool
}

// Relay is one subscription's compiled statements. Safe for concurrent use (marks run beside
// claims).
type Relay interface {
	// Claim leases the next batch under p.Token.
	Claim(ctx context.Context, ex Executor, p *ClaimParams) (*ClaimResult, error)
	// Renew extends the lease of seqs still held under token and returns how many are.
	Renew(ctx context.Context, ex Executor, token string, seqs []int64) (int64, error)
	// Mark writes a batch's outcome, fenced by its token.
	Mark(ctx context.Context, ex Executor, p *MarkParams) ([]MarkResult, error)
}

// Sweeper is implemented by the relays of dialects with Capabilities.Floors: Sweep returns the
// first keyed and unordered events below the floors that should hold them (pending, never
// failed, not waiting behind a dead-lettered or retrying event of their key; 0: none), so that
// an event no claim can find any more (its relay stopped while it was following the key, or
// it was written without the Publisher) is found again. It reads the history below the floors:
// run it now and then, beside the claims, never as part of one.
type Sweeper interface {
	Sweep(ctx context.Context, ex Executor, floorKeyed, floorUnordered int64) (keyed, unordered int64, err error)
}

// KeyTakeBacker is implemented by the dialects whose claims take ClaimParams.First
// (PostgreSQL): TakeBackKeys is Dialect.TakeBack that also returns the ordering keys of the
// keyed events it released, in the order of each key's first released event.
type KeyTakeBacker interface {
	TakeBackKeys(ctx context.Context, ex Executor, t *Table, name, tokenPrefix string) (n int64, keys []TakenKey, err error)
}

// TakenKey is an ordering key whose events TakeBackKeys released; Last is the highest
// sequence of them.
type TakenKey struct {
	Key  string
	Last int64
}

// LockLooker is implemented by the relays of dialects with Capabilities.Floors: LockHolders
// returns the transactions that hold a lock on the outbox table (see FloorTracker.CheckLocks).
type LockLooker interface {
	LockHolders(ctx context.Context, ex Executor) ([]string, error)
}

// Continuation is a key whose last run (From..After, leased under ClaimParams.ContToken) was
// full and acked whole: its next run may be leased while that run's marks are written.
type Continuation struct {
	Key   string
	From  int64
	After int64
}

// ClaimParams is one claim.
type ClaimParams struct {
	Token string
	// Limit caps the claim's keyed events (BatchSize, or less during a split).
	Limit int
	// SizeHint is how many events the claim will likely return (the relay's previous claim's
	// count, within [16, BatchSize]): the result is allocated for that many. 0: unknown.
	SizeHint int
	// Oldest is how many of the oldest claimable keyed events the claim walks.
	Oldest int
	// Cursor is where the key skip scan resumes ("" from the start).
	Cursor string
	// LowUnordered and LowKeyed: the unordered scan and the keyed walk start at these
	// sequences. With Capabilities.Floors they are floors: the claim also leases the events
	// below them that are due again (next_attempt_at), and reports the next floors' candidates
	// (ClaimResult.Floors).
	LowUnordered, LowKeyed int64
	// NoKeyScan: the claim does not run its key skip scan (Capabilities.Floors; the relay backs
	// it off while it finds no claimable head, see FloorReport.ScanHeads).
	NoKeyScan bool
	// KeyLows bound the head checks of these keys (Capabilities.Floors): every event of
	// Key below Low is published.
	KeyLows []KeyLow
	// First are keys whose runs the claim leases before those of the walk, from each key's
	// head while that head is at or below Last (KeyTakeBacker: the keys a restarted relay took
	// back, whose heads may be younger than many other keys'). A key whose head is not
	// claimable (leased, backing off, dead-lettered) yields nothing. Keys in Cont are left to
	// their continuation. The heads are looked up from KeyLows, or from the key's start.
	First     []TakenKey
	Cont      []Continuation
	ContToken string
	// Paused topics are left out (outages).
	Paused []string
	// Probe, when set, claims at most one event, of these topics only (an outage's probe).
	Probe []string
	// Eager asks for the write lock without the busy timeout's backoff (SQLite, while
	// writers are committing; see the subscriber's eagerClaim).
	Eager bool
	// ReadFirst (SQLite) looks for claimable events without the write lock first, and takes
	// it only when there are some (claims after one that leased less than a whole batch, so
	// this one may find nothing).
	ReadFirst bool
}

// Which claims of a SQLite relay lock eagerly (SQLiteEager).
const (
	// EagerWhileWoken (the default): every claim while the subscription's waits end with
	// wakeup signals, within a bound of whole batches in a row, and each batch's marks.
	EagerWhileWoken int32 = iota
	// EagerFirstAfterWake: the first claim after a wakeup signal only, and its batch's marks.
	EagerFirstAfterWake
	// EagerNever: every claim and mark waits through SQLite's busy handler.
	EagerNever
)

// SQLiteEager selects the SQLite relays' eager locking policy. Benchmarks set it to compare
// policies in one run; nothing else changes it.
var SQLiteEager atomic.Int32

// SQLiteNoReadFirst turns ClaimParams.ReadFirst off. Benchmarks set it to compare in one run;
// nothing else changes it.
var SQLiteNoReadFirst atomic.Bool

// KeyLow is a sequence below which every event of an ordering key is published.
type KeyLow struct {
	Key string
	Low int64
}

// FloorReport is what a claim reports for the next claim's floors (Capabilities.Floors): the
// claim's snapshot's xmin, its own transaction id (0: none assigned), the highest sequence its
// snapshot sees (0: none), and the first keyed and unordered events at or above the floors that
// hold them (0: none). Transaction ids are PostgreSQL's 64-bit xid8 values. ScanHeads is how
// many claimable heads of keys not in ClaimParams.KeyLows the key skip scan found (0 also when it
// did not run).
type FloorReport struct {
	Xmin, Xid, MaxSeq        int64
	NextKeyed, NextUnordered int64
	ScanHeads                int64
}

// Claimed is one leased event. Rank is the event's place in its key's run (1 = the key's
// head), 0 for an unordered event, -1 when the claim does not rank (the caller ranks).
type Claimed struct {
	Sequence       int64
	ID             string
	Topic          string
	Payload        []byte
	Headers        string
	OrderingKey    *string
	CreatedAt      time.Time
	Attempts       int
	LastError      *string
	Rank           int64
	DeliveryStarts int
	Extra          []any
}

// ClaimResult is a claim's leased events (any order) and what it reports for the next claim:
// the skip scan's last key and how many keys it saw (nil when it did not run), and how many
// keys the walk found (-1: not reported).
type ClaimResult struct {
	Events  []Claimed
	Cursor  *string
	Scanned *int64
	Walked  int64
	// Floors: see FloorReport; nil without Capabilities.Floors.
	Floors *FloorReport
}

// The values of the last_error_class column: the failure class of the answer that wrote
// last_error, written by every mark that writes last_error (NULL before the first). Backlogs
// count a topic's pending events as unavailable when one of them holds ClassUnavailable.
const (
	// ClassUnavailable: the destination was unavailable (Unavailable with Keep false).
	ClassUnavailable = "unavailable"
	// ClassNotAttempted: the delivery was not attempted (Unavailable with Keep true).
	ClassNotAttempted = "not_attempted"
	// ClassHeld: held back before emission (MarkParams.Held): its destination was in an
	// outage or over its rate limit.
	ClassHeld = "held"
	// ClassFailure: an ordinary failure (Failed, Perm false).
	ClassFailure = "failure"
	// ClassPermanent: a permanent failure (Failed, Perm true).
	ClassPermanent = "permanent"
)

// MarkParams is one batch's outcome: the sequences of each outcome with their per-event values
// (Failed: Errs, Perm, Jitters; Unavailable: Notes, Keep). Keep is true for a delivery that
// was not attempted (its start is kept, its class is ClassNotAttempted) and false for an
// unavailable destination (ClassUnavailable).
type MarkParams struct {
	Token                                string
	Acked, Released, Unavailable, Failed []int64
	// Abandoned were unanswered at a stop: released, their delivery start uncounted.
	Abandoned []int64
	// Held were never emitted (their destination is in an outage or over its rate limit):
	// released with their delivery start uncounted, no attempt counted, next_attempt_at
	// HeldFor[i] microseconds after the mark's clock, last_error HeldNotes[i] and
	// last_error_class ClassHeld. Their keys wait behind them like behind a retry.
	Held        []int64
	HeldFor     []int64
	HeldNotes   []string
	Notes, Errs []string
	Keep        []bool
	Perm        []bool
	Jitters     []float64
	// Eager: see ClaimParams.Eager.
	Eager bool
}

// MarkResult is one marked event: its attempts after the mark, its next attempt (a retry),
// whether it was dead-lettered, and the clock the mark used.
type MarkResult struct {
	Seq      int64
	Attempts int
	Next     *time.Time
	Dead     bool
	Now      time.Time
}

// DeadFilter selects dead-lettered events: any of Topics or IDs, dead-lettered more than
// OlderThan ago when it is above zero.
type DeadFilter struct {
	Topics    []Topic
	IDs       []string
	OlderThan time.Duration
	// The narrowing conditions below are served by the dialects that implement Operator
	// (every SQL dialect; the root package refuses them elsewhere): Key, the ordering key (also an event that
	// HeadSkip took out of that key's order); ErrorContains, text in last_error (case
	// insensitive); After and Before bound dead_lettered_at (inclusive, exclusive; zero: open).
	Key           string
	ErrorContains string
	After, Before time.Time
}

// Narrowed reports whether f uses a condition of DeadFilter that only Operator dialects serve.
func (f DeadFilter) Narrowed() bool {
	return f.Key != "" || f.ErrorContains != "" || !f.After.IsZero() || !f.Before.IsZero()
}

// DeadRow is one dead-lettered event.
type DeadRow struct {
	Sequence       int64
	ID             string
	Topic          string
	Payload        []byte
	Headers        string
	OrderingKey    *string
	IdempotencyKey *string
	CreatedAt      time.Time
	Attempts       int
	LastError      *string
	DeadLetteredAt time.Time
}

// BacklogRow is the Backlog of the table or of one topic. Oldest is the oldest pending event's
// created_at (zero when none), Now the clock it is measured against.
type BacklogRow struct {
	Topic        string
	Pending      int64
	Oldest       time.Time
	DeadLettered int64
	Now          time.Time
	Unavailable  int64
	Held         int64
}

// IdempotencyConflict is Insert's error for row Index whose idempotency key Key is stored with
// other extra column values (an unscoped table: another tenant's key).
type IdempotencyConflict struct {
	Index int
	Key   string
}

// Error names the key.
func (e *IdempotencyConflict) Error() string {
	return "idempotency key " + e.Key + " is stored with other extra column values"
}

// WakeProber is implemented by dialects whose relays can learn of new events without any help
// from the writers, by probing a counter that every write advances (PostgreSQL: the identity
// sequence behind "sequence"). Each method is one short statement that reads no table rows.
type WakeProber interface {
	// ProbeTarget resolves the counter of t: an id for Probe, and the sequence's cache size (a
	// cache above 1 lets writers take values without advancing the counter).
	ProbeTarget(ctx context.Context, ex Executor, t *Table) (target int64, cache int64, err error)
	// Probe reads the counter; when it differs from last, or when full is true, it also reads
	// the database's snapshot and lists the transactions in progress (ProbeState.Xmax,
	// InProgress, Running; otherwise they are zero and Running nil).
	Probe(ctx context.Context, ex Executor, target, last int64, full bool) (ProbeState, error)
	// Announce advances t's counter by one (a value no event will have), so that probing
	// relays claim at once: for operations that make events claimable without writing one.
	Announce(ctx context.Context, ex Executor, t *Table) error
}

// ProbeState is one reading of a WakeProber. Transaction ids are their low 32 bits (compare
// them modulo 2^32: running transactions lie within 2^31 of each other).
type ProbeState struct {
	// Counter is the counter's value (0 before its first advance).
	Counter int64
	// Xmax and InProgress are the snapshot's: every transaction below Xmax that is not in
	// InProgress (ascending) has ended; none at or above Xmax has.
	Xmax       uint32
	InProgress []uint32
	// Running lists the transactions in progress that have an id, when Probe was asked to
	// (nil otherwise); it includes those at or above Xmax, which the snapshot does not list.
	Running []uint32
}
