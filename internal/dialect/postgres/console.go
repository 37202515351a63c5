package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/watermill-outbox/outbox/internal/dialect"
)

var _ dialect.Operator = Dialect{}

// BlockedKeys implements dialect.Operator. The candidates are each key's lowest entry of
// blocking_idx (unpublished keyed events that are dead-lettered or have a next_attempt_at:
// O(failed and dead-lettered keyed events), never the history); each is checked to be its
// key's head and failed by one key_idx probe that reads the key's first unpublished event.
// They are sorted by sequence before (OFFSET 0 keeps the subquery whole) the check that a
// pending event waits behind them, which therefore runs only until limit keys are found
// (a dead-lettered head with nothing behind it is common, and each check reads the key's
// later dead letters too). The held events are counted for the keys shown only, at most
// dialect.HeldCountLimit each.
func (Dialect) BlockedKeys(ctx context.Context, ex dialect.Executor, t *dialect.Table, limit int) ([]dialect.BlockedKeyRow, error) {
	q := dialect.DoubleQuote(t.Parts...)
	sql := fmt.Sprintf(`SELECT x.k, x."sequence", x."id"::text, x."topic", x."attempts", x."last_error", x."next_attempt_at", x."dead_lettered_at", x."created_at",
	(SELECT count(*) FROM (SELECT 1 FROM %[1]s r WHERE r."published_at" IS NULL AND r."ordering_key" = x.k AND r."sequence" > x."sequence" AND r."dead_lettered_at" IS NULL LIMIT %[3]d) n), now()
FROM (SELECT c.k, o."sequence", o."id", o."topic", o."attempts", o."last_error", o."next_attempt_at", o."dead_lettered_at", o."created_at"
	FROM (SELECT DISTINCT ON (b."ordering_key") b."ordering_key" AS k, b."sequence" AS s FROM %[1]s b
		WHERE b."published_at" IS NULL AND b."ordering_key" IS NOT NULL AND (b."dead_lettered_at" IS NOT NULL OR b."next_attempt_at" IS NOT NULL)
		ORDER BY b."ordering_key", b."sequence") c
	CROSS JOIN LATERAL (SELECT e."sequence", e."id", e."topic", e."attempts", e."last_error", e."next_attempt_at", e."dead_lettered_at", e."created_at" FROM %[1]s e
		WHERE e."published_at" IS NULL AND e."ordering_key" = c.k ORDER BY e."sequence" LIMIT 1) o
	WHERE o."sequence" = c.s AND (o."dead_lettered_at" IS NOT NULL OR o."attempts" > 0)
	ORDER BY o."sequence" OFFSET 0) x
WHERE EXISTS (SELECT 1 FROM %[1]s r WHERE r."published_at" IS NULL AND r."ordering_key" = x.k AND r."sequence" > x."sequence" AND r."dead_lettered_at" IS NULL)
ORDER BY x."sequence" LIMIT %[2]d`, q, limit, dialect.HeldCountLimit)
	rs, err := ex.Query(ctx, sql)
	if err != nil {
		return nil, err
	}
	defer rs.Close()
	var out []dialect.BlockedKeyRow
	for rs.Next() {
		var b dialect.BlockedKeyRow
		if err := rs.Scan(&b.Key, &b.Sequence, &b.ID, &b.Topic, &b.Attempts, &b.LastError, (*dialect.Time)(&b.NextAttemptAt),
			(*dialect.Time)(&b.DeadLetteredAt), (*dialect.Time)(&b.CreatedAt), &b.Held, (*dialect.Time)(&b.Now)); err != nil {
			return nil, err
		}
		out = append(out, b)
	}
	return out, rs.Err()
}

// headGuard is the condition that event @s of key @k is still that key's head (its lowest
// unpublished event), failed or dead-lettered, and not leased (in flight) by a relay.
func headGuard(q string) string {
	return `"sequence" = @s AND "ordering_key" = @k AND "published_at" IS NULL AND ("dead_lettered_at" IS NOT NULL OR "attempts" > 0)
	AND ("lease_until" IS NULL OR "lease_until" < now())
	AND "sequence" = (SELECT min(e."sequence") FROM ` + q + ` e WHERE e."published_at" IS NULL AND e."ordering_key" = @k)`
}

