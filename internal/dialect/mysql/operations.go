package mysql

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/watermill-outbox/outbox/internal/dialect"
)

// deadWhere renders f as a condition on dead-lettered, unpublished events (read through the
// dead_lettered_at index).
func deadWhere(f dialect.DeadFilter, args *[]any) string {
	return dialect.DeadWhere(f, "o.`dead_lettered_at`", "o.`published_at`",
		func(tp dialect.Topic) string { return topicSQL(tp, "o.`topic`", args) },
		func(ids []string) string { return listSQL("o.`id`", ids, args) },
		func() string {
			*args = append(*args, f.OlderThan.Microseconds())
			return "o.`dead_lettered_at` < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND"
		}) + narrowDead(f, args)
}

// narrowDead renders DeadFilter's narrowing conditions (Key, ErrorContains, After, Before) on
// o, each preceded by " AND "; "" when there are none. The time bounds read the
// dead_lettered_at index's range.
func narrowDead(f dialect.DeadFilter, args *[]any) string {
	var w string
	if f.Key != "" {
		*args = append(*args, f.Key, f.Key)
		w += " AND (o.`ordering_key` = ? OR (o.`ordering_key` IS NULL AND JSON_UNQUOTE(JSON_EXTRACT(o.`headers`, '$.\"" + dialect.SkippedKeyHeader + "\"')) = ?))"
	}
	if f.ErrorContains != "" {
		*args = append(*args, f.ErrorContains)
		w += " AND LOCATE(LOWER(?), LOWER(COALESCE(o.`last_error`, ''))) > 0"
	}
	if !f.After.IsZero() {
		*args = append(*args, timeText(f.After))
		w += " AND o.`dead_lettered_at` >= ?"
	}
	if !f.Before.IsZero() {
		*args = append(*args, timeText(f.Before))
		w += " AND o.`dead_lettered_at` < ?"
	}
	return w
}

// execRC runs one statement in a READ COMMITTED transaction of its own (or the caller's): no
// gap locks, so a range DELETE or UPDATE never blocks writers' inserts next to its range.
func execRC(ctx context.Context, ex dialect.Executor, stmt string, args ...any) (int64, error) {
	var n int64
	err := inTx(ctx, ex, sql.LevelReadCommitted, func(q querier) error {
		var err error
		n, err = q.exec(ctx, stmt, args...)
		return err
	})
	return n, err
}

// RetryDead gives the selected dead-lettered events fresh attempts (attempts 0, due now,
// last_error kept) and returns how many.
func (*Dialect) RetryDead(ctx context.Context, ex dialect.Executor, t *dialect.Table, f dialect.DeadFilter) (int64, error) {
	var args []any
	w := deadWhere(f, &args)
	return execRC(ctx, ex, "UPDATE "+namesOf(t).table+" o SET o.`dead_lettered_at` = NULL, o.`attempts` = 0, o.`next_attempt_at` = NULL, o.`lease_until` = NULL, o.`leased_by` = NULL WHERE "+w, args...)
}

// PurgeDead deletes the selected dead-lettered events and returns how many.
func (*Dialect) PurgeDead(ctx context.Context, ex dialect.Executor, t *dialect.Table, f dialect.DeadFilter) (int64, error) {
	var args []any
	w := deadWhere(f, &args)
	return execRC(ctx, ex, "DELETE o FROM "+namesOf(t).table+" o WHERE "+w, args...)
}

// CountDead returns how many dead-lettered events f selects.
func (*Dialect) CountDead(ctx context.Context, ex dialect.Executor, t *dialect.Table, f dialect.DeadFilter) (int64, error) {
	var args []any
	w := deadWhere(f, &args)
	return countOne(ctx, ex, "SELECT COUNT(*) FROM "+namesOf(t).table+" o WHERE "+w, args...)
}

// countOne runs a statement that returns one count.
func countOne(ctx context.Context, ex dialect.Executor, stmt string, args ...any) (int64, error) {
	rs, err := ex.Query(ctx, stmt, args...)
	if err != nil {
		return 0, err
	}
	return dialect.ScanOne[int64](rs)
}

