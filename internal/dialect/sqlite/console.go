package sqlite

import (
	"context"
	"fmt"
	"time"

	"github.com/watermill-outbox/outbox/internal/dialect"
)

var _ dialect.Operator = Dialect{}

// pendingAfter is the condition that r is a pending event of key expression k after sequence
// expression s (a range of key_idx).
func pendingAfter(k, s string) string {
	return `r."published_at" IS NULL AND r."ordering_key" = ` + k + ` AND r."sequence" > ` + s + ` AND r."dead_lettered_at" IS NULL`
}

// BlockedKeys implements dialect.Operator. heads is each key's head, read from key_idx alone
// (min("sequence") per key over the unpublished keyed events: O(pending and dead-lettered
// keyed events), never the history); failed keeps the heads that failed or are dead-lettered
// (one primary-key read each), sorted by sequence; the check that a pending event waits behind
// a head then runs only until limit keys are found, and the held events are counted for the
// keys shown only, at most dialect.HeldCountLimit each (a key_idx range each).
func (Dialect) BlockedKeys(ctx context.Context, ex dialect.Executor, t *dialect.Table, limit int) ([]dialect.BlockedKeyRow, error) {
	q := quote(t)
	sql := fmt.Sprintf(`WITH heads AS MATERIALIZED (
	SELECT "ordering_key" AS k, min("sequence") AS s FROM %[1]s INDEXED BY %[2]s
	WHERE "published_at" IS NULL AND "ordering_key" IS NOT NULL GROUP BY "ordering_key"
), failed AS MATERIALIZED (
	SELECT hd.k, o."sequence", o."id", o."topic", o."attempts", o."last_error", o."next_attempt_at", o."dead_lettered_at", o."created_at"
	FROM heads hd CROSS JOIN %[1]s o ON o."sequence" = hd.s
	WHERE o."dead_lettered_at" IS NOT NULL OR o."attempts" > 0
	ORDER BY o."sequence"
)
SELECT f.k, f."sequence", f."id", f."topic", f."attempts", f."last_error", f."next_attempt_at", f."dead_lettered_at", f."created_at",
	(SELECT count(*) FROM (SELECT 1 FROM %[1]s r WHERE %[5]s LIMIT %[4]d))
FROM failed f
WHERE EXISTS (SELECT 1 FROM %[1]s r WHERE %[5]s)
ORDER BY f."sequence" LIMIT %[3]d`, q, index(t, "key_idx"), limit, dialect.HeldCountLimit, pendingAfter(`f.k`, `f."sequence"`))
	now := time.Now()
	rs, err := ex.Query(ctx, sql)
	if err != nil {
		return nil, err
	}
	defer rs.Close()
	var out []dialect.BlockedKeyRow
	for rs.Next() {
		b := dialect.BlockedKeyRow{Now: now}
		if err := rs.Scan(&b.Key, &b.Sequence, &b.ID, &b.Topic, &b.Attempts, &b.LastError, (*dialect.Time)(&b.NextAttemptAt),
			(*dialect.Time)(&b.DeadLetteredAt), (*dialect.Time)(&b.CreatedAt), &b.Held); err != nil {
			return nil, err
		}
		out = append(out, b)
	}
	return out, rs.Err()
}

// headGuard is the condition that event $1 of key $2 is still that key's head (its lowest
// unpublished event), failed or dead-lettered, and not leased (in flight) by a relay at $3
// (the clock, microseconds).
func headGuard(q string) string {
	return `"sequence" = $1 AND "ordering_key" = $2 AND "published_at" IS NULL AND ("dead_lettered_at" IS NOT NULL OR "attempts" > 0)
	AND ("lease_until" IS NULL OR "lease_until" < $3)
	AND "sequence" = (SELECT min(e."sequence") FROM ` + q + ` e WHERE e."published_at" IS NULL AND e."ordering_key" = $2)`
}

