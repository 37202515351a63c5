package postgres

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/watermill-outbox/outbox/internal/dialect"
)

// deadWhere renders a dead-letter filter as a condition on dead-lettered, unpublished events.
func deadWhere(f dialect.DeadFilter, p params) string {
	return dialect.DeadWhere(f, `"dead_lettered_at"`, `"published_at"`,
		func(tp dialect.Topic) string { return topicCond(`"topic"`, tp, p) },
		func(ids []string) string { return `"id" = ANY(` + p.add("id", ids) + `::uuid[])` },
		func() string {
			return `"dead_lettered_at" < now() - ` + p.add("ago", f.OlderThan.Microseconds()) + ` * interval '1 microsecond'`
		}) + narrowDead(f, p)
}

// narrowDead renders DeadFilter's narrowing conditions (Key, ErrorContains, After, Before),
// each preceded by " AND "; "" when there are none. The time bounds read dead_idx's range.
func narrowDead(f dialect.DeadFilter, p params) string {
	var w string
	if f.Key != "" {
		k := p.add("key", f.Key)
		w += ` AND ("ordering_key" = ` + k + ` OR ("ordering_key" IS NULL AND "headers"::json ->> '` + dialect.SkippedKeyHeader + `' = ` + k + `))`
	}
	if f.ErrorContains != "" {
		w += ` AND strpos(lower(COALESCE("last_error", '')), lower(` + p.add("err", f.ErrorContains) + `)) > 0`
	}
	if !f.After.IsZero() {
		w += ` AND "dead_lettered_at" >= ` + p.add("after", f.After) + `::timestamptz`
	}
	if !f.Before.IsZero() {
		w += ` AND "dead_lettered_at" < ` + p.add("before", f.Before) + `::timestamptz`
	}
	return w
}

// RetryDead implements dialect.Dialect.
func (Dialect) RetryDead(ctx context.Context, ex dialect.Executor, t *dialect.Table, f dialect.DeadFilter) (int64, error) {
	p := params{}
	// next_attempt_at = now(): the event is due at once, and the relays' claims find it even
	// below their floors (the walked_retry step of claim.sql's claim).
	return exec(ctx, ex, `UPDATE `+dialect.DoubleQuote(t.Parts...)+` SET "dead_lettered_at" = NULL, "attempts" = 0, "next_attempt_at" = now(), "lease_until" = NULL, "leased_by" = NULL WHERE `+deadWhere(f, p), p, false)
}

// PurgeDead implements dialect.Dialect.
func (Dialect) PurgeDead(ctx context.Context, ex dialect.Executor, t *dialect.Table, f dialect.DeadFilter) (int64, error) {
	p := params{}
	q, where := dialect.DoubleQuote(t.Parts...), deadWhere(f, p)
	return exec(ctx, ex, deleteDead(q, `SELECT "ordering_key", "sequence" FROM `+q+` WHERE `+where, where), p, false)
}

// deleteDead returns a statement that deletes the dead-lettered events matching where and
// makes the next event of each deleted event's key due at once (next_attempt_at = now(), unless
// it has one): that event waited behind the dead letter, below the relays' keyed floors, and
// this is how their claims find it (walked_retry in claim.sql). Its row count is the deleted
// events'. doomed selects the candidates (where, possibly with an order and a limit); the
// DELETE tests where again on each row it deletes, so an event retried meanwhile stays.
func deleteDead(q, doomed, where string) string {
	return `WITH doomed AS MATERIALIZED (` + doomed + `),
touched AS (UPDATE ` + q + ` SET "next_attempt_at" = now() WHERE "sequence" = ANY(ARRAY(
	SELECT (SELECT s."sequence" FROM ` + q + ` s WHERE s."published_at" IS NULL AND s."ordering_key" IS NOT NULL AND s."dead_lettered_at" IS NULL
		AND (s."ordering_key", s."sequence") > (d."ordering_key", d."sequence") AND (s."ordering_key", s."sequence") <= (d."ordering_key", 9223372036854775807)
		ORDER BY s."ordering_key", s."sequence" LIMIT 1) FROM doomed d WHERE d."ordering_key" IS NOT NULL))
	AND "published_at" IS NULL AND "dead_lettered_at" IS NULL AND "next_attempt_at" IS NULL)
DELETE FROM ` + q + ` WHERE "sequence" = ANY(ARRAY(SELECT "sequence" FROM doomed)) AND ` + where
}

