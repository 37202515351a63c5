-- The PostgreSQL claim, one statement composed of the named fragments below (see claim.go,
-- composeClaim, for their order). Placeholders in braces are filled once per subscription
-- ({t} the quoted table; {pending}, {claimable}, {filter}, {hfilter}, {pkfilter} conditions;
-- {batch}, {keyscan}, {run} limits; {payload}, {extra}, {uextra}, {nulls} column lists);
-- @names are statement parameters.
--
-- Key lookups are written as row comparisons on ("ordering_key", "sequence") so that only the
-- key index can serve them: with a plain "ordering_key" = k the planner may walk the primary
-- key past every published event of the key. Materialized CTEs and arrays of primary keys keep
-- every step from being re-run per row (a nested loop over a re-scanned head search took
-- seconds under concurrent claims).
--
-- Per-key order under SKIP LOCKED (see FACTS of the project): key heads are found under the
-- statement's snapshot, never by a per-key LIMIT 1 FOR UPDATE SKIP LOCKED (that hands out a
-- key's second event when its head is locked); a row changed after the snapshot is re-checked
-- by PostgreSQL when it is locked and dropped, and the Go side keeps only gap-free runs
-- (splitRuns). Unordered events are locked by their own scan.

-- name: known
-- The keys the relay knows (@low_keys, see walk) in the key index's order (the column's
-- collation): the skip scan steps over them instead of reading them.
known AS MATERIALIZED (
	SELECT ARRAY(SELECT k FROM unnest(@low_keys::text[]) AS k ORDER BY k) AS a
)

-- name: skip
-- A recursive skip scan of the key index after @cursor: one row per key, for keys whose
-- claimable head sits behind blocked keys' events (dead-lettered or backing off) that fill the
-- walk (the first row, step 0, is only the start). It is bounded by keys the relay does not
-- know: those keys' rows have their first unpublished event in seq; a key the relay knows is
-- only a marker row (seq NULL; i is the next known key's position in known), its head comes
-- from probed, from its low. Each step reads the key index between the last key and the next
-- known key, whose bound (an index condition: the scan stops there) keeps it off the known
-- key's entries; past the last known key there is no bound, hence the step's second branch
-- (text has no greatest value to write one bound for both). Reading the known keys' entries
-- was the skip scan's cost under a long-open snapshot: a key's first index entries are then
-- every event of the key published since that snapshot (no VACUUM or kill_prior_tuple can
-- remove them); over 100 keys at 1,000 events/s a skip scan read about 5k entries per key
-- after 8.5 minutes and took 1.1 s (TestSkipScanStepsOverKnownKeys). A key the relay does not
-- know is still read from its first entry: a key another relay serves, or one nobody
-- delivered lately. That is why "scanned" runs it only when needed.
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
)

-- name: walked_new
-- The oldest claimable keyed events from the keyed floor @floor_keyed on (see
-- subscription.floors: below it every keyed event of the relay's topics is published, dead
-- lettered, behind a dead-lettered or retrying event of its key, or retrying itself), locked
-- before their LIMIT (SKIP LOCKED), so a second relay claiming at the same moment finds other
-- keys instead of the first relay's whole candidate list (those row locks end with the
-- statement). @oldest rows: about twice the keys of the last batch (subscription.oldest).
-- Starting at the floor instead of at the first entry keeps the walk off the index entries of
-- the events published before it: under a long-open snapshot (pg_dump, a forgotten BEGIN, a
-- replica with hot_standby_feedback) neither VACUUM nor kill_prior_tuple can remove them, and
-- a walk from 0 grew from 2.1k to 20.8k buffers per claim in 30 s at 1,000 events/s.
walked_new AS MATERIALIZED (
	SELECT "ordering_key", "sequence" FROM {t} WHERE {pending} AND "ordering_key" IS NOT NULL AND {claimable} AND {filter}
		AND "sequence" >= @floor_keyed ORDER BY "sequence" LIMIT @oldest FOR UPDATE SKIP LOCKED
)