// ActOnHead implements dialect.Operator: one transaction within the process's turn to write,
// whose first statement changes the head only while headGuard holds (so it takes SQLite's
// write lock before it reads anything), and, when it did and the head left the key's way,
// makes the key's next event due at once.
func (Dialect) ActOnHead(ctx context.Context, ex dialect.Executor, t *dialect.Table, key string, seq int64, a dialect.HeadAction) (n int64, err error) {
	q := quote(t)
	guard := headGuard(q)
	var head, next string
	switch a {
	case dialect.HeadRetry:
		head = `UPDATE ` + q + ` SET "next_attempt_at" = $3, "attempts" = CASE WHEN "dead_lettered_at" IS NULL THEN "attempts" ELSE 0 END, "dead_lettered_at" = NULL WHERE ` + guard
	case dialect.HeadSkip:
		// The head leaves its key (ordering_key NULL, the key kept in a header) as a dead
		// letter; the key's next unpublished event, when pending, is made due now.
		head = `UPDATE ` + q + ` SET "dead_lettered_at" = COALESCE("dead_lettered_at", $3), "next_attempt_at" = NULL, "ordering_key" = NULL,
	"headers" = json_set("headers", '$."` + dialect.SkippedKeyHeader + `"', "ordering_key") WHERE ` + guard
		next = `UPDATE ` + q + ` SET "next_attempt_at" = $3 WHERE "sequence" = (SELECT min(s."sequence") FROM ` + q + ` s WHERE s."published_at" IS NULL AND s."ordering_key" = $2 AND s."sequence" > $1)
	AND "published_at" IS NULL AND "dead_lettered_at" IS NULL AND "next_attempt_at" IS NULL`
	case dialect.HeadPurge:
		// As PurgeDead: the key's next pending event is made due now.
		head = `DELETE FROM ` + q + ` WHERE ` + guard
		next = `UPDATE ` + q + ` SET "next_attempt_at" = $3 WHERE "sequence" = (SELECT min(s."sequence") FROM ` + q + ` s WHERE s."published_at" IS NULL AND s."ordering_key" = $2 AND s."sequence" > $1 AND s."dead_lettered_at" IS NULL)
	AND "published_at" IS NULL AND "dead_lettered_at" IS NULL AND "next_attempt_at" IS NULL`
	default:
		return 0, fmt.Errorf("sqlite: unknown head action %d", a)
	}
	err = withRelayTx(ctx, ex, false, false, func(ex dialect.Executor) error {
		now := micros(time.Now())
		var err error
		if n, err = ex.Exec(ctx, head, seq, key, now); err != nil || n == 0 || next == "" {
			return err
		}
		_, err = ex.Exec(ctx, next, seq, key, now)
		return err
	})
	if err != nil {
		return 0, err
	}
	return n, nil
}

// DeliveryStats implements dialect.Operator: published_idx's newest entries within the
// window, at most maxRows+1 of them (the extra one tells that the window holds more; the
// oldest minute read is then partial and left out), grouped by minute; the 95th percentile is
// interpolated between the two delays around its place (dialect.P95), which a window function
// numbers within each minute.
func (Dialect) DeliveryStats(ctx context.Context, ex dialect.Executor, t *dialect.Table, window time.Duration, maxRows int) (dialect.DeliveryStatsRow, error) {
	sql := fmt.Sprintf(`WITH p AS MATERIALIZED (
	SELECT "published_at" AS pa, max("published_at" - "created_at", 0) AS d FROM %[1]s INDEXED BY %[2]s
	WHERE "published_at" IS NOT NULL AND "published_at" >= $1 ORDER BY "published_at" DESC LIMIT %[3]d
), g AS (
	SELECT pa / 60000000 AS m, d, row_number() OVER (PARTITION BY pa / 60000000 ORDER BY d) - 1 AS i,
		CAST(0.95 * (count(*) OVER (PARTITION BY pa / 60000000) - 1) AS INTEGER) AS at FROM p
)
SELECT m, count(*), avg(d), max(d), max(at), max(CASE WHEN i = at THEN d END), max(CASE WHEN i = at + 1 THEN d END), $2
FROM g GROUP BY m ORDER BY m`, quote(t), index(t, "published_idx"), maxRows+1)
	now := time.Now()
	rs, err := ex.Query(ctx, sql, micros(now.Add(-window)), micros(now))
	if err != nil {
		return dialect.DeliveryStatsRow{}, err
	}
	return dialect.ScanStats(rs, maxRows)
}

