package sqlite

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/watermill-outbox/outbox/internal/dialect"
)

// deadWhere renders a dead-letter filter as a condition on dead-lettered, unpublished events.
func deadWhere(f dialect.DeadFilter, args *[]any) string {
	return dialect.DeadWhere(f, `"dead_lettered_at"`, `"published_at"`,
		func(tp dialect.Topic) string { return topicCond(`"topic"`, tp, args) },
		func(ids []string) string {
			return `"id" IN (SELECT value FROM json_each(` + param(args, dialect.JSONList(ids)) + `))`
		},
		func() string { return `"dead_lettered_at" < ` + param(args, micros(time.Now().Add(-f.OlderThan))) }) + narrowDead(f, args)
}

// narrowDead renders DeadFilter's narrowing conditions (Key, ErrorContains, After, Before),
// each preceded by " AND "; "" when there are none. The time bounds read dead_idx's range.
// ErrorContains ignores the case of ASCII letters only (SQLite's lower()).
func narrowDead(f dialect.DeadFilter, args *[]any) string {
	var w string
	if f.Key != "" {
		k := param(args, f.Key)
		w += ` AND ("ordering_key" = ` + k + ` OR ("ordering_key" IS NULL AND json_extract("headers", '$."` + dialect.SkippedKeyHeader + `"') = ` + k + `))`
	}
	if f.ErrorContains != "" {
		w += ` AND instr(lower(COALESCE("last_error", '')), lower(` + param(args, f.ErrorContains) + `)) > 0`
	}
	if !f.After.IsZero() {
		w += ` AND "dead_lettered_at" >= ` + param(args, micros(f.After))
	}
	if !f.Before.IsZero() {
		w += ` AND "dead_lettered_at" < ` + param(args, micros(f.Before))
	}
	return w
}

// execInTurn runs the write q within the process's turn to write through ex (see gate.go), like
// the relay's and the Publishers' own writes. Outside the turn an operation met those writers in
// the busy handler, where a writer taking the lock right after each turn ends can starve it:
// a cleanup beside a busy relay failed with SQLITE_BUSY after the whole busy timeout.
func execInTurn(ctx context.Context, ex dialect.Executor, q string, args ...any) (n int64, err error) {
	err = inTurn(ctx, ex, func() error {
		n, err = ex.Exec(ctx, q, args...)
		return err
	})
	return n, err
}

// RetryDead implements dialect.Dialect.
func (Dialect) RetryDead(ctx context.Context, ex dialect.Executor, t *dialect.Table, f dialect.DeadFilter) (int64, error) {
	var args []any
	return execInTurn(ctx, ex, `UPDATE `+quote(t)+` SET "dead_lettered_at" = NULL, "attempts" = 0, "next_attempt_at" = NULL, "lease_until" = NULL, "leased_by" = NULL WHERE `+deadWhere(f, &args), args...)
}

// PurgeDead implements dialect.Dialect.
func (Dialect) PurgeDead(ctx context.Context, ex dialect.Executor, t *dialect.Table, f dialect.DeadFilter) (int64, error) {
	var args []any
	return execInTurn(ctx, ex, `DELETE FROM `+quote(t)+` WHERE `+deadWhere(f, &args), args...)
}

// CountDead implements dialect.Dialect.
func (Dialect) CountDead(ctx context.Context, ex dialect.Executor, t *dialect.Table, f dialect.DeadFilter) (int64, error) {
	var args []any
	rs, err := ex.Query(ctx, `SELECT count(*) FROM `+quote(t)+` WHERE `+deadWhere(f, &args), args...)
	if err != nil {
		return 0, err
	}
	return dialect.ScanOne[int64](rs)
}