// ListDead returns up to limit selected dead-lettered events, oldest dead letter first.
func (*Dialect) ListDead(ctx context.Context, ex dialect.Executor, t *dialect.Table, f dialect.DeadFilter, limit int) ([]dialect.DeadRow, error) {
	var args []any
	w := deadWhere(f, &args)
	stmt := "SELECT o.`sequence`, o.`id`, o.`topic`, o.`payload`, o.`headers`, o.`ordering_key`, o.`idempotency_key`, " + selectTime("o.`created_at`") + ", o.`attempts`, o.`last_error`, " + selectTime("o.`dead_lettered_at`") + " FROM " +
		namesOf(t).table + " o WHERE " + w + " ORDER BY o.`dead_lettered_at`, o.`sequence` LIMIT " + itoa(max(limit, 0))
	rs, err := ex.Query(ctx, stmt, args...)
	if err != nil {
		return nil, err
	}
	var out []dialect.DeadRow
	err = scanEach(rs, func(rs dialect.Rows) error {
		var (
			d    dialect.DeadRow
			hdrs []byte
		)
		if err := rs.Scan(&d.Sequence, &d.ID, &d.Topic, &d.Payload, &hdrs, &d.OrderingKey, &d.IdempotencyKey, (*dbTime)(&d.CreatedAt), &d.Attempts, &d.LastError, (*dbTime)(&d.DeadLetteredAt)); err != nil {
			return err
		}
		d.Headers = string(hdrs)
		out = append(out, d)
		return nil
	})
	return out, err
}

// Cleanup deletes up to batch rows whose column (published_at or dead_lettered_at) is older
// than olderThan (database clock), oldest first, through that column's index, and returns how
// many it deleted. It runs READ COMMITTED (no gap locks in the way of writers).
func (*Dialect) Cleanup(ctx context.Context, ex dialect.Executor, t *dialect.Table, column string, olderThan time.Duration, batch int) (int64, error) {
	if column != "published_at" && column != "dead_lettered_at" {
		return 0, fmt.Errorf("mysql: cleanup: unknown column %q", column)
	}
	if batch < 1 {
		return 0, fmt.Errorf("mysql: cleanup: batch %d < 1", batch)
	}
	c := ident(column)
	stmt := "DELETE FROM " + namesOf(t).table + " WHERE " + c + " < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND ORDER BY " + c + " LIMIT " + itoa(batch)
	return execRC(ctx, ex, stmt, olderThan.Microseconds())
}

// CountOlder returns how many rows Cleanup of column and olderThan would delete.
func (*Dialect) CountOlder(ctx context.Context, ex dialect.Executor, t *dialect.Table, column string, olderThan time.Duration) (int64, error) {
	if column != "published_at" && column != "dead_lettered_at" {
		return 0, fmt.Errorf("mysql: count: unknown column %q", column)
	}
	return countOne(ctx, ex, "SELECT COUNT(*) FROM "+namesOf(t).table+" WHERE "+ident(column)+" < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND", olderThan.Microseconds())
}

// failedHeads selects each key whose head (its lowest unpublished event) failed: dead-lettered
// or pending with attempts > 0, with the head's sequence (k, s). It reads the unpublished
// keyed rows through the key index (forced: the planner picked a full scan of the table's
// history, 109,296 rows for 10,000 pending) and checks each failed one with one dive.
func failedHeads(t *dialect.Table) string {
	n := namesOf(t)
	return "SELECT h.`outbox_key` AS k, h.`sequence` AS s FROM " + n.table + " h FORCE INDEX (" + n.keyIdx + ")" +
		" WHERE h.`outbox_key` IS NOT NULL AND (h.`dead_lettered_at` IS NOT NULL OR h.`attempts` > 0)" +
		" AND h.`sequence` = (SELECT e.`sequence` FROM " + n.table + " e FORCE INDEX (" + n.keyIdx + ") WHERE e.`outbox_key` = h.`outbox_key` ORDER BY e.`sequence` LIMIT 1)"
}

