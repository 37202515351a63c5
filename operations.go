package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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

// ErrTableNotFound is returned (wrapped) by CheckTable when the outbox table does not exist: run
// Migrate (or the command `outbox migrate`).
var ErrTableNotFound = errors.New("outbox: outbox table not found")

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
}

// RetryFilter is the filter of RetryDeadLettered (the same as DeadLetterFilter).
type RetryFilter = DeadLetterFilter

// deadWhere renders the filter as a condition on dead-lettered, unpublished events.
func (s *Subscriber) deadWhere(f DeadLetterFilter, args *[]any) (string, error) {
	if len(f.Topics) == 0 && len(f.IDs) == 0 {
		return "", ErrEmptyFilter
	}
	if f.OlderThan < 0 {
		return "", &ConfigError{Field: "DeadLetterFilter.OlderThan", Reason: "must not be negative"}
	}
	var conds []string
	for i, p := range f.Topics {
		tf, err := parseTopicPattern(fmt.Sprintf("DeadLetterFilter.Topics[%d]", i), p)
		if err != nil {
			return "", err
		}
		conds = append(conds, tf.sql(`"topic"`, args, s.s.sqlite))
	}
	if len(f.IDs) > 0 {
		ids := make([]string, len(f.IDs))
		for i, id := range f.IDs {
			ids[i] = id.String()
		}
		conds = append(conds, inSQL(s.s, `"id"`, ids, "uuid", args))
	}
	w := `"dead_lettered_at" IS NOT NULL AND "published_at" IS NULL AND (` + strings.Join(conds, " OR ") + `)`
	if f.OlderThan > 0 {
		w += ` AND "dead_lettered_at" < ` + s.s.agoSQL(f.OlderThan, args)
	}
	return w, nil
}

// RetryDeadLettered gives the selected dead-lettered events fresh attempts (attempts = 0, due
// now; last_error is kept) and returns how many. The events of their ordering keys that waited
// behind them then follow in order. Errors: ErrEmptyFilter, a *ConfigError for a bad pattern
// or a negative OlderThan, or the database error. Safe for concurrent use, also after Close.
func (s *Subscriber) RetryDeadLettered(ctx context.Context, f RetryFilter) (int64, error) {
	var args []any
	where, err := s.deadWhere(f, &args)
	if err != nil {
		return 0, err
	}
	q := fmt.Sprintf(`UPDATE %s SET "dead_lettered_at" = NULL, "attempts" = 0, "next_attempt_at" = NULL, "lease_until" = NULL, "leased_by" = NULL WHERE %s`, s.s.table, where)
	n, err := s.db.exec(ctx, q, args...)
	if err != nil {
		return 0, fmt.Errorf("outbox: retry dead letters in %s: %w", s.s.table, err)
	}
	return n, nil
}