-- name: walked_retry
-- Keyed events below the floor that are due again (retries, and events an operator took back
-- from the dead letters or released after a purge: those get a next_attempt_at), from the
-- retry index (pending events with a next_attempt_at: only events that failed or were retried
-- are in it, so it is bounded by them, not by history). Not run while the floor is 0. Only the
-- retry index can serve it: the key, topic and sequence tests are written on expressions
-- (COALESCE is not strict, so it proves no partial index's "ordering_key" IS NOT NULL; the
-- CHECK constraint rules out ''), because every other index that could serve them (keyed_idx,
-- the primary key, the (topic, sequence) index tables created by older versions keep) holds
-- every event written since the oldest snapshot below the floor. On a table without statistics (autovacuum off, or not yet run)
-- the planner served this scan from keyed_idx ("sequence" < floor) once the table passed about
-- 500k rows: under a snapshot held for 10 minutes each claim read 495k buffers (1 to 3.6 s)
-- to find no retry (TestClaimRetryScansNeedRetryIndex).
walked_retry AS MATERIALIZED (
	SELECT "ordering_key", "sequence" FROM {t} WHERE {pending} AND COALESCE("ordering_key", '') <> '' AND "next_attempt_at" <= now() AND ("lease_until" IS NULL OR "lease_until" < now())
		AND {pkfilter} AND "sequence" + 0 < @floor_keyed AND @floor_keyed > 0 ORDER BY "next_attempt_at" LIMIT @oldest FOR UPDATE SKIP LOCKED
)

-- name: walked
-- Both walks.
walked AS MATERIALIZED (
	SELECT "ordering_key", "sequence" FROM walked_new UNION ALL SELECT "ordering_key", "sequence" FROM walked_retry
)

-- name: walk
-- Each walked key with its oldest walked event and its low: a sequence below which every event
-- of the key is published (@low_keys/@low_seqs from the relay's own marks, see
-- subscription.keyLows; 0 for other keys). A walked key is claimable when that event is its
-- head (checked in "wruns" from the low, not from the key's first index entry, which under a
-- long-open snapshot is every event of the key published since that snapshot: 14,636 of a
-- 50,013-buffer claim after a minute at 1,000 events/s over 100 keys).
walk AS MATERIALIZED (
	SELECT w.k, w.s, COALESCE(l.low, 0) AS low FROM (SELECT "ordering_key" AS k, min("sequence") AS s FROM walked GROUP BY 1) w
	LEFT JOIN unnest(@low_keys::text[], @low_seqs::bigint[]) AS l(k, low) ON l.k = w.k
)

-- name: cont
-- Continuations: the previous batch's keys whose run was full and acked whole
-- (subscription.contKeys: @cont_keys with the run's first sequence @cont_from and last
-- @cont_after, leased under @cont_token). Their next run may be leased while that batch's
-- marks are still being written, since the events before it are this relay's own and already
-- delivered: the key's first unpublished event (looked up from the run's first sequence, not
-- from the key's start, so the published events' index entries are not stepped over) must be
-- either after the run (the marks landed) or leased under that token with at least
-- @cont_margin_us (a third of LeaseDuration) left. The run is then the events after the old
-- run's last, every one locked by primary key. Without this a relay's hot keys waited for
-- their marks before each claim (a claim beside the marks found them all still leased).
cont AS MATERIALIZED (
	SELECT c.k, n."sequence" AS s FROM unnest(@cont_keys::text[], @cont_after::bigint[], @cont_from::bigint[]) AS c(k, a, f) CROSS JOIN LATERAL (
		SELECT h."sequence", h."leased_by", h."lease_until" FROM {t} h WHERE h."published_at" IS NULL AND h."ordering_key" IS NOT NULL
		AND (h."ordering_key", h."sequence") >= (c.k, c.f) AND (h."ordering_key", h."sequence") <= (c.k, 9223372036854775807)
		ORDER BY h."ordering_key", h."sequence" LIMIT 1) h CROSS JOIN LATERAL (
		SELECT n."sequence" FROM {t} n WHERE n."published_at" IS NULL AND n."ordering_key" IS NOT NULL
		AND (n."ordering_key", n."sequence") > (c.k, c.a) AND (n."ordering_key", n."sequence") <= (c.k, 9223372036854775807)
		ORDER BY n."ordering_key", n."sequence" LIMIT 1) n
	WHERE h."sequence" > c.a OR (h."leased_by" = @cont_token AND h."lease_until" > now() + @cont_margin_us * interval '1 microsecond')
)

-- name: first
-- The heads of the keys a restarted relay took back from its predecessor (@first_keys, see
-- subscription.takeBack), each the key's first unpublished event, looked up from the key's low
-- (see walk) or, when the relay knows none, from its first index entry; only while that head is
-- at or below the last event taken back (@first_last). Their runs go before the walk's
-- (wruns): the predecessor's batches (its batch claimed ahead in particular, which holds
-- continuations and known keys' runs) reach far ahead of the oldest events, and in age order
-- those keys waited until the walk got there. Keys being continued are left to cont.
first AS MATERIALIZED (
	SELECT f.k, h."sequence" AS s FROM unnest(@first_keys::text[], @first_last::bigint[]) AS f(k, last)
	LEFT JOIN unnest(@low_keys::text[], @low_seqs::bigint[]) AS l(k, low) ON l.k = f.k CROSS JOIN LATERAL (
		SELECT "sequence" FROM {t} WHERE "published_at" IS NULL AND "ordering_key" IS NOT NULL
		AND ("ordering_key", "sequence") >= (f.k, COALESCE(l.low, 0)) AND ("ordering_key", "sequence") <= (f.k, 9223372036854775807)
		ORDER BY "ordering_key", "sequence" LIMIT 1) h
	WHERE h."sequence" <= f.last AND NOT (f.k = ANY(COALESCE(@cont_keys::text[], '{}')))
)