// ListDead implements dialect.Dialect.
func (Dialect) ListDead(ctx context.Context, ex dialect.Executor, t *dialect.Table, f dialect.DeadFilter, limit int) ([]dialect.DeadRow, error) {
	var args []any
	q := fmt.Sprintf(`SELECT "sequence", "id", "topic", "payload", "headers", "ordering_key", "idempotency_key", "created_at", "attempts", "last_error", "dead_lettered_at"
FROM %s WHERE %s ORDER BY "dead_lettered_at", "sequence" LIMIT %d`, quote(t), deadWhere(f, &args), limit)
	rs, err := ex.Query(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	return dialect.ScanDead(rs)
}

// Cleanup implements dialect.Dialect.
func (Dialect) Cleanup(ctx context.Context, ex dialect.Executor, t *dialect.Table, column string, olderThan time.Duration, batch int) (int64, error) {
	q := fmt.Sprintf(`DELETE FROM %[1]s WHERE "sequence" IN (SELECT "sequence" FROM %[1]s WHERE %[2]s < $1 ORDER BY %[2]s LIMIT %[3]d)`,
		quote(t), dialect.DoubleQuote(column), batch)
	return execInTurn(ctx, ex, q, micros(time.Now().Add(-olderThan)))
}

// CountOlder implements dialect.Dialect.
func (Dialect) CountOlder(ctx context.Context, ex dialect.Executor, t *dialect.Table, column string, olderThan time.Duration) (int64, error) {
	if column != "published_at" && column != "dead_lettered_at" {
		return 0, fmt.Errorf("sqlite: count: unknown column %q", column)
	}
	rs, err := ex.Query(ctx, fmt.Sprintf(`SELECT count(*) FROM %s WHERE %s < $1`, quote(t), dialect.DoubleQuote(column)), micros(time.Now().Add(-olderThan)))
	if err != nil {
		return 0, err
	}
	return dialect.ScanOne[int64](rs)
}

// Backlog implements dialect.Dialect.
func (Dialect) Backlog(ctx context.Context, ex dialect.Executor, t *dialect.Table) (dialect.BacklogRow, error) {
	rs, err := ex.Query(ctx, dialect.BacklogSQL(quote(t), "$1", "min"), micros(time.Now()))
	if err != nil {
		return dialect.BacklogRow{}, err
	}
	return dialect.ScanBacklog(rs)
}

// BacklogByTopic implements dialect.Dialect.
func (Dialect) BacklogByTopic(ctx context.Context, ex dialect.Executor, t *dialect.Table) ([]dialect.BacklogRow, error) {
	rs, err := ex.Query(ctx, dialect.BacklogByTopicSQL(quote(t), "$1"), micros(time.Now()))
	if err != nil {
		return nil, err
	}
	return dialect.ScanBacklogByTopic(rs)
}

// replayWhere renders a replay filter as a condition on published events (published_at
// microseconds, served by the published_at index).
func replayWhere(f dialect.ReplayFilter, args *[]any) string {
	w := `"published_at" >= ` + param(args, micros(f.Since)) + ` AND "published_at" < ` + param(args, micros(f.Until))
	if f.MaxSeq > 0 {
		w += ` AND "sequence" <= ` + param(args, f.MaxSeq)
	}
	if len(f.Topics) > 0 {
		var conds []string
		for _, tp := range f.Topics {
			conds = append(conds, topicCond(`"topic"`, tp, args))
		}
		w += ` AND (` + strings.Join(conds, " OR ") + `)`
	}
	if len(f.Keys) > 0 {
		w += ` AND "ordering_key" IN (SELECT value FROM json_each(` + param(args, dialect.JSONList(f.Keys)) + `))`
	}
	return w
}

// CountReplay implements dialect.Dialect.
func (Dialect) CountReplay(ctx context.Context, ex dialect.Executor, t *dialect.Table, f dialect.ReplayFilter) (int64, int64, error) {
	var args []any
	rs, err := ex.Query(ctx, `SELECT count(*), max("sequence") FROM `+quote(t)+` WHERE `+replayWhere(f, &args), args...)
	if err != nil {
		return 0, 0, err
	}
	return dialect.ScanReplayCount(rs)
}

// ScanReplay implements dialect.Dialect.
func (Dialect) ScanReplay(ctx context.Context, ex dialect.Executor, t *dialect.Table, f dialect.ReplayFilter, after dialect.ReplayMark, limit int) ([]dialect.ReplayMark, error) {
	var args []any
	w := replayWhere(f, &args)
	start := param(&args, micros(dialect.ReplayStart(f, after)))
	w += ` AND "published_at" >= ` + start + ` AND ("published_at" > ` + start + ` OR "sequence" > ` + param(&args, after.Sequence) + `)`
	rs, err := ex.Query(ctx, fmt.Sprintf(`SELECT "published_at", "sequence" FROM %s WHERE %s ORDER BY "published_at", "sequence" LIMIT %d`, quote(t), w, limit), args...)
	if err != nil {
		return nil, err
	}
	return dialect.ScanReplayMarks(rs, limit)
}

// ReadReplay implements dialect.Dialect.
func (Dialect) ReadReplay(ctx context.Context, ex dialect.Executor, t *dialect.Table, seqs []int64) ([]dialect.ReplayRow, error) {
	extra := `NULL`
	if len(t.Extra) > 0 {
		var parts []string
		for _, c := range t.Extra {
			parts = append(parts, dialect.SingleQuote(c.Name)+`, `+dialect.DoubleQuote(c.Name))
		}
		extra = `json_object(` + strings.Join(parts, ", ") + `)`
	}
	list, err := json.Marshal(seqs)
	if err != nil {
		return nil, err
	}
	rs, err := ex.Query(ctx, fmt.Sprintf(`SELECT "sequence", "id", "topic", "payload", "headers", "ordering_key", %s FROM %s WHERE "sequence" IN (SELECT value FROM json_each($1)) ORDER BY "sequence"`,
		extra, quote(t)), string(list))
	if err != nil {
		return nil, err
	}
	return dialect.ScanReplayRows(rs, len(seqs))
}
