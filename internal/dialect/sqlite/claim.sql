-- The SQLite relay's claim: two statements with named parameters (@name), run in one IMMEDIATE
-- transaction (relay.go's Claim), so no other writer comes between the selection and the lease.
-- It mirrors the PostgreSQL claim without SKIP LOCKED (SQLite has a single writer).
--
-- Braces stand for the subscription's shape, filled once when the relay is built: {t} the quoted
-- table, {keyed_idx} and {unordered_idx} its partial indexes, {extra} its extra columns
-- (", "x""), {topics} the topic condition on o."topic" (its values are parameters, @topic_0 …;
-- while topics are paused it also leaves out those of @listed, a JSON array, and a probe claims
-- only those of @listed),
-- and the bounds {batch} (BatchSize, or 1 for a probe), {run} (MaxRunPerKey, at most {batch})
-- and {key_scan} (KeyScan). The bounds are literals, not parameters: SQLite prepares the
-- statement on every claim, and LIMIT parameters cost that preparation about 0.3 ms more.
--
-- Times are the relay's clock in microseconds since the Unix epoch (@now, @lease_until).

-- name: select
-- The selecting half. Candidate keys are those of the oldest claimable keyed events plus a
-- bounded skip scan of the key index after @cursor (so keys behind blocked ones are reached
-- within a few polls); each key's head must be claimable (not dead-lettered, due, not leased,
-- of the subscription's topics) or the key is skipped; up to {run} events of each key are read
-- from its head, {batch} in all, and only the gap-free claimable start of each run is kept.
-- Unordered events come from their own partial index (INDEXED BY: the planner would otherwise
-- pick the topic index and read every event of the topic). The last row carries the skip
-- scan's last key and how many keys it saw. CROSS JOIN fixes the join order (SQLite's planner
-- hint): each head drives primary-key lookups, never a scan of the topic index per head. The
-- relay ranks each key's events in Go (1 for the head).
WITH RECURSIVE skip(k) AS (
	SELECT (SELECT min("ordering_key") FROM {t} WHERE "published_at" IS NULL AND "ordering_key" IS NOT NULL AND "ordering_key" > @cursor)
	UNION ALL
	SELECT (SELECT min("ordering_key") FROM {t} WHERE "published_at" IS NULL AND "ordering_key" IS NOT NULL AND "ordering_key" > skip.k) FROM skip WHERE skip.k IS NOT NULL
	LIMIT {key_scan}
), scanned AS MATERIALIZED (
	SELECT k FROM skip WHERE k IS NOT NULL
), oldest AS MATERIALIZED (
	SELECT DISTINCT "ordering_key" AS k FROM (SELECT o."ordering_key" FROM {t} o INDEXED BY {keyed_idx}
		WHERE o."published_at" IS NULL AND o."ordering_key" IS NOT NULL AND o."dead_lettered_at" IS NULL AND (o."next_attempt_at" IS NULL OR o."next_attempt_at" <= @now) AND (o."lease_until" IS NULL OR o."lease_until" < @now) AND {topics}
		ORDER BY o."sequence" LIMIT {batch})
), heads AS MATERIALIZED (
	SELECT c.k, (SELECT min("sequence") FROM {t} WHERE "published_at" IS NULL AND "ordering_key" IS NOT NULL AND "ordering_key" = c.k) AS seq
	FROM (SELECT k FROM oldest UNION SELECT k FROM scanned) c
), ok_heads AS MATERIALIZED (
	SELECT h.k, h.seq FROM heads h CROSS JOIN {t} o ON o."sequence" = h.seq
	WHERE o."dead_lettered_at" IS NULL AND (o."next_attempt_at" IS NULL OR o."next_attempt_at" <= @now) AND (o."lease_until" IS NULL OR o."lease_until" < @now) AND {topics}
	ORDER BY h.seq LIMIT {batch}
), cand AS MATERIALIZED (
	SELECT o."sequence", o."ordering_key",
		CASE WHEN o."dead_lettered_at" IS NULL AND (o."next_attempt_at" IS NULL OR o."next_attempt_at" <= @now) AND (o."lease_until" IS NULL OR o."lease_until" < @now) AND {topics} THEN 0 ELSE 1 END AS bad
	FROM ok_heads h CROSS JOIN {t} o ON o."sequence" IN (
		SELECT x."sequence" FROM {t} x WHERE x."published_at" IS NULL AND x."ordering_key" IS NOT NULL AND x."ordering_key" = h.k ORDER BY x."sequence" LIMIT {run})
	LIMIT {batch}
), picked AS MATERIALIZED (
	SELECT "sequence" FROM (SELECT "sequence", sum(bad) OVER (PARTITION BY "ordering_key" ORDER BY "sequence") AS bad FROM cand) WHERE bad = 0
	UNION ALL
	SELECT "sequence" FROM (SELECT o."sequence" FROM {t} o INDEXED BY {unordered_idx}
		WHERE o."published_at" IS NULL AND o."ordering_key" IS NULL AND o."dead_lettered_at" IS NULL AND (o."next_attempt_at" IS NULL OR o."next_attempt_at" <= @now) AND (o."lease_until" IS NULL OR o."lease_until" < @now) AND {topics}
		ORDER BY o."sequence" LIMIT {batch})
	ORDER BY 1 LIMIT {batch}
)
SELECT "sequence", NULL, NULL FROM picked
UNION ALL
SELECT NULL, (SELECT max(k) FROM scanned), (SELECT count(*) FROM scanned)

-- name: lease
-- The leasing half: leases the selected sequences (@seqs, a JSON array) until @lease_until under
-- the fencing token @token, counting a delivery start, and returns the rows in the layout
-- dialect.ScanClaimed reads.
UPDATE {t} SET "lease_until" = @lease_until, "leased_by" = @token, "delivery_starts" = "delivery_starts" + 1
WHERE "sequence" IN (SELECT value FROM json_each(@seqs))
RETURNING 0, "sequence", "id", "topic", "payload", "headers", "ordering_key", "created_at", "attempts", "last_error", NULL, "delivery_starts"{extra}, NULL, NULL, NULL
