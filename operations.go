package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/watermill-outbox/outbox/internal/dialect"
	"strings"
	"time"

	"github.com/google/uuid"
)

// DefaultCleanupBatch is how many rows CleanupPublished and CleanupDeadLettered delete per
// statement.
const DefaultCleanupBatch = 1000

// ErrEmptyFilter is returned by the dead-letter operations for a DeadLetterFilter that selects
// nothing explicitly (no topics and no ids): acting on every dead letter must be asked for with
// "*".
var ErrEmptyFilter = errors.New("outbox: empty dead-letter filter: give topics (\"*\" for all) or ids")

// ErrTableNotFound is matched (errors.Is) by every *TableNotFoundError: the outbox table does
// not exist; run Migrate (or the command `outbox migrate`).
var ErrTableNotFound = errors.New("outbox: outbox table not found")

// ErrTableOutdated is returned (wrapped) by CheckTable and Subscribe when the outbox table lacks a
// column the relay writes (one added by a later release, such as last_error_class): run Migrate
// (or the command `outbox migrate`), or add the columns the error names with your migration tool.
var ErrTableOutdated = errors.New("outbox: outbox table lacks columns the relay writes")

// relayColumns are the columns added after the first release that the relay writes; CheckTable
// and Subscribe require them.
var relayColumns = []string{"delivery_starts", "last_error_class"}

// TableNotFoundError is returned when the outbox table does not exist: by CheckTable, by
// Subscriber.Subscribe and SubscribeBatches (which check before they start), and by the
// Publisher when the database refuses an insert for it (PostgreSQL SQLSTATE 42P01, MySQL error
// 1146, SQLite "no such table"). errors.Is(err, ErrTableNotFound) holds; Err, when not nil, is
// the database's error, still reached by errors.Is/As through Unwrap.
type TableNotFoundError struct {
	// Table is the outbox table, quoted as the database sees it.
	Table string
	// Err is the error that told, nil when a lookup found no table.
	Err error
}