// Backlog returns the table's backlog in one statement that reads live rows only: pending
// counts through the pending index (outbox_pending 0 and 1), the oldest pending event as the
// lowest sequence of each kind, dead letters through the dead_lettered_at index, unavailable
// among the pending rows (the pending events of each topic with a pending event classed
// unavailable, one pass grouped by topic), and Held: for each failed head (see failedHeads), its key's later
// events that are not dead-lettered (one range of the key index each).
func (*Dialect) Backlog(ctx context.Context, ex dialect.Executor, t *dialect.Table) (dialect.BacklogRow, error) {
	rs, err := ex.Query(ctx, backlogSQL(t))
	if err != nil {
		return dialect.BacklogRow{}, err
	}
	var b dialect.BacklogRow
	err = scanEach(rs, func(rs dialect.Rows) error {
		return rs.Scan(&b.Pending, (*dbTime)(&b.Oldest), &b.DeadLettered, (*dbTime)(&b.Now), &b.Unavailable, &b.Held)
	})
	return b, err
}

// backlogSQL is Backlog's statement.
func backlogSQL(t *dialect.Table) string {
	tb := namesOf(t).table
	from := "FROM " + tb + " p FORCE INDEX (" + namesOf(t).pending + ")"
	pend := from + " WHERE p.`outbox_pending` IN (0, 1)"
	stmt := "SELECT" +
		" (SELECT COUNT(*) " + pend + ")," +
		" " + selectTime("LEAST(COALESCE(u.c, k.c), COALESCE(k.c, u.c))") + "," +
		" (SELECT COUNT(*) FROM " + tb + " d WHERE d.`dead_lettered_at` IS NOT NULL)," +
		" " + selectTime("UTC_TIMESTAMP(6)") + "," +
		" (SELECT COALESCE(SUM(x.n), 0) FROM (SELECT COUNT(*) AS n " + pend + " GROUP BY p.`topic` HAVING MAX(p.`last_error_class` <=> 'unavailable') = 1) x)," +
		" (SELECT COALESCE(SUM((SELECT COUNT(*) FROM " + tb + " r WHERE r.`outbox_key` = f.k AND r.`sequence` > f.s AND r.`dead_lettered_at` IS NULL)), 0) FROM (" + failedHeads(t) + ") f)" +
		" FROM (SELECT (SELECT p.`created_at` " + from + " WHERE p.`outbox_pending` = 0 ORDER BY p.`sequence` LIMIT 1) AS c) u," +
		" (SELECT (SELECT p.`created_at` " + from + " WHERE p.`outbox_pending` = 1 ORDER BY p.`sequence` LIMIT 1) AS c) k"
	return stmt
}

// BacklogByTopic returns the backlog of every topic with unpublished events, sorted by topic
// (byte order). It reads every unpublished row (published_at IS NULL through its index).
func (*Dialect) BacklogByTopic(ctx context.Context, ex dialect.Executor, t *dialect.Table) ([]dialect.BacklogRow, error) {
	tb := namesOf(t).table
	stmt := "SELECT o.`topic`," +
		" SUM(o.`dead_lettered_at` IS NULL)," +
		" " + selectTime("MIN(IF(o.`dead_lettered_at` IS NULL, o.`created_at`, NULL))") + "," +
		" SUM(o.`dead_lettered_at` IS NOT NULL)," +
		" " + selectTime("UTC_TIMESTAMP(6)") + "," +
		// <=>: NULL = 'unavailable' is NULL, and SUM over a topic whose events never failed
		// would be NULL, not 0.
		" IF(SUM(o.`dead_lettered_at` IS NULL AND o.`last_error_class` <=> 'unavailable') > 0, SUM(o.`dead_lettered_at` IS NULL), 0)," +
		" SUM(o.`dead_lettered_at` IS NULL AND f.s IS NOT NULL AND o.`sequence` > f.s)" +
		" FROM " + tb + " o LEFT JOIN (" + failedHeads(t) + ") f ON f.k = o.`outbox_key`" +
		" WHERE o.`published_at` IS NULL GROUP BY o.`topic` ORDER BY o.`topic`"
	rs, err := ex.Query(ctx, stmt)
	if err != nil {
		return nil, err
	}
	var out []dialect.BacklogRow
	err = scanEach(rs, func(rs dialect.Rows) error {
		var b dialect.BacklogRow
		if err := rs.Scan(&b.Topic, &b.Pending, (*dbTime)(&b.Oldest), &b.DeadLettered, (*dbTime)(&b.Now), &b.Unavailable, &b.Held); err != nil {
			return err
		}
		out = append(out, b)
		return nil
	})
	return out, err
}