// ActOnHead implements dialect.Operator.
func (Dialect) ActOnHead(ctx context.Context, ex dialect.Executor, t *dialect.Table, key string, seq int64, a dialect.HeadAction) (int64, error) {
	q := dialect.DoubleQuote(t.Parts...)
	p := params{"s": seq, "k": key}
	guard := headGuard(q)
	switch a {
	case dialect.HeadRetry:
		// Due now: the relays' claims find it even below their floors (walked_retry).
		return exec(ctx, ex, `UPDATE `+q+` SET "next_attempt_at" = now(), "attempts" = CASE WHEN "dead_lettered_at" IS NULL THEN "attempts" ELSE 0 END, "dead_lettered_at" = NULL WHERE `+guard, p, false)
	case dialect.HeadSkip:
		// The head leaves its key (ordering_key NULL, the key kept in a header) as a dead
		// letter; the key's next event is made due now, as PurgeDead does.
		return exec(ctx, ex, `WITH head AS MATERIALIZED (SELECT "sequence", "ordering_key" FROM `+q+` WHERE `+guard+` FOR UPDATE),
touched AS (UPDATE `+q+` SET "next_attempt_at" = now() WHERE "sequence" = (
	SELECT s."sequence" FROM `+q+` s, head h WHERE s."published_at" IS NULL AND s."ordering_key" = h."ordering_key" AND s."sequence" > h."sequence"
	ORDER BY s."sequence" LIMIT 1) AND "published_at" IS NULL AND "dead_lettered_at" IS NULL AND "next_attempt_at" IS NULL)
UPDATE `+q+` o SET "dead_lettered_at" = COALESCE(o."dead_lettered_at", now()), "next_attempt_at" = NULL, "ordering_key" = NULL,
	"headers" = (o."headers"::jsonb || jsonb_build_object('`+dialect.SkippedKeyHeader+`', o."ordering_key"))::json
FROM head WHERE o."sequence" = head."sequence"`, p, false)
	case dialect.HeadPurge:
		return exec(ctx, ex, deleteDead(q, `SELECT "ordering_key", "sequence" FROM `+q+` WHERE `+guard, guard), p, false)
	}
	return 0, fmt.Errorf("postgres: unknown head action %d", a)
}

// DeliveryStats implements dialect.Operator: published_idx's newest entries within the
// window, at most maxRows+1 of them (the extra one tells that the window holds more; the
// oldest minute read is then partial and left out).
func (Dialect) DeliveryStats(ctx context.Context, ex dialect.Executor, t *dialect.Table, window time.Duration, maxRows int) (dialect.DeliveryStatsRow, error) {
	q := dialect.DoubleQuote(t.Parts...)
	sql := fmt.Sprintf(`SELECT date_trunc('minute', p."published_at"), count(*), avg(p.d), percentile_cont(0.95) WITHIN GROUP (ORDER BY p.d), max(p.d), now()
FROM (SELECT "published_at", GREATEST(extract(epoch FROM "published_at" - "created_at"), 0)::float8 AS d FROM %s
	WHERE "published_at" IS NOT NULL AND "published_at" >= now() - @w * interval '1 microsecond' ORDER BY "published_at" DESC LIMIT %d) p
GROUP BY 1 ORDER BY 1`, q, maxRows+1)
	rs, err := query(ctx, ex, sql, params{"w": window.Microseconds()}, false)
	if err != nil {
		return dialect.DeliveryStatsRow{}, err
	}
	defer rs.Close()
	var out dialect.DeliveryStatsRow
	var total int64
	for rs.Next() {
		var m dialect.MinuteRow
		if err := rs.Scan((*dialect.Time)(&m.Minute), &m.Delivered, &m.MeanDelay, &m.P95, &m.Max, (*dialect.Time)(&out.Now)); err != nil {
			return dialect.DeliveryStatsRow{}, err
		}
		total += m.Delivered
		out.Minutes = append(out.Minutes, m)
	}
	if err := rs.Err(); err != nil {
		return dialect.DeliveryStatsRow{}, err
	}
	if total > int64(maxRows) {
		out.Capped = true
		out.Minutes = out.Minutes[1:]
	}
	return out, nil
}

// Leases implements dialect.Operator: each pending index (keyed, unordered) is read in
// sequence order, at most dialect.LeaseScan entries, and stops once it has found limit+1
// unexpired leases (relays lease the oldest claimable events, so the leases lie at the start);
// the first limit+1 of both by sequence are grouped in Go by the token without its claim
// number (relay name, '#', the Subscriber's nonce).
func (Dialect) Leases(ctx context.Context, ex dialect.Executor, t *dialect.Table, limit int) (dialect.LeasesRow, error) {
	q := dialect.DoubleQuote(t.Parts...)
	sql := fmt.Sprintf(`SELECT l."leased_by", l."lease_until", now() FROM (
	(SELECT w."sequence", w."leased_by", w."lease_until" FROM (SELECT "sequence", "leased_by", "lease_until" FROM %[1]s
		WHERE "published_at" IS NULL AND "dead_lettered_at" IS NULL AND "ordering_key" IS NULL ORDER BY "sequence" LIMIT %[2]d) w
		WHERE w."leased_by" IS NOT NULL AND w."lease_until" > now() LIMIT %[3]d)
	UNION ALL (SELECT w."sequence", w."leased_by", w."lease_until" FROM (SELECT "sequence", "leased_by", "lease_until" FROM %[1]s
		WHERE "published_at" IS NULL AND "dead_lettered_at" IS NULL AND "ordering_key" IS NOT NULL ORDER BY "sequence" LIMIT %[2]d) w
		WHERE w."leased_by" IS NOT NULL AND w."lease_until" > now() LIMIT %[3]d)) l
ORDER BY l."sequence" LIMIT %[3]d`, q, dialect.LeaseScan, limit+1)
	rs, err := ex.Query(ctx, sql)
	if err != nil {
		return dialect.LeasesRow{}, err
	}
	return dialect.ScanLeases(rs, limit)
}