// CountDead implements dialect.Dialect.
func (Dialect) CountDead(ctx context.Context, ex dialect.Executor, t *dialect.Table, f dialect.DeadFilter) (int64, error) {
	p := params{}
	rs, err := query(ctx, ex, `SELECT count(*) FROM `+dialect.DoubleQuote(t.Parts...)+` WHERE `+deadWhere(f, p), p, false)
	if err != nil {
		return 0, err
	}
	return dialect.ScanOne[int64](rs)
}

// ListDead implements dialect.Dialect.
func (Dialect) ListDead(ctx context.Context, ex dialect.Executor, t *dialect.Table, f dialect.DeadFilter, limit int) ([]dialect.DeadRow, error) {
	p := params{}
	payload := `"payload"::text`
	if t.Payload == dialect.PayloadBytea {
		payload = `"payload"`
	}
	q := fmt.Sprintf(`SELECT "sequence", "id"::text, "topic", %s, "headers"::text, "ordering_key", "idempotency_key", "created_at", "attempts", "last_error", "dead_lettered_at"
FROM %s WHERE %s ORDER BY "dead_lettered_at", "sequence" LIMIT %d`, payload, dialect.DoubleQuote(t.Parts...), deadWhere(f, p), limit)
	rs, err := query(ctx, ex, q, p, false)
	if err != nil {
		return nil, err
	}
	return dialect.ScanDead(rs)
}

// Cleanup implements dialect.Dialect.
func (Dialect) Cleanup(ctx context.Context, ex dialect.Executor, t *dialect.Table, column string, olderThan time.Duration, batch int) (int64, error) {
	if column == "dead_lettered_at" {
		q := dialect.DoubleQuote(t.Parts...)
		where := `"dead_lettered_at" < now() - @ago * interval '1 microsecond' AND "published_at" IS NULL`
		doomed := fmt.Sprintf(`SELECT "ordering_key", "sequence" FROM %s WHERE %s ORDER BY "dead_lettered_at" LIMIT %d`, q, where, batch)
		return exec(ctx, ex, deleteDead(q, doomed, where), params{"ago": olderThan.Microseconds()}, false)
	}
	q := fmt.Sprintf(`DELETE FROM %[1]s WHERE "sequence" = ANY(ARRAY(SELECT "sequence" FROM %[1]s WHERE %[2]s < now() - @ago * interval '1 microsecond' ORDER BY %[2]s LIMIT %[3]d))`,
		dialect.DoubleQuote(t.Parts...), dialect.DoubleQuote(column), batch)
	return exec(ctx, ex, q, params{"ago": olderThan.Microseconds()}, false)
}

// CountOlder implements dialect.Dialect.
func (Dialect) CountOlder(ctx context.Context, ex dialect.Executor, t *dialect.Table, column string, olderThan time.Duration) (int64, error) {
	if column != "published_at" && column != "dead_lettered_at" {
		return 0, fmt.Errorf("postgres: count: unknown column %q", column)
	}
	q := fmt.Sprintf(`SELECT count(*) FROM %s WHERE %s < now() - @ago * interval '1 microsecond'`, dialect.DoubleQuote(t.Parts...), dialect.DoubleQuote(column))
	if column == "dead_lettered_at" {
		q += ` AND "published_at" IS NULL`
	}
	rs, err := query(ctx, ex, q, params{"ago": olderThan.Microseconds()}, false)
	if err != nil {
		return 0, err
	}
	return dialect.ScanOne[int64](rs)
}

// Backlog implements dialect.Dialect.
func (Dialect) Backlog(ctx context.Context, ex dialect.Executor, t *dialect.Table) (dialect.BacklogRow, error) {
	rs, err := ex.Query(ctx, dialect.BacklogSQL(dialect.DoubleQuote(t.Parts...), "now()", "LEAST"))
	if err != nil {
		return dialect.BacklogRow{}, err
	}
	return dialect.ScanBacklog(rs)
}

// BacklogByTopic implements dialect.Dialect.
func (Dialect) BacklogByTopic(ctx context.Context, ex dialect.Executor, t *dialect.Table) ([]dialect.BacklogRow, error) {
	rs, err := ex.Query(ctx, dialect.BacklogByTopicSQL(dialect.DoubleQuote(t.Parts...), "now()"))
	if err != nil {
		return nil, err
	}
	return dialect.ScanBacklogByTopic(rs)
}