// replayWhere renders a replay filter as a condition on published events (o), read through the
// published_at index.
func replayWhere(f dialect.ReplayFilter, args *[]any) string {
	*args = append(*args, timeText(f.Since), timeText(f.Until))
	w := "o.`published_at` >= ? AND o.`published_at` < ?"
	if f.MaxSeq > 0 {
		*args = append(*args, f.MaxSeq)
		w += " AND o.`sequence` <= ?"
	}
	if len(f.Topics) > 0 {
		var conds []string
		for _, tp := range f.Topics {
			conds = append(conds, topicSQL(tp, "o.`topic`", args))
		}
		w += " AND (" + strings.Join(conds, " OR ") + ")"
	}
	if len(f.Keys) > 0 {
		w += " AND " + listSQL("o.`ordering_key`", f.Keys, args)
	}
	return w
}

// publishedIdx is the FORCE INDEX clause of the published_at index: the window bounds the scan.
func publishedIdx(t *dialect.Table) string {
	return " FORCE INDEX (" + ident(t.IndexBase+"_published_idx") + ")"
}

// CountReplay implements dialect.Dialect.
func (*Dialect) CountReplay(ctx context.Context, ex dialect.Executor, t *dialect.Table, f dialect.ReplayFilter) (int64, int64, error) {
	var args []any
	w := replayWhere(f, &args)
	rs, err := ex.Query(ctx, "SELECT COUNT(*), MAX(o.`sequence`) FROM "+namesOf(t).table+" o"+publishedIdx(t)+" WHERE "+w, args...)
	if err != nil {
		return 0, 0, err
	}
	return dialect.ScanReplayCount(rs)
}

// ScanReplay implements dialect.Dialect.
func (*Dialect) ScanReplay(ctx context.Context, ex dialect.Executor, t *dialect.Table, f dialect.ReplayFilter, after dialect.ReplayMark, limit int) ([]dialect.ReplayMark, error) {
	var args []any
	w := replayWhere(f, &args)
	start := timeText(dialect.ReplayStart(f, after))
	args = append(args, start, start, after.Sequence)
	w += " AND o.`published_at` >= ? AND (o.`published_at` > ? OR o.`sequence` > ?)"
	rs, err := ex.Query(ctx, "SELECT "+selectTime("o.`published_at`")+", o.`sequence` FROM "+namesOf(t).table+" o"+publishedIdx(t)+" WHERE "+w+
		" ORDER BY o.`published_at`, o.`sequence` LIMIT "+itoa(max(limit, 0)), args...)
	if err != nil {
		return nil, err
	}
	return dialect.ScanReplayMarks(rs, limit)
}

// ReadReplay implements dialect.Dialect.
func (*Dialect) ReadReplay(ctx context.Context, ex dialect.Executor, t *dialect.Table, seqs []int64) ([]dialect.ReplayRow, error) {
	extra := "NULL"
	if len(t.Extra) > 0 {
		var parts []string
		for _, c := range t.Extra {
			parts = append(parts, dialect.SingleQuote(c.Name)+", o."+ident(c.Name))
		}
		extra = "JSON_OBJECT(" + strings.Join(parts, ", ") + ")"
	}
	var args []any
	in := listSQL("o.`sequence`", seqs, &args)
	rs, err := ex.Query(ctx, "SELECT o.`sequence`, o.`id`, o.`topic`, o.`payload`, o.`headers`, o.`ordering_key`, "+extra+" FROM "+namesOf(t).table+" o WHERE "+in+" ORDER BY o.`sequence`", args...)
	if err != nil {
		return nil, err
	}
	return dialect.ScanReplayRows(rs, len(seqs))
}
