-- The MariaDB/MySQL relay's claim: complete statements with named parameters (@name), run in
-- order in one READ COMMITTED transaction (relay.go's Claim names the steps; MySQL has no
-- UPDATE … RETURNING, so what is leased is read in the transaction). Braces stand only for the
-- table's shape: {t} the quoted table, {pending_idx} and {key_idx} its pending and key indexes,
-- {extra} its extra columns (", o.`x`"). Times come from the database clock.
--
-- The topic condition is parameters: @topic_all, or @topic_prefix with @topic (a prefix, else an
-- exact name), minus @topic_not (a JSON array of [name, prefix] pairs, compared byte for byte);
-- a probe claims only the topics in @probe (@probe_on), and paused topics, @paused
-- (@paused_on), are left out. A list parameter (@heads, @seqs, @probe, @paused) is sent as one
-- placeholder per value (dialect.Stmt.Expand), so the server reads "sequence IN (…)" as ranges
-- of the primary key. With the driver's interpolateParams (the tests' and the benchmarks' DSN)
-- the server sees the values as literals and folds the conditions on them away: "1 OR …" for
-- every topic, "NOT 0 OR …" while nothing is paused. No condition on a parameter chooses an
-- index: the walks name theirs (FORCE INDEX), every other read is by key or by primary key
-- (TestClaimPlans).

-- name: window
-- Step 1a, the walk's window: a plain read of the @window oldest claimable pending keyed events
-- from @floor_keyed on, each with whether it is its key's head (the lowest sequence among the
-- key's unpublished events, dead-lettered ones included: one read of the key index per row).
SELECT w.s, w.k, w.s = (SELECT h.`sequence` FROM {t} h FORCE INDEX ({key_idx}) WHERE h.`outbox_key` = w.k ORDER BY h.`sequence` LIMIT 1)
FROM (SELECT o.`sequence` AS s, o.`outbox_key` AS k FROM {t} o FORCE INDEX ({pending_idx})
	WHERE o.`outbox_pending` = 1 AND o.`sequence` >= @floor_keyed
	AND (o.`next_attempt_at` IS NULL OR o.`next_attempt_at` <= UTC_TIMESTAMP(6)) AND (o.`lease_until` IS NULL OR o.`lease_until` < UTC_TIMESTAMP(6))
	AND (@topic_all OR (@topic_prefix AND LEFT(o.`topic`, CHAR_LENGTH(@topic)) = @topic) OR (NOT @topic_prefix AND o.`topic` = @topic))
	AND (@topic_not = '[]' OR NOT EXISTS (SELECT 1 FROM JSON_TABLE(@topic_not, '$[*]' COLUMNS (v VARCHAR(255) PATH '$[0]', p INT PATH '$[1]')) n
		WHERE IF(n.p, LEFT(CAST(o.`topic` AS BINARY), LENGTH(n.v)) = CAST(n.v AS BINARY), CAST(o.`topic` AS BINARY) = CAST(n.v AS BINARY))))
	AND (NOT @probe_on OR o.`topic` IN (@probe)) AND (NOT @paused_on OR NOT o.`topic` IN (@paused))
	ORDER BY o.`sequence` LIMIT @window) w

-- name: walk
-- Step 1b: the first @oldest of the window's heads (@heads) still claimable, locked by primary
-- key, FOR UPDATE SKIP LOCKED, so a relay claiming at the same moment passes over them.
SELECT o.`sequence`, o.`outbox_key` FROM {t} o WHERE o.`sequence` IN (@heads) AND o.`outbox_pending` = 1
	AND (o.`next_attempt_at` IS NULL OR o.`next_attempt_at` <= UTC_TIMESTAMP(6)) AND (o.`lease_until` IS NULL OR o.`lease_until` < UTC_TIMESTAMP(6))
ORDER BY o.`sequence` LIMIT @oldest FOR UPDATE SKIP LOCKED

-- name: scan
-- Step 2, the key skip scan: up to @key_scan keys after @cursor with their heads (a loose index
-- scan of the key index), each with whether its head is claimable and of the subscription's
-- topics.
SELECT s.k, s.h, o.`sequence` IS NOT NULL FROM (SELECT h.`outbox_key` AS k, MIN(h.`sequence`) AS h FROM {t} h FORCE INDEX ({key_idx})
	WHERE h.`outbox_key` > @cursor GROUP BY h.`outbox_key` ORDER BY h.`outbox_key` LIMIT @key_scan) s
LEFT JOIN {t} o ON o.`sequence` = s.h AND o.`dead_lettered_at` IS NULL
	AND (o.`next_attempt_at` IS NULL OR o.`next_attempt_at` <= UTC_TIMESTAMP(6)) AND (o.`lease_until` IS NULL OR o.`lease_until` < UTC_TIMESTAMP(6))
	AND (@topic_all OR (@topic_prefix AND LEFT(o.`topic`, CHAR_LENGTH(@topic)) = @topic) OR (NOT @topic_prefix AND o.`topic` = @topic))
	AND (@topic_not = '[]' OR NOT EXISTS (SELECT 1 FROM JSON_TABLE(@topic_not, '$[*]' COLUMNS (v VARCHAR(255) PATH '$[0]', p INT PATH '$[1]')) n
		WHERE IF(n.p, LEFT(CAST(o.`topic` AS BINARY), LENGTH(n.v)) = CAST(n.v AS BINARY), CAST(o.`topic` AS BINARY) = CAST(n.v AS BINARY))))
	AND (NOT @probe_on OR o.`topic` IN (@probe)) AND (NOT @paused_on OR NOT o.`topic` IN (@paused))

