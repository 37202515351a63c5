-- The PostgreSQL relay's claim and sweep: complete statements with named parameters (@name).
-- Braces stand only for the table's shape: {t} the quoted table, {payload} its payload column as
-- the claim returns it, {extra} and {uextra} its extra columns (", o.x" and ", u.x"), {nulls} the
-- marker row's NULLs for the event columns. docs/design/claim.md explains each step and why.
--
-- The topic condition is parameters: @topic_all, or @topic_prefix with @topic (a prefix, else
-- an exact name), minus @topic_not (LIKE patterns), and while topics are paused, those in
-- @paused (the claim, @probe false) or only those (the probe, @probe true). The claim runs as a
-- custom plan (plan_cache_mode = force_custom_plan, pgx's exec mode): the planner folds these
-- parameters to constants, so each selection is planned as if its condition were written out.

-- name: claim
-- Leases up to @batch claimable events under @token: each ordering key's head and the gap-free
-- run behind it (up to @run events), continued runs, the heads of taken-back keys, and
-- unordered events by age; then one marker row with the key scan's cursor and the floors'
-- candidates. Every scan is bounded by live work (pending partial indexes, the key index, the
-- retry index), never by the table's history.
WITH RECURSIVE
-- The keys the relay knows, in the key index's order.
known AS MATERIALIZED (
	SELECT ARRAY(SELECT k FROM unnest(@low_keys::text[]) AS k ORDER BY k) AS a
),
-- A recursive skip scan of the key index after @cursor, one row per key, stepping over the
-- known keys (their heads come from probed).
skip(k, seq, i, step) AS (
	SELECT @cursor::text, NULL::bigint, COALESCE((SELECT min(j) FROM generate_subscripts(known.a, 1) AS j WHERE known.a[j] > @cursor), cardinality(known.a) + 1), 0 FROM known
	UNION ALL
	SELECT COALESCE(n."ordering_key", known.a[s.i]), n."sequence", CASE WHEN n."ordering_key" IS NULL THEN s.i + 1 ELSE s.i END, s.step + 1
	FROM skip s CROSS JOIN known LEFT JOIN LATERAL (
		(SELECT "ordering_key", "sequence" FROM {t} WHERE "published_at" IS NULL AND "ordering_key" IS NOT NULL AND "ordering_key" > s.k AND "ordering_key" < known.a[s.i]
			ORDER BY "ordering_key", "sequence" LIMIT 1)
		UNION ALL
		(SELECT "ordering_key", "sequence" FROM {t} WHERE "published_at" IS NULL AND "ordering_key" IS NOT NULL AND "ordering_key" > s.k AND known.a[s.i] IS NULL
			ORDER BY "ordering_key", "sequence" LIMIT 1)) n ON true
	WHERE n."ordering_key" IS NOT NULL OR known.a[s.i] IS NOT NULL
),
-- The oldest claimable keyed events from the keyed floor on, locked before their LIMIT.
walked_new AS MATERIALIZED (
	SELECT "ordering_key", "sequence" FROM {t} WHERE "published_at" IS NULL AND "dead_lettered_at" IS NULL AND "ordering_key" IS NOT NULL
		AND ("next_attempt_at" IS NULL OR "next_attempt_at" <= now()) AND ("lease_until" IS NULL OR "lease_until" < now())
		AND (@topic_all::bool OR CASE WHEN @topic_prefix::bool THEN starts_with("topic", @topic::text) ELSE "topic" = @topic::text END)
		AND (cardinality(@topic_not::text[]) = 0 OR NOT ("topic" LIKE ANY(@topic_not::text[])))
		AND (cardinality(@paused::text[]) = 0 AND NOT @probe::bool OR ("topic" = ANY(@paused::text[])) = @probe::bool)
		AND "sequence" >= @floor_keyed ORDER BY "sequence" LIMIT @oldest FOR UPDATE SKIP LOCKED
),
-- Keyed events below the floor that are due again, from the retry index only (expressions keep
-- every other index out).
walked_retry AS MATERIALIZED (
	SELECT "ordering_key", "sequence" FROM {t} WHERE "published_at" IS NULL AND "dead_lettered_at" IS NULL AND COALESCE("ordering_key", '') <> ''
		AND "next_attempt_at" <= now() AND ("lease_until" IS NULL OR "lease_until" < now())
		AND (@topic_all::bool OR CASE WHEN @topic_prefix::bool THEN starts_with(("topic" || ''), @topic::text) ELSE ("topic" || '') = @topic::text END)
		AND (cardinality(@topic_not::text[]) = 0 OR NOT (("topic" || '') LIKE ANY(@topic_not::text[])))
		AND (cardinality(@paused::text[]) = 0 AND NOT @probe::bool OR (("topic" || '') = ANY(@paused::text[])) = @probe::bool)
		AND "sequence" + 0 < @floor_keyed AND @floor_keyed > 0 ORDER BY "next_attempt_at" LIMIT @oldest FOR UPDATE SKIP LOCKED
),
walked AS MATERIALIZED (
	SELECT "ordering_key", "sequence" FROM walked_new UNION ALL SELECT "ordering_key", "sequence" FROM walked_retry
),
-- Each walked key with its oldest walked event and its low (every event below it published).
walk AS MATERIALIZED (
	SELECT w.k, w.s, COALESCE(l.low, 0) AS low FROM (SELECT "ordering_key" AS k, min("sequence") AS s FROM walked GROUP BY 1) w
	LEFT JOIN unnest(@low_keys::text[], @low_seqs::bigint[]) AS l(k, low) ON l.k = w.k
),
-- Continuations: the next run of keys whose last run was acked whole, while its marks may still
-- be in flight (the head is after the run, or still leased under @cont_token with margin).
cont AS MATERIALIZED (
	SELECT c.k, n."sequence" AS s FROM unnest(@cont_keys::text[], @cont_after::bigint[], @cont_from::bigint[]) AS c(k, a, f) CROSS JOIN LATERAL (
		SELECT h."sequence", h."leased_by", h."lease_until" FROM {t} h WHERE h."published_at" IS NULL AND h."ordering_key" IS NOT NULL
		AND (h."ordering_key", h."sequence") >= (c.k, c.f) AND (h."ordering_key", h."sequence") <= (c.k, 9223372036854775807)
		ORDER BY h."ordering_key", h."sequence" LIMIT 1) h CROSS JOIN LATERAL (
		SELECT n."sequence" FROM {t} n WHERE n."published_at" IS NULL AND n."ordering_key" IS NOT NULL
		AND (n."ordering_key", n."sequence") > (c.k, c.a) AND (n."ordering_key", n."sequence") <= (c.k, 9223372036854775807)
		ORDER BY n."ordering_key", n."sequence" LIMIT 1) n
	WHERE h."sequence" > c.a OR (h."leased_by" = @cont_token AND h."lease_until" > now() + @cont_margin_us * interval '1 microsecond')
),
-- The heads of keys taken back from a predecessor, while at or below the last event taken back.
first AS MATERIALIZED (
	SELECT f.k, h."sequence" AS s FROM unnest(@first_keys::text[], @first_last::bigint[]) AS f(k, last)
	LEFT JOIN unnest(@low_keys::text[], @low_seqs::bigint[]) AS l(k, low) ON l.k = f.k CROSS JOIN LATERAL (
		SELECT "sequence" FROM {t} WHERE "published_at" IS NULL AND "ordering_key" IS NOT NULL
		AND ("ordering_key", "sequence") >= (f.k, COALESCE(l.low, 0)) AND ("ordering_key", "sequence") <= (f.k, 9223372036854775807)
		ORDER BY "ordering_key", "sequence" LIMIT 1) h
	WHERE h."sequence" <= f.last AND NOT (f.k = ANY(COALESCE(@cont_keys::text[], '{}')))
),
-- Up to @run events of each key from its head, taken-back keys first, then by age, up to
-- @run_limit rows; a walked key counts only when its oldest walked event is its head.
wruns AS MATERIALIZED (
	SELECT w.k, r."sequence", r.rn, w.pri FROM (SELECT * FROM (
		SELECT k, s, low, 1 AS pri FROM walk WHERE NOT (k = ANY(COALESCE(@cont_keys::text[], '{}'))) AND NOT EXISTS (SELECT 1 FROM first f WHERE f.k = walk.k)
		UNION ALL
		SELECT k, s, 0, 0 FROM cont
		UNION ALL
		SELECT k, s, 0, 2 FROM first) u
		ORDER BY pri <> 2, s OFFSET 0) w CROSS JOIN LATERAL (
		SELECT "sequence", row_number() OVER (ORDER BY "ordering_key", "sequence") AS rn FROM {t}
		WHERE "published_at" IS NULL AND "ordering_key" IS NOT NULL
		AND ("ordering_key", "sequence") >= (w.k, w.s) AND ("ordering_key", "sequence") <= (w.k, 9223372036854775807)
		AND (w.pri <> 1 OR (SELECT e."sequence" FROM {t} e WHERE e."published_at" IS NULL AND e."ordering_key" IS NOT NULL
			AND (e."ordering_key", e."sequence") >= (w.k, w.low) AND (e."ordering_key", e."sequence") <= (w.k, w.s)
			ORDER BY e."ordering_key", e."sequence" LIMIT 1) = w.s)
		ORDER BY "ordering_key", "sequence" LIMIT @run) r
	LIMIT @run_limit
),
-- The skip scan, up to @key_scan keys, run only when the walk was full and wruns did not fill
-- the claim, and not while the relay backs it off (@no_key_scan).
scanned AS MATERIALIZED (
	SELECT k, seq FROM skip WHERE step > 0 AND NOT @no_key_scan AND (SELECT count(*) FROM walked) >= @oldest AND (SELECT count(*) FROM wruns) < @run_limit LIMIT @key_scan
),
-- The heads of the keys the relay knows, each looked up from its low, under the same condition.
probed AS MATERIALIZED (
	SELECT l.k, h."sequence" AS seq FROM unnest(@low_keys::text[], @low_seqs::bigint[]) AS l(k, low) CROSS JOIN LATERAL (
		SELECT "sequence" FROM {t} WHERE "published_at" IS NULL AND "ordering_key" IS NOT NULL
		AND ("ordering_key", "sequence") >= (l.k, l.low) AND ("ordering_key", "sequence") <= (l.k, 9223372036854775807)
		ORDER BY "ordering_key", "sequence" LIMIT 1) h
	WHERE (SELECT count(*) FROM walked) >= @oldest AND (SELECT count(*) FROM wruns) < @run_limit
),
-- The scanned and probed heads that are claimable, each checked by one primary-key lookup.
sheads AS MATERIALIZED (
	SELECT h."ordering_key" AS k, h."sequence" AS seq FROM (
		SELECT x.seq FROM (SELECT k, seq FROM scanned WHERE seq IS NOT NULL UNION SELECT k, seq FROM probed) x
		WHERE NOT EXISTS (SELECT 1 FROM walk w WHERE w.k = x.k) AND NOT (x.k = ANY(COALESCE(@cont_keys::text[], '{}'))) AND NOT EXISTS (SELECT 1 FROM first f WHERE f.k = x.k)
	) x CROSS JOIN LATERAL (
		SELECT "ordering_key", "sequence" FROM {t} h WHERE h."sequence" = x.seq AND h."dead_lettered_at" IS NULL
		AND (h."next_attempt_at" IS NULL OR h."next_attempt_at" <= now()) AND (h."lease_until" IS NULL OR h."lease_until" < now())
		AND (@topic_all::bool OR CASE WHEN @topic_prefix::bool THEN starts_with((h."topic" || ''), @topic::text) ELSE (h."topic" || '') = @topic::text END)
		AND (cardinality(@topic_not::text[]) = 0 OR NOT ((h."topic" || '') LIKE ANY(@topic_not::text[])))
		AND (cardinality(@paused::text[]) = 0 AND NOT @probe::bool OR ((h."topic" || '') = ANY(@paused::text[])) = @probe::bool) LIMIT 1) h
),
-- The walked and continued keys' runs, then the scanned and probed keys' runs, up to @run_limit.
runs AS MATERIALIZED (
	SELECT k, "sequence", rn, pri FROM wruns
	UNION ALL
	SELECT c.k, r."sequence", r.rn, 0 FROM (SELECT k, seq FROM sheads ORDER BY seq OFFSET 0) c CROSS JOIN LATERAL (
		SELECT "sequence", row_number() OVER (ORDER BY "ordering_key", "sequence") AS rn FROM {t}
		WHERE "published_at" IS NULL AND "ordering_key" IS NOT NULL
		AND ("ordering_key", "sequence") >= (c.k, c.seq) AND ("ordering_key", "sequence") <= (c.k, 9223372036854775807)
		ORDER BY "ordering_key", "sequence" LIMIT @run) r
	LIMIT @run_limit
),
-- Run members other than walked heads, locked by primary key (the topic on an expression).
keyed AS (
	SELECT "sequence" FROM {t} WHERE "sequence" = ANY(ARRAY(SELECT "sequence" FROM runs WHERE rn > 1 OR pri <> 1))
		AND "published_at" IS NULL AND "dead_lettered_at" IS NULL
		AND ("next_attempt_at" IS NULL OR "next_attempt_at" <= now()) AND ("lease_until" IS NULL OR "lease_until" < now())
		AND (@topic_all::bool OR CASE WHEN @topic_prefix::bool THEN starts_with(("topic" || ''), @topic::text) ELSE ("topic" || '') = @topic::text END)
		AND (cardinality(@topic_not::text[]) = 0 OR NOT (("topic" || '') LIKE ANY(@topic_not::text[])))
		AND (cardinality(@paused::text[]) = 0 AND NOT @probe::bool OR (("topic" || '') = ANY(@paused::text[])) = @probe::bool)
	ORDER BY "sequence" LIMIT @batch FOR UPDATE SKIP LOCKED
),
-- Every keyed event this claim holds: the locked run members and the walked heads.
locked AS (
	SELECT "sequence" FROM keyed
	UNION ALL
	SELECT "sequence" FROM runs WHERE rn = 1 AND pri = 1
),
-- Unordered events from the unordered floor on, locked before the LIMIT.
unordered_new AS MATERIALIZED (
	SELECT "sequence" FROM {t} WHERE "published_at" IS NULL AND "dead_lettered_at" IS NULL AND "ordering_key" IS NULL
		AND ("next_attempt_at" IS NULL OR "next_attempt_at" <= now()) AND ("lease_until" IS NULL OR "lease_until" < now())
		AND (@topic_all::bool OR CASE WHEN @topic_prefix::bool THEN starts_with("topic", @topic::text) ELSE "topic" = @topic::text END)
		AND (cardinality(@topic_not::text[]) = 0 OR NOT ("topic" LIKE ANY(@topic_not::text[])))
		AND (cardinality(@paused::text[]) = 0 AND NOT @probe::bool OR ("topic" = ANY(@paused::text[])) = @probe::bool)
		AND "sequence" >= @floor_unordered ORDER BY "sequence" LIMIT @batch FOR UPDATE SKIP LOCKED
),
-- Unordered events below the floor that are due again, from the retry index only.
unordered_retry AS MATERIALIZED (
	SELECT "sequence" FROM {t} WHERE "published_at" IS NULL AND "dead_lettered_at" IS NULL AND COALESCE("ordering_key", '') = ''
		AND "next_attempt_at" <= now() AND ("lease_until" IS NULL OR "lease_until" < now())
		AND (@topic_all::bool OR CASE WHEN @topic_prefix::bool THEN starts_with(("topic" || ''), @topic::text) ELSE ("topic" || '') = @topic::text END)
		AND (cardinality(@topic_not::text[]) = 0 OR NOT (("topic" || '') LIKE ANY(@topic_not::text[])))
		AND (cardinality(@paused::text[]) = 0 AND NOT @probe::bool OR (("topic" || '') = ANY(@paused::text[])) = @probe::bool)
		AND "sequence" + 0 < @floor_unordered AND @floor_unordered > 0 ORDER BY "next_attempt_at" LIMIT @batch FOR UPDATE SKIP LOCKED
),
unordered AS (
	SELECT "sequence" FROM unordered_new UNION ALL SELECT "sequence" FROM unordered_retry
),
-- The next keyed floor's candidate, under the claim's snapshot: the first pending keyed event at
-- or above the floor, of the subscription's topics (paused ones included), that never failed
-- and has no dead-lettered or retrying event of its key before it.
next_keyed AS MATERIALIZED (
	SELECT f."sequence" FROM {t} f WHERE f."published_at" IS NULL AND f."dead_lettered_at" IS NULL AND f."ordering_key" IS NOT NULL AND f."next_attempt_at" IS NULL
		AND (@topic_all::bool OR CASE WHEN @topic_prefix::bool THEN starts_with(f."topic", @topic::text) ELSE f."topic" = @topic::text END)
		AND (cardinality(@topic_not::text[]) = 0 OR NOT (f."topic" LIKE ANY(@topic_not::text[])))
		AND f."sequence" >= @floor_keyed
		AND NOT EXISTS (SELECT 1 FROM {t} d WHERE d."published_at" IS NULL AND d."ordering_key" IS NOT NULL AND (d."dead_lettered_at" IS NOT NULL OR d."next_attempt_at" IS NOT NULL)
			AND d."ordering_key" = f."ordering_key" AND d."sequence" < f."sequence")
	ORDER BY f."sequence" LIMIT 1
),
-- The next unordered floor's candidate: the first pending unordered event at or above the floor
-- that never failed.
next_unordered AS MATERIALIZED (
	SELECT "sequence" FROM {t} WHERE "published_at" IS NULL AND "dead_lettered_at" IS NULL AND "ordering_key" IS NULL AND "next_attempt_at" IS NULL
		AND (@topic_all::bool OR CASE WHEN @topic_prefix::bool THEN starts_with("topic", @topic::text) ELSE "topic" = @topic::text END)
		AND (cardinality(@topic_not::text[]) = 0 OR NOT ("topic" LIKE ANY(@topic_not::text[])))
		AND "sequence" >= @floor_unordered
	ORDER BY "sequence" LIMIT 1
),
-- What the claim leases: the gap-free start of each run, and the unordered events.
picked AS MATERIALIZED (
	SELECT "sequence", rn FROM (
		SELECT r."sequence", r.rn, count(*) OVER (PARTITION BY r.k ORDER BY r.rn) AS locked
		FROM runs r JOIN locked l ON l."sequence" = r."sequence"
	) x WHERE x.locked = x.rn
	UNION ALL
	SELECT "sequence", 0 FROM unordered
	ORDER BY 1 LIMIT @batch
),
-- The lease: @lease_us from now under @token; delivery_starts counts the start.
upd AS (
	UPDATE {t} o SET "lease_until" = now() + @lease_us * interval '1 microsecond', "leased_by" = @token, "delivery_starts" = o."delivery_starts" + 1
	WHERE o."sequence" = ANY(ARRAY(SELECT "sequence" FROM picked))
	RETURNING o."sequence", o."id"::text AS id, o."topic", {payload} AS payload, o."headers"::text AS headers, o."ordering_key", o."created_at", o."attempts", o."last_error", o."delivery_starts"{extra}
)
-- The leased rows with their ranks, then the marker row (read after the UPDATE has run).
SELECT false, u."sequence", u.id, u."topic", u.payload, u.headers, u."ordering_key", u."created_at", u."attempts", u."last_error", p.rn, u."delivery_starts"{uextra}, NULL::text, NULL::bigint, NULL::bigint,
	NULL::bigint, NULL::bigint, NULL::bigint, NULL::bigint, NULL::bigint, NULL::bigint
FROM upd u JOIN picked p ON p."sequence" = u."sequence"
UNION ALL
SELECT true{nulls}, (SELECT max(k) FROM scanned), (SELECT count(*) FROM scanned), (SELECT count(*) FROM walk),
	pg_snapshot_xmin(pg_current_snapshot())::text::bigint, pg_current_xact_id_if_assigned()::text::bigint, (SELECT max("sequence") FROM {t}),
	(SELECT "sequence" FROM next_keyed), (SELECT "sequence" FROM next_unordered), (SELECT count(*) FROM sheads WHERE NOT (k = ANY(@low_keys::text[])))

-- name: sweep
-- What the floors passed over: the first keyed and unordered events below @floor_keyed and
-- @floor_unordered that the claim's floor candidates (next_keyed, next_unordered) would pick,
-- or 0 (dialect.Sweeper).
SELECT COALESCE((
	SELECT f."sequence" FROM {t} f WHERE f."published_at" IS NULL AND f."dead_lettered_at" IS NULL AND f."ordering_key" IS NOT NULL AND f."next_attempt_at" IS NULL
		AND (@topic_all::bool OR CASE WHEN @topic_prefix::bool THEN starts_with(f."topic", @topic::text) ELSE f."topic" = @topic::text END)
		AND (cardinality(@topic_not::text[]) = 0 OR NOT (f."topic" LIKE ANY(@topic_not::text[])))
		AND f."sequence" < @floor_keyed
		AND NOT EXISTS (SELECT 1 FROM {t} d WHERE d."published_at" IS NULL AND d."ordering_key" IS NOT NULL AND (d."dead_lettered_at" IS NOT NULL OR d."next_attempt_at" IS NOT NULL)
			AND d."ordering_key" = f."ordering_key" AND d."sequence" < f."sequence")
	ORDER BY f."sequence" LIMIT 1), 0), COALESCE((
	SELECT "sequence" FROM {t} WHERE "published_at" IS NULL AND "dead_lettered_at" IS NULL AND "ordering_key" IS NULL AND "next_attempt_at" IS NULL
		AND (@topic_all::bool OR CASE WHEN @topic_prefix::bool THEN starts_with("topic", @topic::text) ELSE "topic" = @topic::text END)
		AND (cardinality(@topic_not::text[]) = 0 OR NOT ("topic" LIKE ANY(@topic_not::text[])))
		AND "sequence" < @floor_unordered
	ORDER BY "sequence" LIMIT 1), 0)
