-- The MariaDB/MySQL operator statements (dialect.Operator, console.go): complete statements with
-- named parameters (@name). Braces stand only for the table's shape and constants: {t} the
-- quoted table, {pending_idx}, {key_idx}, {dead_idx} and {published_idx} its indexes, {held} and
-- {held_skip} dialect.HeldCountLimit and one less, {scan} dialect.LeaseScan, {skipped} the header
-- dialect.SkippedKeyHeader. Times come from the database clock. Every read of the table names its
-- index (FORCE INDEX) or goes by primary key, so that none reads the published history
-- (TestOperatorPlans).

-- name: blocked_keys
-- Each key's head (MIN(sequence) per outbox_key: a loose scan of the key index, one dive per
-- key), kept when it failed or is dead-lettered (a primary-key read) and a pending event waits
-- behind it (a range of the key index), oldest head first; the held events are counted up to
-- {held}: the {held}th one found means {held}, otherwise the count (both ranges of the key index).
SELECT f.k, o.`sequence`, o.`id`, o.`topic`, o.`attempts`, o.`last_error`, CAST(o.`next_attempt_at` AS CHAR), CAST(o.`dead_lettered_at` AS CHAR), CAST(o.`created_at` AS CHAR),
	COALESCE((SELECT {held} FROM {t} r FORCE INDEX ({key_idx}) WHERE r.`outbox_key` = f.k AND r.`sequence` > f.s AND r.`dead_lettered_at` IS NULL ORDER BY r.`sequence` LIMIT 1 OFFSET {held_skip}),
		(SELECT COUNT(*) FROM {t} r FORCE INDEX ({key_idx}) WHERE r.`outbox_key` = f.k AND r.`sequence` > f.s AND r.`dead_lettered_at` IS NULL)),
	CAST(UTC_TIMESTAMP(6) AS CHAR)
FROM (SELECT h.`outbox_key` AS k, MIN(h.`sequence`) AS s FROM {t} h FORCE INDEX ({key_idx}) WHERE h.`outbox_key` IS NOT NULL GROUP BY h.`outbox_key`) f
JOIN {t} o ON o.`sequence` = f.s
WHERE (o.`dead_lettered_at` IS NOT NULL OR o.`attempts` > 0)
	AND EXISTS (SELECT 1 FROM {t} r FORCE INDEX ({key_idx}) WHERE r.`outbox_key` = f.k AND r.`sequence` > f.s AND r.`dead_lettered_at` IS NULL)
ORDER BY o.`sequence` LIMIT @limit

-- name: head
-- ActOnHead's first step: the key's head (its first entry of the key index, dead-lettered
-- events included) locked FOR UPDATE, with whether it failed or is dead-lettered and whether no
-- relay holds an unexpired lease on it.
SELECT o.`sequence`, o.`dead_lettered_at` IS NOT NULL OR o.`attempts` > 0, o.`lease_until` IS NULL OR o.`lease_until` < UTC_TIMESTAMP(6)
FROM {t} o FORCE INDEX ({key_idx}) WHERE o.`outbox_key` = @key ORDER BY o.`sequence` LIMIT 1 FOR UPDATE

-- name: head_retry
-- Due now: a failed head keeps its attempts, a dead-lettered one gets fresh ones (MySQL assigns
-- left to right: attempts reads dead_lettered_at before it is cleared).
UPDATE {t} o SET o.`next_attempt_at` = UTC_TIMESTAMP(6), o.`attempts` = IF(o.`dead_lettered_at` IS NULL, o.`attempts`, 0), o.`dead_lettered_at` = NULL
WHERE o.`sequence` = @seq

-- name: head_skip
-- The head leaves its key as a dead letter: ordering_key and outbox_key NULL, the key kept in the
-- header (written first, from the key it still has).
UPDATE {t} o SET o.`headers` = JSON_SET(o.`headers`, '$."{skipped}"', o.`ordering_key`), o.`dead_lettered_at` = COALESCE(o.`dead_lettered_at`, UTC_TIMESTAMP(6)),
	o.`next_attempt_at` = NULL, o.`ordering_key` = NULL, o.`outbox_key` = NULL
WHERE o.`sequence` = @seq

-- name: head_purge
DELETE FROM {t} WHERE `sequence` = @seq

-- name: next_unpublished
-- The key's first unpublished event after @seq (after a skip: its new head).
SELECT o.`sequence` FROM {t} o FORCE INDEX ({key_idx}) WHERE o.`outbox_key` = @key AND o.`sequence` > @seq ORDER BY o.`sequence` LIMIT 1

-- name: next_pending
-- The key's first pending event after @seq (after a purge, as PurgeDead's successor).
SELECT o.`sequence` FROM {t} o FORCE INDEX ({key_idx}) WHERE o.`outbox_key` = @key AND o.`sequence` > @seq AND o.`dead_lettered_at` IS NULL
ORDER BY o.`sequence` LIMIT 1

-- name: due_now
UPDATE {t} o SET o.`next_attempt_at` = UTC_TIMESTAMP(6)
WHERE o.`sequence` = @seq AND o.`published_at` IS NULL AND o.`dead_lettered_at` IS NULL AND o.`next_attempt_at` IS NULL