// PurgeDeadLettered deletes the selected dead-lettered events and returns how many. Their
// ordering keys are then no longer held: the next event of each key is delivered. Errors as
// RetryDeadLettered.
func (s *Subscriber) PurgeDeadLettered(ctx context.Context, f DeadLetterFilter) (int64, error) {
	var args []any
	where, err := s.deadWhere(f, &args)
	if err != nil {
		return 0, err
	}
	n, err := s.db.exec(ctx, fmt.Sprintf(`DELETE FROM %s WHERE %s`, s.s.table, where), args...)
	if err != nil {
		return 0, fmt.Errorf("outbox: purge dead letters in %s: %w", s.s.table, err)
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
	var args []any
	where, err := s.deadWhere(f, &args)
	if err != nil {
		return nil, err
	}
	payload := s.s.textSQL(`"payload"`)
	if s.s.cfg.PayloadType == PayloadBytea {
		payload = `"payload"`
	}
	q := fmt.Sprintf(`SELECT "sequence", %s, "topic", %s, %s, "ordering_key", "idempotency_key", "created_at", "attempts", "last_error", "dead_lettered_at"
FROM %s WHERE %s ORDER BY "dead_lettered_at", "sequence" LIMIT %d`,
		s.s.textSQL(`"id"`), payload, s.s.textSQL(`"headers"`), s.s.table, where, limit)
	rs, err := s.db.query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("outbox: list dead letters in %s: %w", s.s.table, err)
	}
	defer rs.Close()
	var out []DeadLetter
	for rs.Next() {
		var (
			d              DeadLetter
			id, hdrs       string
			okey, ikey, le *string
		)
		if err := rs.Scan(&d.Sequence, &id, &d.Topic, &d.Payload, &hdrs, &okey, &ikey, s.s.timeDest(&d.CreatedAt), &d.Attempts, &le, s.s.timeDest(&d.DeadLetteredAt)); err != nil {
			return nil, fmt.Errorf("outbox: list dead letters in %s: %w", s.s.table, err)
		}
		d.ID, _ = uuid.Parse(id)
		_ = json.Unmarshal([]byte(hdrs), &d.Headers)
		d.OrderingKey, d.IdempotencyKey, d.LastError = deref(okey), deref(ikey), deref(le)
		out = append(out, d)
	}
	if err := rs.Err(); err != nil {
		return nil, fmt.Errorf("outbox: list dead letters in %s: %w", s.s.table, err)
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

func (s *Subscriber) cleanup(ctx context.Context, col string, olderThan time.Duration) (int64, error) {
	if olderThan < 0 {
		return 0, &ConfigError{Field: "olderThan", Reason: "must not be negative"}
	}
	var args []any
	cutoff := s.s.agoSQL(olderThan, &args)
	q := fmt.Sprintf(`DELETE FROM %[1]s WHERE "sequence" = ANY(ARRAY(SELECT "sequence" FROM %[1]s WHERE %[2]q < %[4]s ORDER BY %[2]q LIMIT %[3]d))`,
		s.s.table, col, DefaultCleanupBatch, cutoff)
	if s.s.sqlite {
		q = fmt.Sprintf(`DELETE FROM %[1]s WHERE "sequence" IN (SELECT "sequence" FROM %[1]s WHERE %[2]q < %[4]s ORDER BY %[2]q LIMIT %[3]d)`,
			s.s.table, col, DefaultCleanupBatch, cutoff)
	}
	var total int64
	for {
		n, err := s.db.exec(ctx, q, args...)
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
	// Unavailable counts the pending events whose last delivery found their destination
	// unavailable (released with no attempt counted, last_error "unavailable: …"; see
	// UnavailableError): non-zero while a destination is down, and until those events are
	// delivered after it came back.
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
	var args []any
	least := "LEAST"
	if s.s.sqlite {
		least = "min" // both arguments are coalesced: SQLite's min(a, NULL) is NULL
	}
	// Every count names the predicate of a partial index (keyed_idx, unordered_idx, dead_idx,
	// key_idx) so that the planner can use it: a predicate that matches none (for example
	// "published_at IS NULL AND dead_lettered_at IS NULL" alone) made PostgreSQL scan the
	// whole table, 1.1M rows for 100k pending ones (EXPLAIN, 2026-12-01: 536 ms and 40k
	// buffers for the unavailable count, 32 ms and 6.7k buffers split as below).
	//
	// Held: the candidate heads are the unpublished keyed rows (key_idx) that are dead-lettered
	// or have attempts > 0 (a filter on those rows' heap tuples: O(pending keyed), no index
	// holds attempts); each is checked to be its key's head and its held successors counted
	// by correlated subqueries, one key_idx probe each, so the work beyond the scan is
	// O(failed heads + held events). Correlated subqueries rather than joins: the planner
	// misjudges how few candidates survive (attempts > 0 is common in the history it has
	// statistics for) and hashed every pending keyed row instead (358 ms against 102 ms with
	// 4.7k buffers on 100k pending + 1M published rows, 10 failed heads).
	q := fmt.Sprintf(`SELECT
	(SELECT count(*) FROM %[1]s WHERE "published_at" IS NULL AND "dead_lettered_at" IS NULL AND "ordering_key" IS NULL)
	+ (SELECT count(*) FROM %[1]s WHERE "published_at" IS NULL AND "dead_lettered_at" IS NULL AND "ordering_key" IS NOT NULL),
	%[3]s(COALESCE(u.c, k.c), COALESCE(k.c, u.c)),
	(SELECT count(*) FROM %[1]s WHERE "dead_lettered_at" IS NOT NULL),
	%[2]s,
	(SELECT count(*) FROM %[1]s WHERE "published_at" IS NULL AND "dead_lettered_at" IS NULL AND "ordering_key" IS NULL AND "last_error" LIKE 'unavailable: %%')
	+ (SELECT count(*) FROM %[1]s WHERE "published_at" IS NULL AND "dead_lettered_at" IS NULL AND "ordering_key" IS NOT NULL AND "last_error" LIKE 'unavailable: %%'),
	(SELECT COALESCE(sum(x.n), 0) FROM (SELECT
		(SELECT count(*) FROM %[1]s r WHERE r."published_at" IS NULL AND r."ordering_key" = h."ordering_key" AND r."sequence" > h."sequence" AND r."dead_lettered_at" IS NULL) AS n
		FROM %[1]s h
		WHERE h."published_at" IS NULL AND h."ordering_key" IS NOT NULL AND (h."dead_lettered_at" IS NOT NULL OR h."attempts" > 0)
		AND h."sequence" = (SELECT min(e."sequence") FROM %[1]s e WHERE e."published_at" IS NULL AND e."ordering_key" = h."ordering_key")) x)
FROM (SELECT (SELECT "created_at" FROM %[1]s WHERE "published_at" IS NULL AND "dead_lettered_at" IS NULL AND "ordering_key" IS NULL ORDER BY "sequence" LIMIT 1) AS c) u,
	(SELECT (SELECT "created_at" FROM %[1]s WHERE "published_at" IS NULL AND "dead_lettered_at" IS NULL AND "ordering_key" IS NOT NULL ORDER BY "sequence" LIMIT 1) AS c) k`,
		s.s.table, s.s.nowSQL(&args), least)
	rs, err := s.db.query(ctx, q, args...)
	if err != nil {
		return Backlog{}, fmt.Errorf("outbox: backlog of %s: %w", s.s.table, err)
	}
	defer rs.Close()
	var (
		b           Backlog
		oldest, now time.Time
	)
	if rs.Next() {
		if err := rs.Scan(&b.Pending, (*microTime)(&oldest), &b.DeadLettered, (*microTime)(&now), &b.Unavailable, &b.Held); err != nil {
			return Backlog{}, fmt.Errorf("outbox: backlog of %s: %w", s.s.table, err)
		}
	}
	if err := rs.Err(); err != nil {
		return Backlog{}, fmt.Errorf("outbox: backlog of %s: %w", s.s.table, err)
	}
	if !oldest.IsZero() {
		b.OldestPendingAge = max(now.Sub(oldest), 0)
	}
	return b, nil
}

// TopicBacklog is the Backlog of one topic.
type TopicBacklog struct {
	Topic string
	Backlog
}

// BacklogByTopic returns the Backlog of every topic that has pending or dead-lettered events,
// sorted by topic (a held event counts under its own topic, whatever its head's). It reads
// every unpublished row (meant for status pages and the command line, not for frequent
// metrics: use Backlog there). Errors: the database error.
func (s *Subscriber) BacklogByTopic(ctx context.Context) ([]TopicBacklog, error) {
	var args []any
	// failed: each key whose head failed (see Backlog.Held), with the head's sequence.
	q := fmt.Sprintf(`WITH failed AS (
	SELECT h."ordering_key" AS k, h."sequence" AS s FROM %[1]s h
	WHERE h."published_at" IS NULL AND h."ordering_key" IS NOT NULL AND (h."dead_lettered_at" IS NOT NULL OR h."attempts" > 0)
	AND h."sequence" = (SELECT min(e."sequence") FROM %[1]s e WHERE e."published_at" IS NULL AND e."ordering_key" = h."ordering_key"))
SELECT o."topic",
	count(*) FILTER (WHERE o."dead_lettered_at" IS NULL),
	min(o."created_at") FILTER (WHERE o."dead_lettered_at" IS NULL),
	count(*) FILTER (WHERE o."dead_lettered_at" IS NOT NULL),
	%[2]s,
	count(*) FILTER (WHERE o."dead_lettered_at" IS NULL AND o."last_error" LIKE 'unavailable: %%'),
	count(*) FILTER (WHERE o."dead_lettered_at" IS NULL AND o."sequence" > f.s)
FROM %[1]s o LEFT JOIN failed f ON f.k = o."ordering_key"
WHERE o."published_at" IS NULL GROUP BY o."topic" ORDER BY o."topic"`, s.s.table, s.s.nowSQL(&args))
	rs, err := s.db.query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("outbox: backlog by topic of %s: %w", s.s.table, err)
	}
	defer rs.Close()
	var out []TopicBacklog
	for rs.Next() {
		var (
			tb          TopicBacklog
			oldest, now time.Time
		)
		if err := rs.Scan(&tb.Topic, &tb.Pending, (*microTime)(&oldest), &tb.DeadLettered, (*microTime)(&now), &tb.Unavailable, &tb.Held); err != nil {
			return nil, fmt.Errorf("outbox: backlog by topic of %s: %w", s.s.table, err)
		}
		if !oldest.IsZero() {
			tb.OldestPendingAge = max(now.Sub(oldest), 0)
		}
		out = append(out, tb)
	}
	if err := rs.Err(); err != nil {
		return nil, fmt.Errorf("outbox: backlog by topic of %s: %w", s.s.table, err)
	}
	return out, nil
}

// CheckTable reports whether the outbox table of cfg exists in db (any handle Migrate takes):
// nil if it does, an error wrapping ErrTableNotFound if not, a *ConfigError for an invalid
// config or handle, else the database error (an unreachable server, for one).
func CheckTable(ctx context.Context, db any, cfg SchemaConfig) error {
	s, ex, err := open(db, cfg)
	if err != nil {
		return err
	}
	q, arg := `SELECT to_regclass($1) IS NOT NULL`, s.table
	if s.sqlite {
		q, arg = `SELECT count(*) > 0 FROM sqlite_master WHERE "type" = 'table' AND "name" = $1 COLLATE NOCASE`, s.tableName
	}
	rs, err := ex.query(ctx, q, arg)
	if err != nil {
		return fmt.Errorf("outbox: look for table %s: %w", s.table, err)
	}
	defer rs.Close()
	var found bool
	if rs.Next() {
		if err := rs.Scan(&found); err != nil {
			return fmt.Errorf("outbox: look for table %s: %w", s.table, err)
		}
	}
	if err := rs.Err(); err != nil {
		return fmt.Errorf("outbox: look for table %s: %w", s.table, err)
	}
	if !found {
		return fmt.Errorf("%w: %s (create it with Migrate or `outbox migrate`)", ErrTableNotFound, s.table)
	}
	return nil
}