// BacklogOverview implements dialect.Operator: BacklogByTopic over bounded reads, so that its
// cost is O(limit) whatever the backlog and the history. u and k are the oldest limit events
// of unordered_idx and keyed_idx (index scans in sequence order, stopped by the LIMIT); d the
// limit earliest entries of dead_idx; c the lowest blocking_idx entry (dead-lettered or with a
// next attempt) of each key of k that has one: the only possible failed head of that key (a
// failed head has a next attempt or is dead-lettered). A keyed event read is held when its
// key's failed head is below it, so f needs only the candidates below the highest sequence
// of k, and checks them against k alone, with no probe of the table: every unpublished event
// of the key below the candidate is pending and not dead-lettered (else it would be the
// lowest blocking_idx entry), so it is in k (k holds every such event up to its highest
// sequence); the candidate is the head when k has none of them, and failed when it is
// dead-lettered (not in k, whose events are not) or has attempts > 0. The last four columns
// count the rows read of each kind, the same on every row.
func (Dialect) BacklogOverview(ctx context.Context, ex dialect.Executor, t *dialect.Table, limit int) (dialect.OverviewRow, error) {
	q := dialect.DoubleQuote(t.Parts...)
	sql := fmt.Sprintf(`WITH u AS (SELECT "topic", "created_at", "last_error_class" FROM %[1]s
	WHERE "published_at" IS NULL AND "dead_lettered_at" IS NULL AND "ordering_key" IS NULL ORDER BY "sequence" LIMIT %[2]d),
k AS (SELECT "topic", "created_at", "last_error_class", "ordering_key", "sequence", "attempts" FROM %[1]s
	WHERE "published_at" IS NULL AND "dead_lettered_at" IS NULL AND "ordering_key" IS NOT NULL ORDER BY "sequence" LIMIT %[2]d),
d AS (SELECT "topic" FROM %[1]s WHERE "dead_lettered_at" IS NOT NULL AND "published_at" IS NULL ORDER BY "dead_lettered_at" LIMIT %[2]d),
c AS (SELECT DISTINCT ON (b."ordering_key") b."ordering_key" AS k, b."sequence" AS s FROM %[1]s b
	WHERE b."published_at" IS NULL AND b."ordering_key" IS NOT NULL AND (b."dead_lettered_at" IS NOT NULL OR b."next_attempt_at" IS NOT NULL)
	AND b."ordering_key" IN (SELECT k."ordering_key" FROM k)
	ORDER BY b."ordering_key", b."sequence" LIMIT %[2]d),
f AS (SELECT c.k, c.s FROM c LEFT JOIN k h ON h."sequence" = c.s
	WHERE c.s < (SELECT max(m."sequence") FROM k m) AND (h."sequence" IS NULL OR h."attempts" > 0)
	AND NOT EXISTS (SELECT 1 FROM k e WHERE e."ordering_key" = c.k AND e."sequence" < c.s)),
p AS (SELECT u."topic", u."created_at", u."last_error_class", false AS held, 1 AS kind FROM u
	UNION ALL SELECT k."topic", k."created_at", k."last_error_class", f.s IS NOT NULL, 2 FROM k LEFT JOIN f ON f.k = k."ordering_key" AND k."sequence" > f.s
	UNION ALL SELECT d."topic", NULL, NULL, false, 3 FROM d)
SELECT p."topic", count(*) FILTER (WHERE p.kind < 3), min(p."created_at"), count(*) FILTER (WHERE p.kind = 3), now(),
	CASE WHEN bool_or(p."last_error_class" = 'unavailable') THEN count(*) FILTER (WHERE p.kind < 3) ELSE 0 END,
	count(*) FILTER (WHERE p.held),
	(SELECT count(*) FROM u), (SELECT count(*) FROM k), (SELECT count(*) FROM d), (SELECT count(*) FROM c)
FROM p GROUP BY p."topic" ORDER BY p."topic"`, q, limit)
	rs, err := ex.Query(ctx, sql)
	if err != nil {
		return dialect.OverviewRow{}, err
	}
	return dialect.ScanOverview(rs)
}