-- name: stats
-- DeliveryStats: the newest @rows events published within the last @window_us microseconds (a
-- backward range of the published_at index), by minute since the epoch: count, mean and maximum
-- delay (microseconds), the 95th percentile's index floor(0.95·(n-1)) with the delays at it and
-- right after it (numbered by a window function), and the clock.
SELECT p.m, COUNT(*), AVG(p.d), MAX(p.d), MAX(p.at), MAX(IF(p.i = p.at, p.d, NULL)), MAX(IF(p.i = p.at + 1, p.d, NULL)), CAST(UTC_TIMESTAMP(6) AS CHAR)
FROM (SELECT q.m, q.d, CAST(ROW_NUMBER() OVER (PARTITION BY q.m ORDER BY q.d) AS SIGNED) - 1 AS i, FLOOR(0.95 * (COUNT(*) OVER (PARTITION BY q.m) - 1)) AS at
	FROM (SELECT TIMESTAMPDIFF(MINUTE, '1970-01-01 00:00:00', o.`published_at`) AS m, GREATEST(TIMESTAMPDIFF(MICROSECOND, o.`created_at`, o.`published_at`), 0) AS d
		FROM {t} o FORCE INDEX ({published_idx}) WHERE o.`published_at` >= UTC_TIMESTAMP(6) - INTERVAL @window_us MICROSECOND
		ORDER BY o.`published_at` DESC LIMIT @rows) q) p
GROUP BY p.m ORDER BY p.m

-- name: leases
-- Leases: the first @rows unexpired leases in sequence order among the {scan} oldest pending
-- events of each kind (the pending index's live entries: 0 unordered, 1 keyed).
SELECT w.`leased_by`, CAST(w.`lease_until` AS CHAR), CAST(UTC_TIMESTAMP(6) AS CHAR) FROM (
	(SELECT o.`sequence`, o.`leased_by`, o.`lease_until` FROM {t} o FORCE INDEX ({pending_idx}) WHERE o.`outbox_pending` = 0 ORDER BY o.`sequence` LIMIT {scan})
	UNION ALL
	(SELECT o.`sequence`, o.`leased_by`, o.`lease_until` FROM {t} o FORCE INDEX ({pending_idx}) WHERE o.`outbox_pending` = 1 ORDER BY o.`sequence` LIMIT {scan})) w
WHERE w.`leased_by` IS NOT NULL AND w.`lease_until` > UTC_TIMESTAMP(6) ORDER BY w.`sequence` LIMIT @rows

-- name: overview
-- BacklogOverview: u and k the @limit oldest pending unordered and keyed events (the pending
-- index), d the @limit earliest dead letters (the dead_lettered_at index). A keyed event read is
-- held when its key's head (one dive of the key index) is below it and failed or is dead-lettered
-- (by primary key): a correlated test per event, since MariaDB 10.11 joined k to the heads without
-- a key (k × heads rows: 880 ms at 2,000 of each, 1M published and 100k pending). h is the head
-- of each key of k and f those heads that failed or are dead-lettered, for the count of failed
-- heads only. The last four columns count the rows read of each kind (window sums over the
-- groups, so that u, k and d are not read again; f: the failed heads found).
WITH u AS (SELECT o.`topic`, o.`created_at`, o.`last_error_class` FROM {t} o FORCE INDEX ({pending_idx}) WHERE o.`outbox_pending` = 0 ORDER BY o.`sequence` LIMIT @limit),
k AS (SELECT o.`topic`, o.`created_at`, o.`last_error_class`, o.`outbox_key` AS okey, o.`sequence` FROM {t} o FORCE INDEX ({pending_idx}) WHERE o.`outbox_pending` = 1 ORDER BY o.`sequence` LIMIT @limit),
d AS (SELECT o.`topic` FROM {t} o FORCE INDEX ({dead_idx}) WHERE o.`dead_lettered_at` IS NOT NULL AND o.`published_at` IS NULL ORDER BY o.`dead_lettered_at` LIMIT @limit),
h AS (SELECT x.okey AS k, (SELECT e.`sequence` FROM {t} e FORCE INDEX ({key_idx}) WHERE e.`outbox_key` = x.okey ORDER BY e.`sequence` LIMIT 1) AS s FROM (SELECT DISTINCT k.okey FROM k) x),
f AS (SELECT h.k, h.s FROM h JOIN {t} o ON o.`sequence` = h.s WHERE o.`dead_lettered_at` IS NOT NULL OR o.`attempts` > 0),
p AS (SELECT u.`topic`, u.`created_at`, u.`last_error_class` AS cls, 0 AS held, 1 AS kind FROM u
	UNION ALL SELECT k.`topic`, k.`created_at`, k.`last_error_class`, EXISTS (SELECT 1 FROM {t} o WHERE o.`sequence` = (SELECT e.`sequence` FROM {t} e FORCE INDEX ({key_idx})
		WHERE e.`outbox_key` = k.okey ORDER BY e.`sequence` LIMIT 1) AND o.`sequence` < k.`sequence` AND (o.`dead_lettered_at` IS NOT NULL OR o.`attempts` > 0)), 2 FROM k
	UNION ALL SELECT d.`topic`, NULL, NULL, 0, 3 FROM d)
SELECT p.`topic`, SUM(p.kind < 3), CAST(MIN(p.`created_at`) AS CHAR), SUM(p.kind = 3), CAST(UTC_TIMESTAMP(6) AS CHAR),
	IF(MAX(p.cls <=> 'unavailable') = 1, SUM(p.kind < 3), 0), SUM(p.held),
	CAST(SUM(SUM(p.kind = 1)) OVER () AS SIGNED), CAST(SUM(SUM(p.kind = 2)) OVER () AS SIGNED), CAST(SUM(SUM(p.kind = 3)) OVER () AS SIGNED), (SELECT COUNT(*) FROM f)
FROM p GROUP BY p.`topic` ORDER BY p.`topic`