// Columns implements dialect.Dialect.
func (Dialect) Columns(ctx context.Context, ex dialect.Executor, t *dialect.Table) (map[string]bool, error) {
	rs, err := ex.Query(ctx, `SELECT lower(attname::text) FROM pg_attribute WHERE attrelid = to_regclass($1) AND attnum > 0 AND NOT attisdropped`, dialect.DoubleQuote(t.Parts...))
	if err != nil {
		return nil, err
	}
	return dialect.ScanSet(rs)
}

// TableExists implements dialect.Dialect.
func (Dialect) TableExists(ctx context.Context, ex dialect.Executor, t *dialect.Table) (bool, error) {
	rs, err := ex.Query(ctx, `SELECT to_regclass($1) IS NOT NULL`, dialect.DoubleQuote(t.Parts...))
	if err != nil {
		return false, err
	}
	return dialect.ScanOne[bool](rs)
}

// replayWhere renders a replay filter as a condition on published events, served by the
// published_at index (published_idx): the window bounds it.
func replayWhere(f dialect.ReplayFilter, p params) string {
	w := `"published_at" >= ` + p.add("since", f.Since) + ` AND "published_at" < ` + p.add("until", f.Until)
	if f.MaxSeq > 0 {
		w += ` AND "sequence" <= ` + p.add("max", f.MaxSeq)
	}
	if len(f.Topics) > 0 {
		var conds []string
		for _, tp := range f.Topics {
			conds = append(conds, topicCond(`"topic"`, tp, p))
		}
		w += ` AND (` + strings.Join(conds, " OR ") + `)`
	}
	if len(f.Keys) > 0 {
		w += ` AND "ordering_key" = ANY(` + p.add("keys", f.Keys) + `::text[])`
	}
	return w
}

// CountReplay implements dialect.Dialect.
func (Dialect) CountReplay(ctx context.Context, ex dialect.Executor, t *dialect.Table, f dialect.ReplayFilter) (int64, int64, error) {
	p := params{}
	rs, err := query(ctx, ex, `SELECT count(*), max("sequence") FROM `+dialect.DoubleQuote(t.Parts...)+` WHERE `+replayWhere(f, p), p, true)
	if err != nil {
		return 0, 0, err
	}
	return dialect.ScanReplayCount(rs)
}

// ScanReplay implements dialect.Dialect: a range scan of published_idx from the cursor's
// published_at, sorted by sequence within equal times.
func (Dialect) ScanReplay(ctx context.Context, ex dialect.Executor, t *dialect.Table, f dialect.ReplayFilter, after dialect.ReplayMark, limit int) ([]dialect.ReplayMark, error) {
	p := params{}
	w := replayWhere(f, p)
	start := p.add("from", dialect.ReplayStart(f, after))
	w += ` AND "published_at" >= ` + start + ` AND ("published_at", "sequence") > (` + start + `, ` + p.add("after", after.Sequence) + `)`
	q := fmt.Sprintf(`SELECT "published_at", "sequence" FROM %s WHERE %s ORDER BY "published_at", "sequence" LIMIT %d`, dialect.DoubleQuote(t.Parts...), w, limit)
	rs, err := query(ctx, ex, q, p, true)
	if err != nil {
		return nil, err
	}
	return dialect.ScanReplayMarks(rs, limit)
}

// ReadReplay implements dialect.Dialect: primary-key lookups.
func (Dialect) ReadReplay(ctx context.Context, ex dialect.Executor, t *dialect.Table, seqs []int64) ([]dialect.ReplayRow, error) {
	payload := `"payload"::text`
	if t.Payload == dialect.PayloadBytea {
		payload = `"payload"`
	}
	extra := `NULL::text`
	if len(t.Extra) > 0 {
		var parts []string
		for _, c := range t.Extra {
			parts = append(parts, dialect.SingleQuote(c.Name)+`, `+dialect.DoubleQuote(c.Name))
		}
		extra = `json_build_object(` + strings.Join(parts, ", ") + `)::text`
	}
	q := fmt.Sprintf(`SELECT "sequence", "id"::text, "topic", %s, "headers"::text, "ordering_key", %s FROM %s WHERE "sequence" = ANY(@seqs::bigint[]) ORDER BY "sequence"`,
		payload, extra, dialect.DoubleQuote(t.Parts...))
	rs, err := query(ctx, ex, q, params{"seqs": seqs}, false)
	if err != nil {
		return nil, err
	}
	return dialect.ScanReplayRows(rs, len(seqs))
}