-- name: wruns
-- Up to {run} events of each key from its head: the taken-back keys' runs (first, pri = 2),
-- then the continued keys' and the claimable walked keys' runs in age order (by the sequence of the key's next event, so a continued key does
-- not go before older events of other keys: read first, one hot key filling every batch held
-- an older key's event back behind its whole backlog; the scanned keys' runs come after these,
-- in runs); it stops at @run_limit rows (BatchSize, or subscription.splitLimit during a split): the nested loops
-- run lazily under that LIMIT, so a claim reads about that many rows of runs (reading every
-- walked key's run first took 110 ms per claim over 1,000 keys with 1,000 events each). OFFSET
-- 0 keeps the ordered subqueries from being flattened into the join. A walked key (pri = 1)
-- qualifies only when its oldest walked event is its head, the first unpublished event of the
-- key in the key index (a LIMIT 1 lookup, run per key as a one-time filter of the key's run
-- scan, so a blocked key costs one index row: reading a blocked key's run window instead cost
-- 72-94 ms per claim over 1,000 keys whose heads were backing off; as NOT EXISTS it was planned
-- as a sequential scan). Such a head needs no other check and no second lock: the walk checked
-- and locked it.
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
		ORDER BY "ordering_key", "sequence" LIMIT {run}) r
	LIMIT @run_limit
)

-- name: scanned
-- The skip scan, bounded by {keyscan} keys, run only when the walk was full (a one-time
-- filter: otherwise the recursive scan is never executed): a walk that ended before its LIMIT
-- saw every claimable keyed event not locked by another claim (those below the floor come
-- from walked_retry), so every claimable head is among its rows. @no_key_scan: the relay backs
-- it off while it finds no claimable head (see subscription.keyScanIn): it starts at each key's
-- first index entry, which under a long-open snapshot is every event of the key published since
-- (with 10 hot keys and a snapshot held through a 100k drain, the key index read 9.0M entries
-- against 0.2M without the snapshot, most of them here). Nor is it run when the walked and
-- continued keys' runs (wruns) fill the claim: its keys' runs would come after those and be cut
-- by the LIMIT. Over 1,000 keys with 100 events each, that is every claim of a drain, and the
-- skip scan, the probes and their heads' checks were 3.2k of the claim's 10.3k buffers. (The
-- marker row then reports 0 keys scanned, as after a walk that was not full: the next skip
-- scan starts over from the first key; keys behind blocked ones are still reached, since a
-- walk full of blocked keys' events leaves wruns short and the skip scan then runs every claim.)
scanned AS MATERIALIZED (
	SELECT k, seq FROM skip WHERE step > 0 AND NOT @no_key_scan AND (SELECT count(*) FROM walked) >= @oldest AND (SELECT count(*) FROM wruns) < @run_limit LIMIT {keyscan}
)

-- name: probed
-- The heads of the keys the relay knows (@low_keys, see walk), each looked up from the key's
-- low: run beside the skip scan (when the walk was full and wruns did not fill the claim), they find the heads of the keys the
-- relay serves without stepping over those keys' published events, so the skip scan is needed
-- only for keys the relay does not know, and is backed off while it finds none of those.
probed AS MATERIALIZED (
	SELECT l.k, h."sequence" AS seq FROM unnest(@low_keys::text[], @low_seqs::bigint[]) AS l(k, low) CROSS JOIN LATERAL (
		SELECT "sequence" FROM {t} WHERE "published_at" IS NULL AND "ordering_key" IS NOT NULL
		AND ("ordering_key", "sequence") >= (l.k, l.low) AND ("ordering_key", "sequence") <= (l.k, 9223372036854775807)
		ORDER BY "ordering_key", "sequence" LIMIT 1) h
	WHERE (SELECT count(*) FROM walked) >= @oldest AND (SELECT count(*) FROM wruns) < @run_limit
)

-- name: sheads
-- The scanned and probed keys' heads that are claimable, each checked by one primary-key lookup (LIMIT 1
-- keeps it a per-row lookup: as a join it was planned as a sequential scan on a table without
-- statistics). Walked and continued keys are left to their own fragments.
sheads AS MATERIALIZED (
	SELECT h."ordering_key" AS k, h."sequence" AS seq FROM (
		SELECT x.seq FROM (SELECT k, seq FROM scanned WHERE seq IS NOT NULL UNION SELECT k, seq FROM probed) x
		WHERE NOT EXISTS (SELECT 1 FROM walk w WHERE w.k = x.k) AND NOT (x.k = ANY(COALESCE(@cont_keys::text[], '{}'))) AND NOT EXISTS (SELECT 1 FROM first f WHERE f.k = x.k)
	) x CROSS JOIN LATERAL (
		SELECT "ordering_key", "sequence" FROM {t} h WHERE h."sequence" = x.seq AND h."dead_lettered_at" IS NULL
		AND (h."next_attempt_at" IS NULL OR h."next_attempt_at" <= now()) AND (h."lease_until" IS NULL OR h."lease_until" < now()) AND {hfilter} LIMIT 1) h
)