-- Step 3, runs: one of the three statements below per candidate key, up to @run events of the
-- key from @from (one range of the key index), tagged with the candidate's index @i; the relay
-- sends a chunk of them as one UNION ALL. A key that fails its check returns no rows; each
-- check is an uncorrelated scalar subquery, one index read.

-- name: run_walked
-- A walked key's run from its locked head, while that head is still the key's first event.
(SELECT @i AS i, o.`sequence` FROM {t} o FORCE INDEX ({key_idx}) WHERE o.`outbox_key` = @key AND o.`sequence` >= @from
	AND (SELECT h.`sequence` FROM {t} h FORCE INDEX ({key_idx}) WHERE h.`outbox_key` = @key ORDER BY h.`sequence` LIMIT 1) = @from
	ORDER BY o.`sequence` LIMIT @run)

-- name: run_scanned
-- A scanned key's run from its claimable head.
(SELECT @i AS i, o.`sequence` FROM {t} o FORCE INDEX ({key_idx}) WHERE o.`outbox_key` = @key AND o.`sequence` >= @from
	ORDER BY o.`sequence` LIMIT @run)

-- name: run_cont
-- A continuation's run after its previous run (@from = @after + 1): the key's first unpublished
-- event from the previous run's first sequence (@cont_from) on is after that run (its marks
-- landed) or still leased under @cont_token with at least @margin_us of lease left.
(SELECT @i AS i, o.`sequence` FROM {t} o FORCE INDEX ({key_idx}) WHERE o.`outbox_key` = @key AND o.`sequence` >= @from
	AND (SELECT h.`sequence` > @after OR (h.`leased_by` = @cont_token AND h.`lease_until` > UTC_TIMESTAMP(6) + INTERVAL @margin_us MICROSECOND) FROM {t}
		h FORCE INDEX ({key_idx}) WHERE h.`outbox_key` = @key AND h.`sequence` >= @cont_from ORDER BY h.`sequence` LIMIT 1)
	ORDER BY o.`sequence` LIMIT @run)

-- name: lock
-- Step 4: the runs' members (@seqs) by primary key, FOR UPDATE SKIP LOCKED, with the pending,
-- claimable and topic conditions checked again on the latest row version (a key's run may hold
-- events of other topics, which end its run here).
SELECT o.`sequence`, o.`id`, o.`topic`, o.`payload`, o.`headers`, o.`ordering_key`, CAST(o.`created_at` AS CHAR), o.`attempts`, o.`last_error`, o.`delivery_starts`{extra}
FROM {t} o WHERE o.`sequence` IN (@seqs) AND o.`published_at` IS NULL AND o.`dead_lettered_at` IS NULL
	AND (o.`next_attempt_at` IS NULL OR o.`next_attempt_at` <= UTC_TIMESTAMP(6)) AND (o.`lease_until` IS NULL OR o.`lease_until` < UTC_TIMESTAMP(6))
	AND (@topic_all OR (@topic_prefix AND LEFT(o.`topic`, CHAR_LENGTH(@topic)) = @topic) OR (NOT @topic_prefix AND o.`topic` = @topic))
	AND (@topic_not = '[]' OR NOT EXISTS (SELECT 1 FROM JSON_TABLE(@topic_not, '$[*]' COLUMNS (v VARCHAR(255) PATH '$[0]', p INT PATH '$[1]')) n
		WHERE IF(n.p, LEFT(CAST(o.`topic` AS BINARY), LENGTH(n.v)) = CAST(n.v AS BINARY), CAST(o.`topic` AS BINARY) = CAST(n.v AS BINARY))))
	AND (NOT @probe_on OR o.`topic` IN (@probe)) AND (NOT @paused_on OR NOT o.`topic` IN (@paused))
ORDER BY o.`sequence` FOR UPDATE SKIP LOCKED

-- name: unordered
-- Step 5: the @batch oldest claimable pending unordered events from @floor_unordered on, FOR
-- UPDATE SKIP LOCKED.
SELECT o.`sequence`, o.`id`, o.`topic`, o.`payload`, o.`headers`, o.`ordering_key`, CAST(o.`created_at` AS CHAR), o.`attempts`, o.`last_error`, o.`delivery_starts`{extra}
FROM {t} o FORCE INDEX ({pending_idx}) WHERE o.`outbox_pending` = 0 AND o.`sequence` >= @floor_unordered
	AND (o.`next_attempt_at` IS NULL OR o.`next_attempt_at` <= UTC_TIMESTAMP(6)) AND (o.`lease_until` IS NULL OR o.`lease_until` < UTC_TIMESTAMP(6))
	AND (@topic_all OR (@topic_prefix AND LEFT(o.`topic`, CHAR_LENGTH(@topic)) = @topic) OR (NOT @topic_prefix AND o.`topic` = @topic))
	AND (@topic_not = '[]' OR NOT EXISTS (SELECT 1 FROM JSON_TABLE(@topic_not, '$[*]' COLUMNS (v VARCHAR(255) PATH '$[0]', p INT PATH '$[1]')) n
		WHERE IF(n.p, LEFT(CAST(o.`topic` AS BINARY), LENGTH(n.v)) = CAST(n.v AS BINARY), CAST(o.`topic` AS BINARY) = CAST(n.v AS BINARY))))
	AND (NOT @probe_on OR o.`topic` IN (@probe)) AND (NOT @paused_on OR NOT o.`topic` IN (@paused))
ORDER BY o.`sequence` LIMIT @batch FOR UPDATE SKIP LOCKED

-- name: lease
-- Step 6: leases the picked events (@seqs) under @token for @lease_us, a delivery start each.
UPDATE {t} o SET o.`lease_until` = UTC_TIMESTAMP(6) + INTERVAL @lease_us MICROSECOND, o.`leased_by` = @token, o.`delivery_starts` = o.`delivery_starts` + 1
WHERE o.`sequence` IN (@seqs)