// Leases implements dialect.Operator: each pending index (unordered_idx, keyed_idx) is read in
// sequence order, at most dialect.LeaseScan entries, keeping its first limit+1 unexpired leases;
// the first limit+1 of both by sequence are grouped in Go (dialect.GroupLeases).
func (Dialect) Leases(ctx context.Context, ex dialect.Executor, t *dialect.Table, limit int) (dialect.LeasesRow, error) {
	branch := func(idx, keyed string) string {
		return fmt.Sprintf(`SELECT * FROM (SELECT w."sequence", w."leased_by", w."lease_until" FROM (SELECT "sequence", "leased_by", "lease_until" FROM %s INDEXED BY %s
		WHERE "published_at" IS NULL AND "dead_lettered_at" IS NULL AND "ordering_key" %s ORDER BY "sequence" LIMIT %d) w
		WHERE w."leased_by" IS NOT NULL AND w."lease_until" > $1 LIMIT %d)`, quote(t), index(t, idx), keyed, dialect.LeaseScan, limit+1)
	}
	sql := `SELECT l."leased_by", l."lease_until", $2 FROM (` + branch("unordered_idx", "IS NULL") + `
	UNION ALL ` + branch("keyed_idx", "IS NOT NULL") + `) l ORDER BY l."sequence" LIMIT ` + fmt.Sprint(limit+1)
	now := time.Now()
	rs, err := ex.Query(ctx, sql, micros(now), micros(now))
	if err != nil {
		return dialect.LeasesRow{}, err
	}
	return dialect.ScanLeases(rs, limit)
}

// BacklogOverview implements dialect.Operator: BacklogByTopic over bounded reads, so that its
// cost is O(limit) whatever the backlog and the history. u and k are the oldest limit events
// of unordered_idx and keyed_idx, d the limit earliest entries of dead_idx; h is the head of
// each key of k (one key_idx probe each: min("sequence") of its unpublished events, a
// dead-lettered one included) and f those heads that failed or are dead-lettered (one
// primary-key read each). A keyed event read is held when its key's failed head is below it.
// The last four columns count the rows read of each kind (f: the failed heads found), the same
// on every row.
func (Dialect) BacklogOverview(ctx context.Context, ex dialect.Executor, t *dialect.Table, limit int) (dialect.OverviewRow, error) {
	sql := fmt.Sprintf(`WITH u AS MATERIALIZED (SELECT "topic", "created_at", "last_error_class" FROM %[1]s INDEXED BY %[3]s
	WHERE "published_at" IS NULL AND "dead_lettered_at" IS NULL AND "ordering_key" IS NULL ORDER BY "sequence" LIMIT %[2]d),
k AS MATERIALIZED (SELECT "topic", "created_at", "last_error_class", "ordering_key", "sequence" FROM %[1]s INDEXED BY %[4]s
	WHERE "published_at" IS NULL AND "dead_lettered_at" IS NULL AND "ordering_key" IS NOT NULL ORDER BY "sequence" LIMIT %[2]d),
d AS MATERIALIZED (SELECT "topic" FROM %[1]s INDEXED BY %[5]s WHERE "dead_lettered_at" IS NOT NULL AND "published_at" IS NULL ORDER BY "dead_lettered_at" LIMIT %[2]d),
h AS MATERIALIZED (SELECT x.k, (SELECT min(e."sequence") FROM %[1]s e WHERE e."published_at" IS NULL AND e."ordering_key" = x.k) AS s
	FROM (SELECT DISTINCT "ordering_key" AS k FROM k) x),
f AS MATERIALIZED (SELECT h.k, h.s FROM h CROSS JOIN %[1]s o ON o."sequence" = h.s WHERE o."dead_lettered_at" IS NOT NULL OR o."attempts" > 0),
p AS (SELECT u."topic", u."created_at", u."last_error_class" AS cls, 0 AS held, 1 AS kind FROM u
	UNION ALL SELECT k."topic", k."created_at", k."last_error_class", f.s IS NOT NULL, 2 FROM k LEFT JOIN f ON f.k = k."ordering_key" AND k."sequence" > f.s
	UNION ALL SELECT d."topic", NULL, NULL, 0, 3 FROM d)
SELECT p."topic", count(*) FILTER (WHERE p.kind < 3), min(p."created_at"), count(*) FILTER (WHERE p.kind = 3), $1,
	CASE WHEN max(p.cls = 'unavailable') = 1 THEN count(*) FILTER (WHERE p.kind < 3) ELSE 0 END,
	sum(p.held), (SELECT count(*) FROM u), (SELECT count(*) FROM k), (SELECT count(*) FROM d), (SELECT count(*) FROM f)
FROM p GROUP BY p."topic" ORDER BY p."topic"`, quote(t), limit, index(t, "unordered_idx"), index(t, "keyed_idx"), index(t, "dead_idx"))
	rs, err := ex.Query(ctx, sql, micros(time.Now()))
	if err != nil {
		return dialect.OverviewRow{}, err
	}
	return dialect.ScanOverview(rs)
}
