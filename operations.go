package outbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
)

// DefaultCleanupBatch is how many rows CleanupPublished and CleanupDeadLettered delete per
// statement.
const DefaultCleanupBatch = 1000

// ErrEmptyFilter is returned by RetryDeadLettered for a RetryFilter that selects nothing
// explicitly (no topics and no ids): retrying every dead letter must be asked for with "*".
var ErrEmptyFilter = errors.New("outbox: empty retry filter: give topics (\"*\" for all) or ids")

// RetryFilter selects dead-lettered events: those whose topic matches any of Topics or whose
// id is in IDs (either condition selects).
type RetryFilter struct {
	// Topics are patterns as in Subscribe: exact, "prefix*", or "*" for every topic.
	Topics []string
	// IDs are event ids.
	IDs []uuid.UUID
}

// RetryDeadLettered gives the selected dead-lettered events fresh attempts (attempts = 0, due
// now; last_error is kept) and returns how many. The events of their ordering keys that waited
// behind them then follow in order. Errors: ErrEmptyFilter, a *ConfigError for a bad pattern,
// or the database error.
func (s *Subscriber) RetryDeadLettered(ctx context.Context, f RetryFilter) (int64, error) {
	if len(f.Topics) == 0 && len(f.IDs) == 0 {
		return 0, ErrEmptyFilter
	}
	var args []any
	var conds []string
	for i, p := range f.Topics {
		tf, err := parseTopicPattern(fmt.Sprintf("RetryFilter.Topics[%d]", i), p)
		if err != nil {
			return 0, err
		}
		conds = append(conds, tf.sql(`"topic"`, &args))
	}
	if len(f.IDs) > 0 {
		ids := make([]string, len(f.IDs))
		for i, id := range f.IDs {
			ids[i] = id.String()
		}
		args = append(args, ids)
		conds = append(conds, fmt.Sprintf(`"id" = ANY($%d::uuid[])`, len(args)))
	}
	q := fmt.Sprintf(`UPDATE %s SET "dead_lettered_at" = NULL, "attempts" = 0, "next_attempt_at" = NULL, "lease_until" = NULL, "leased_by" = NULL
WHERE "dead_lettered_at" IS NOT NULL AND "published_at" IS NULL AND (%s)`, s.s.table, strings.Join(conds, " OR "))
	n, err := s.db.exec(ctx, q, args...)
	if err != nil {
		return 0, fmt.Errorf("outbox: retry dead letters in %s: %w", s.s.table, err)
	}
	return n, nil
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
	q := fmt.Sprintf(`DELETE FROM %[1]s WHERE "sequence" = ANY(ARRAY(SELECT "sequence" FROM %[1]s WHERE %[2]q < now() - $1 * interval '1 microsecond' ORDER BY %[2]q LIMIT %[3]d))`,
		s.s.table, col, DefaultCleanupBatch)
	var total int64
	for {
		n, err := s.db.exec(ctx, q, olderThan.Microseconds())
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
}

// Backlog returns the pending count, the oldest pending event's age and the dead-letter count,
// for health checks and metrics. It reads through the partial indexes (cheap with any amount of
// history). Errors: the database error.
func (s *Subscriber) Backlog(ctx context.Context) (Backlog, error) {
	q := fmt.Sprintf(`SELECT
	(SELECT count(*) FROM %[1]s WHERE "published_at" IS NULL AND "dead_lettered_at" IS NULL AND "ordering_key" IS NULL)
	+ (SELECT count(*) FROM %[1]s WHERE "published_at" IS NULL AND "dead_lettered_at" IS NULL AND "ordering_key" IS NOT NULL),
	COALESCE(EXTRACT(EPOCH FROM now() - LEAST(
		(SELECT "created_at" FROM %[1]s WHERE "published_at" IS NULL AND "dead_lettered_at" IS NULL AND "ordering_key" IS NULL ORDER BY "sequence" LIMIT 1),
		(SELECT "created_at" FROM %[1]s WHERE "published_at" IS NULL AND "dead_lettered_at" IS NULL AND "ordering_key" IS NOT NULL ORDER BY "sequence" LIMIT 1)))::float8, 0),
	(SELECT count(*) FROM %[1]s WHERE "dead_lettered_at" IS NOT NULL)`, s.s.table)
	rs, err := s.db.query(ctx, q)
	if err != nil {
		return Backlog{}, fmt.Errorf("outbox: backlog of %s: %w", s.s.table, err)
	}
	defer rs.Close()
	var b Backlog
	var age float64
	if rs.Next() {
		if err := rs.Scan(&b.Pending, &age, &b.DeadLettered); err != nil {
			return Backlog{}, fmt.Errorf("outbox: backlog of %s: %w", s.s.table, err)
		}
	}
	if err := rs.Err(); err != nil {
		return Backlog{}, fmt.Errorf("outbox: backlog of %s: %w", s.s.table, err)
	}
	b.OldestPendingAge = time.Duration(age * float64(time.Second))
	return b, nil
}