-- name: runs
-- The walked and continued keys' runs (wruns), then the scanned and probed keys' runs, up to
-- @run_limit rows.
runs AS MATERIALIZED (
	SELECT k, "sequence", rn, pri FROM wruns
	UNION ALL
	SELECT c.k, r."sequence", r.rn, 0 FROM (SELECT k, seq FROM sheads ORDER BY seq OFFSET 0) c CROSS JOIN LATERAL (
		SELECT "sequence", row_number() OVER (ORDER BY "ordering_key", "sequence") AS rn FROM {t}
		WHERE "published_at" IS NULL AND "ordering_key" IS NOT NULL
		AND ("ordering_key", "sequence") >= (c.k, c.seq) AND ("ordering_key", "sequence") <= (c.k, 9223372036854775807)
		ORDER BY "ordering_key", "sequence" LIMIT {run}) r
	LIMIT @run_limit
)

-- name: keyed
-- Run members other than walked heads (the taken-back and continued keys' heads included), locked by primary key (their own ORDER BY … LIMIT …
-- FOR UPDATE SKIP LOCKED). The primary-key lookups test the topic on an expression
-- ({pkfilter}), never on the bare column, so that no plan can serve them from the (topic,
-- sequence) index: it holds every published event of the topic, and with stale statistics (a
-- new or fast-growing table) the planner read the topic's whole history there on every claim
-- (3 ms of a 3.5 ms claim at 10,000 published rows, growing with the table).
keyed AS (
	SELECT "sequence" FROM {t} WHERE "sequence" = ANY(ARRAY(SELECT "sequence" FROM runs WHERE rn > 1 OR pri <> 1)) AND {pending} AND {claimable} AND {pkfilter}
	ORDER BY "sequence" LIMIT {batch} FOR UPDATE SKIP LOCKED
)

-- name: locked
-- Every keyed event this claim holds: the locked run members and the walked heads.
locked AS (
	SELECT "sequence" FROM keyed
	UNION ALL
	SELECT "sequence" FROM runs WHERE rn = 1 AND pri = 1
)

-- name: unordered_new
-- Unordered events from their own scan (from the unordered floor @floor_unordered on, see
-- walked), locked before the LIMIT.
unordered_new AS MATERIALIZED (
	SELECT "sequence" FROM {t} WHERE {pending} AND "ordering_key" IS NULL AND {claimable} AND {filter} AND "sequence" >= @floor_unordered
	ORDER BY "sequence" LIMIT {batch} FOR UPDATE SKIP LOCKED
)

-- name: unordered_retry
-- Unordered events below the floor that are due again, from the retry index, the only index
-- that can serve it (see walked_retry: unordered_idx holds the history below the floor).
unordered_retry AS MATERIALIZED (
	SELECT "sequence" FROM {t} WHERE {pending} AND COALESCE("ordering_key", '') = '' AND "next_attempt_at" <= now() AND ("lease_until" IS NULL OR "lease_until" < now())
		AND {pkfilter} AND "sequence" + 0 < @floor_unordered AND @floor_unordered > 0 ORDER BY "next_attempt_at" LIMIT {batch} FOR UPDATE SKIP LOCKED
)

-- name: unordered
-- Both unordered scans.
unordered AS (
	SELECT "sequence" FROM unordered_new UNION ALL SELECT "sequence" FROM unordered_retry
)