func (e *TableNotFoundError) Error() string {
	msg := fmt.Sprintf("outbox: outbox table %s does not exist: create it with Migrate (or `outbox migrate`)", e.Table)
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

// Is matches ErrTableNotFound.
func (e *TableNotFoundError) Is(target error) bool { return target == ErrTableNotFound }

// Unwrap returns the database's error, if any.
func (e *TableNotFoundError) Unwrap() error { return e.Err }

// checkTable returns a *TableNotFoundError when s's table does not exist in ex, an error
// wrapping ErrTableOutdated naming the relay columns it lacks, or the database error of the
// lookup. Two catalog queries.
func checkTable(ctx context.Context, s *schema, ex execer) error {
	found, err := s.d.TableExists(ctx, ex, s.t)
	if err != nil {
		return fmt.Errorf("outbox: look for table %s: %w", s.table, err)
	}
	if !found {
		return &TableNotFoundError{Table: s.table}
	}
	have, err := s.d.Columns(ctx, ex, s.t)
	if err != nil {
		return fmt.Errorf("outbox: read the columns of %s: %w", s.table, err)
	}
	var missing []string
	for _, c := range relayColumns {
		if !have[c] {
			missing = append(missing, c)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: %s lacks %s (add them with Migrate or `outbox migrate`, or see SchemaSQL)", ErrTableOutdated, s.table, strings.Join(missing, ", "))
	}
	return nil
}

// DeadLetterFilter selects dead-lettered events: those whose topic matches any of Topics or whose
// id is in IDs (either condition selects), and, when OlderThan is above zero, only those
// dead-lettered more than OlderThan ago.
type DeadLetterFilter struct {
	// Topics are patterns as in Subscribe: exact, "prefix*", or "*" for every topic.
	Topics []string
	// IDs are event ids.
	IDs []uuid.UUID
	// OlderThan narrows the selection to events dead-lettered more than this long ago
	// (database clock on PostgreSQL). Zero means any age; negative is a *ConfigError.
	OlderThan time.Duration
	// The fields below narrow the selection further (each one given must hold). PostgreSQL,
	// SQLite and MariaDB/MySQL serve them.
	//
	// Key selects the events of this ordering key (and those SkipKeyHead took out of its
	// order, see SkippedKeyHeader); "" means any.
	Key string
	// ErrorContains selects the events whose last error contains this text, ignoring case
	// (on SQLite the case of ASCII letters only); "" means any.
	ErrorContains string
	// DeadAfter and DeadBefore bound when the events were dead-lettered: at or after
	// DeadAfter, before DeadBefore. Zero means unbounded; DeadBefore not after DeadAfter
	// (both set) is a *ConfigError.
	DeadAfter, DeadBefore time.Time
}

// RetryFilter is the filter of RetryDeadLettered (the same as DeadLetterFilter).
type RetryFilter = DeadLetterFilter

// deadFilter checks f and returns it in the dialect layer's terms.
func deadFilter(f DeadLetterFilter) (dialect.DeadFilter, error) {
	if len(f.Topics) == 0 && len(f.IDs) == 0 {
		return dialect.DeadFilter{}, ErrEmptyFilter
	}
	if f.OlderThan < 0 {
		return dialect.DeadFilter{}, &ConfigError{Field: "DeadLetterFilter.OlderThan", Reason: "must not be negative"}
	}
	if !f.DeadAfter.IsZero() && !f.DeadBefore.IsZero() && !f.DeadBefore.After(f.DeadAfter) {
		return dialect.DeadFilter{}, &ConfigError{Field: "DeadLetterFilter.DeadBefore", Reason: "must be after DeadAfter"}
	}
	out := dialect.DeadFilter{OlderThan: f.OlderThan, Key: f.Key, ErrorContains: f.ErrorContains, After: f.DeadAfter, Before: f.DeadBefore}
	for i, p := range f.Topics {
		tf, err := parseTopicPattern(fmt.Sprintf("DeadLetterFilter.Topics[%d]", i), p)
		if err != nil {
			return dialect.DeadFilter{}, err
		}
		out.Topics = append(out.Topics, tf.dialect())
	}
	for _, id := range f.IDs {
		out.IDs = append(out.IDs, id.String())
	}
	return out, nil
}

// deadFilter checks f for operation op and returns it in the dialect layer's terms: also a
// *NotSupportedError for a narrowing field the table's database does not serve.
func (s *Subscriber) deadFilter(op string, f DeadLetterFilter) (dialect.DeadFilter, error) {
	df, err := deadFilter(f)
	if err != nil {
		return df, err
	}
	if df.Narrowed() {
		if _, err := s.operator(op + " with Key, ErrorContains, DeadAfter or DeadBefore"); err != nil {
			return dialect.DeadFilter{}, err
		}
	}
	return df, nil
}

// RetryDeadLettered gives the selected dead-lettered events fresh attempts (attempts = 0, due
// now; last_error is kept) and returns how many. The events of their ordering keys that waited
// behind them then follow in order. On PostgreSQL it then advances the table's sequence by one,
// so that relays with a wake probe (SubscriberConfig.WakeProbeInterval) claim them at once. Errors: ErrEmptyFilter, a *ConfigError for a bad pattern
// or a negative OlderThan, or the database error. Safe for concurrent use, also after Close.
func (s *Subscriber) RetryDeadLettered(ctx context.Context, f RetryFilter) (int64, error) {
	df, err := s.deadFilter("RetryDeadLettered", f)
	if err != nil {
		return 0, err
	}
	n, err := s.s.d.RetryDead(ctx, s.db, s.s.t, df)
	if err != nil {
		return 0, fmt.Errorf("outbox: retry dead letters in %s: %w", s.s.table, err)
	}
	if n > 0 {
		s.relay.Announce(ctx)
	}
	return n, nil
}

// PurgeDeadLettered deletes the selected dead-lettered events and returns how many. Their
// ordering keys are then no longer held: the next event of each key is delivered (on
// PostgreSQL at once by relays with a wake probe, as RetryDeadLettered). Errors as
// RetryDeadLettered.
func (s *Subscriber) PurgeDeadLettered(ctx context.Context, f DeadLetterFilter) (int64, error) {
	df, err := s.deadFilter("PurgeDeadLettered", f)
	if err != nil {
		return 0, err
	}
	n, err := s.s.d.PurgeDead(ctx, s.db, s.s.t, df)
	if err != nil {
		return 0, fmt.Errorf("outbox: purge dead letters in %s: %w", s.s.table, err)
	}
	if n > 0 {
		s.relay.Announce(ctx)
	}
	return n, nil
}

// CountDeadLettered returns how many dead-lettered events f selects: what PurgeDeadLettered
// with the same filter would delete now. Errors as RetryDeadLettered. Safe for concurrent use,
// also after Close.
func (s *Subscriber) CountDeadLettered(ctx context.Context, f DeadLetterFilter) (int64, error) {
	df, err := s.deadFilter("CountDeadLettered", f)
	if err != nil {
		return 0, err
	}
	n, err := s.s.d.CountDead(ctx, s.db, s.s.t, df)
	if err != nil {
		return 0, fmt.Errorf("outbox: count dead letters in %s: %w", s.s.table, err)
	}
	return n, nil
}

// DeadLetter is a dead-lettered event as ListDeadLettered returns it.
type DeadLetter struct {
	Event
	// DeadLetteredAt is when the event ran out of attempts.
	DeadLetteredAt time.Time
}

// ListDeadLettered returns up to limit (1..10000) selected dead-lettered events, oldest dead
// letter first, with payload, headers, attempts and last error. Errors as RetryDeadLettered,
// and a *ConfigError for a limit out of range.
func (s *Subscriber) ListDeadLettered(ctx context.Context, f DeadLetterFilter, limit int) ([]DeadLetter, error) {
	if limit < 1 || limit > MaxBatchSize {
		return nil, &ConfigError{Field: "limit", Reason: fmt.Sprintf("%d outside 1..%d", limit, MaxBatchSize)}
	}
	df, err := s.deadFilter("ListDeadLettered", f)
	if err != nil {
		return nil, err
	}
	rows, err := s.s.d.ListDead(ctx, s.db, s.s.t, df, limit)
	if err != nil {
		return nil, fmt.Errorf("outbox: list dead letters in %s: %w", s.s.table, err)
	}
	out := make([]DeadLetter, 0, len(rows))
	for _, r := range rows {
		d := DeadLetter{Event: Event{Sequence: r.Sequence, Topic: r.Topic, Payload: r.Payload, CreatedAt: r.CreatedAt, Attempts: r.Attempts}, DeadLetteredAt: r.DeadLetteredAt}
		d.ID, _ = uuid.Parse(r.ID)
		_ = json.Unmarshal([]byte(r.Headers), &d.Headers)
		d.OrderingKey, d.IdempotencyKey, d.LastError = deref(r.OrderingKey), deref(r.IdempotencyKey), deref(r.LastError)
		out = append(out, d)
	}
	return out, nil
}

func deref(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

// CleanupPublished deletes events published more than olderThan ago (database clock), in
// statements of DefaultCleanupBatch rows so no lock is held long, and returns how many. The
// relay never runs it by itself. Deleting an event frees its idempotency key: keep events at
// least as long as a producer may retry with the same key. olderThan must not be negative (a
// *ConfigError). Safe for concurrent use, also after Close.
func (s *Subscriber) CleanupPublished(ctx context.Context, olderThan time.Duration) (int64, error) {
	return s.cleanup(ctx, "published_at", olderThan)
}

// CleanupDeadLettered deletes events dead-lettered more than olderThan ago, like
// CleanupPublished. Their ordering keys are then no longer held.
func (s *Subscriber) CleanupDeadLettered(ctx context.Context, olderThan time.Duration) (int64, error) {
	return s.cleanup(ctx, "dead_lettered_at", olderThan)
}

// CountPublished returns how many events were published more than olderThan ago (database
// clock): what CleanupPublished with the same olderThan would delete now. Errors as
// CleanupPublished. Safe for concurrent use, also after Close.
func (s *Subscriber) CountPublished(ctx context.Context, olderThan time.Duration) (int64, error) {
	return s.countOlder(ctx, "published_at", olderThan)
}

// CountDeadLetteredOlder returns how many events were dead-lettered more than olderThan ago:
// what CleanupDeadLettered with the same olderThan would delete now.
func (s *Subscriber) CountDeadLetteredOlder(ctx context.Context, olderThan time.Duration) (int64, error) {
	return s.countOlder(ctx, "dead_lettered_at", olderThan)
}

func (s *Subscriber) countOlder(ctx context.Context, col string, olderThan time.Duration) (int64, error) {
	if olderThan < 0 {
		return 0, &ConfigError{Field: "olderThan", Reason: "must not be negative"}
	}
	n, err := s.s.d.CountOlder(ctx, s.db, s.s.t, col, olderThan)
	if err != nil {
		return 0, fmt.Errorf("outbox: count %s in %s: %w", col, s.s.table, err)
	}
	return n, nil
}

func (s *Subscriber) cleanup(ctx context.Context, col string, olderThan time.Duration) (int64, error) {
	if olderThan < 0 {
		return 0, &ConfigError{Field: "olderThan", Reason: "must not be negative"}
	}
	var total int64
	for {
		n, err := s.s.d.Cleanup(ctx, s.db, s.s.t, col, olderThan, DefaultCleanupBatch)
		total += n
		if err != nil {
			return total, fmt.Errorf("outbox: cleanup %s in %s: %w", col, s.s.table, err)
		}
		if n < DefaultCleanupBatch {
			return total, nil
		}
	}
}

// Backlog is a snapshot of the outbox table's state.
type Backlog struct {
	// Pending counts events neither published nor dead-lettered.
	Pending int64
	// OldestPendingAge is the age of the oldest pending event (database clock), zero when
	// nothing is pending.
	OldestPendingAge time.Duration
	// DeadLettered counts dead-lettered events.
	DeadLettered int64
	// Unavailable counts the pending events held by a destination outage: every pending
	// event of each topic that has a pending event whose last delivery found its destination
	// unavailable (released with no attempt counted, last_error_class "unavailable"; see
	// UnavailableError). While a destination is down the relay claims none of its topics'
	// events but one probe at a time, so this is the number of events waiting for it; it
	// returns to 0 once a probe is delivered and the topic's refused events are delivered
	// (or fail otherwise: any later answer overwrites the class).
	Unavailable int64
	// Held counts the pending events that wait behind a failed head of their ordering key:
	// keyed pending events after (in sequence) their key's head, where the head (the key's
	// lowest-sequence unpublished event) is dead-lettered, or is pending with attempts > 0
	// (it failed at least once and waits for, or is in, its next attempt). Such a key moves
	// again only when its head is delivered, retried (RetryDeadLettered) or purged. The head
	// itself is not counted (it is in Pending or DeadLettered). Unordered events and events
	// behind a head that is merely unavailable (no attempt counted) are never held.
	Held int64
}

// Backlog returns the pending count, the oldest pending event's age, the dead-letter count,
// the unavailable and the held counts (see Backlog), for health checks and metrics. One
// statement that reads only live work through the partial indexes, never the published
// history: its cost grows with the pending rows (and the dead letters), not with the table.
// Errors: the database error. Safe for concurrent use, also after Close.
func (s *Subscriber) Backlog(ctx context.Context) (Backlog, error) {
	r, err := s.s.d.Backlog(ctx, s.db, s.s.t)
	if err != nil {
		return Backlog{}, fmt.Errorf("outbox: backlog of %s: %w", s.s.table, err)
	}
	return backlogOf(r), nil
}

// backlogOf is the Backlog of a dialect's backlog row.
func backlogOf(r dialect.BacklogRow) Backlog {
	b := Backlog{Pending: r.Pending, DeadLettered: r.DeadLettered, Unavailable: r.Unavailable, Held: r.Held}
	if !r.Oldest.IsZero() {
		b.OldestPendingAge = max(r.Now.Sub(r.Oldest), 0)
	}
	return b
}

// TopicBacklog is the Backlog of one topic.
type TopicBacklog struct {
	Topic string
	Backlog
}

// BacklogByTopic returns the Backlog of every topic that has pending or dead-lettered events,
// sorted by topic (a held event counts under its own topic, whatever its head's). It reads
// every unpublished row (meant for the command line, not for frequent metrics: use Backlog
// there; for a page that must answer in bounded time whatever the backlog, BacklogOverview
// reads at most a given number of events of each kind). Errors: the database error.
func (s *Subscriber) BacklogByTopic(ctx context.Context) ([]TopicBacklog, error) {
	rows, err := s.s.d.BacklogByTopic(ctx, s.db, s.s.t)
	if err != nil {
		return nil, fmt.Errorf("outbox: backlog by topic of %s: %w", s.s.table, err)
	}
	var out []TopicBacklog
	for _, r := range rows {
		out = append(out, TopicBacklog{Topic: r.Topic, Backlog: backlogOf(r)})
	}
	return out, nil
}

// CheckTable reports whether the outbox table of cfg exists in db (any handle Migrate takes)
// with the columns the relay writes: nil if it does, a *TableNotFoundError if it does not
// exist, an error wrapping ErrTableOutdated (naming the columns) if it lacks columns a later
// release added, a *ConfigError for an invalid config or handle, else the database error (an
// unreachable server, for one). Two catalog queries.
func CheckTable(ctx context.Context, db any, cfg SchemaConfig) error {
	s, ex, err := open(db, cfg)
	if err != nil {
		return err
	}
	return checkTable(ctx, s, ex)
}