-- name: next_keyed
-- The next keyed floor's candidate (see subscription.floors): the first keyed event at or
-- above the floor that is pending, of the relay's topics (outages included: their events hold
-- the floor) and has no next_attempt_at (never failed: retries are found by walked_retry), and
-- whose key holds no dead-lettered or retrying event before it (those wait for that event; they
-- are found again by the relay when it delivers it, see subscription.lowerFloor, or by the
-- next_attempt_at an operator's retry or purge sets). Read under the claim's snapshot, before
-- its lease: events this claim leases hold the floor until they are published. The entries it
-- steps over are the events published since the floor last moved.
next_keyed AS MATERIALIZED (
	SELECT f."sequence" FROM {t} f WHERE f."published_at" IS NULL AND f."dead_lettered_at" IS NULL AND f."ordering_key" IS NOT NULL AND f."next_attempt_at" IS NULL
		AND {fbasefilter} AND f."sequence" >= @floor_keyed
		AND NOT EXISTS (SELECT 1 FROM {t} d WHERE d."published_at" IS NULL AND d."ordering_key" IS NOT NULL AND (d."dead_lettered_at" IS NOT NULL OR d."next_attempt_at" IS NOT NULL)
			AND d."ordering_key" = f."ordering_key" AND d."sequence" < f."sequence")
	ORDER BY f."sequence" LIMIT 1
)

-- name: next_unordered
-- The next unordered floor's candidate: the first pending unordered event at or above the
-- floor that never failed.
next_unordered AS MATERIALIZED (
	SELECT "sequence" FROM {t} WHERE {pending} AND "ordering_key" IS NULL AND "next_attempt_at" IS NULL AND {basefilter} AND "sequence" >= @floor_unordered
	ORDER BY "sequence" LIMIT 1
)

-- name: picked
-- What the claim leases: only the gap-free start of each run (a member's rank equals the number
-- of its key's members locked up to it: when another relay holds a key's head, this claim
-- leases nothing of that key instead of stranding its later events), and the unordered events.
picked AS MATERIALIZED (
	SELECT "sequence", rn FROM (
		SELECT r."sequence", r.rn, count(*) OVER (PARTITION BY r.k ORDER BY r.rn) AS locked
		FROM runs r JOIN locked l ON l."sequence" = r."sequence"
	) x WHERE x.locked = x.rn
	UNION ALL
	SELECT "sequence", 0 FROM unordered
	ORDER BY 1 LIMIT {batch}
)

-- name: upd
-- The lease: @lease_us from now under @token; delivery_starts counts the start.
upd AS (
	UPDATE {t} o SET "lease_until" = now() + @lease_us * interval '1 microsecond', "leased_by" = @token, "delivery_starts" = o."delivery_starts" + 1
	WHERE o."sequence" = ANY(ARRAY(SELECT "sequence" FROM picked))
	RETURNING o."sequence", o."id"::text AS id, o."topic", {payload} AS payload, o."headers"::text AS headers, o."ordering_key", o."created_at", o."attempts", o."last_error", o."delivery_starts"{extra}
)

-- name: result
-- The leased rows with their ranks (a join of the UPDATE's rows with picked: array_position per
-- row was quadratic in the batch), then one marker row with the skip scan's last key and key
-- count (the next claim resumes after that key, so every key is looked at within a few polls
-- however many keys are blocked before it; it starts over after a claim without a skip scan),
-- how many keys the walk found, and what the next floors are computed from (subscription.floors): the snapshot's xmin, this statement's
-- transaction id (assigned by the lease; NULL when it leased nothing), the highest sequence the
-- snapshot sees, the floors' candidates, and how many claimable heads the skip scan found
-- that probed did not. The
-- marker row comes after the leased rows, so the
-- UPDATE has run when pg_current_xact_id_if_assigned is read.
SELECT false, u."sequence", u.id, u."topic", u.payload, u.headers, u."ordering_key", u."created_at", u."attempts", u."last_error", p.rn, u."delivery_starts"{uextra}, NULL::text, NULL::bigint, NULL::bigint,
	NULL::bigint, NULL::bigint, NULL::bigint, NULL::bigint, NULL::bigint, NULL::bigint
FROM upd u JOIN picked p ON p."sequence" = u."sequence"
UNION ALL
SELECT true{nulls}, (SELECT max(k) FROM scanned), (SELECT count(*) FROM scanned), (SELECT count(*) FROM walk),
	pg_snapshot_xmin(pg_current_snapshot())::text::bigint, pg_current_xact_id_if_assigned()::text::bigint, (SELECT max("sequence") FROM {t}),
	(SELECT "sequence" FROM next_keyed), (SELECT "sequence" FROM next_unordered), (SELECT count(*) FROM sheads WHERE NOT (k = ANY(@low_keys::text[])))
