-- name: mark
-- A batch's outcome in one statement, database clock, each update fenced by the batch's token
-- (leased_by = @token, still pending) and free of joins with the parameter arrays: acked →
-- published; released → lease given back; unavailable → released with last_error noted and no
-- attempt counted (delivery_starts kept when not attempted, @keep: last_error_class
-- 'not_attempted', else 'unavailable'); failed → attempts + 1 and a retry after
-- @retry_base_us·2^attempts capped at @retry_max_us, × jitter, or a dead letter at
-- @max_attempts or when permanent (last_error_class 'permanent' or 'failure'); abandoned
-- (unanswered at a stop) → released, the delivery start uncounted; held (never emitted: its
-- destination in an outage or over its rate limit) → released, the start uncounted, due again
-- @held_for µs later, class 'held'.
WITH acked AS (
	UPDATE {t} SET "published_at" = now(), "lease_until" = NULL, "leased_by" = NULL, "delivery_starts" = 0
	WHERE "sequence" = ANY(@acked::bigint[]) AND "leased_by" = @token AND "published_at" IS NULL RETURNING "sequence", "attempts", NULL::timestamptz AS next, false AS dead
), released AS (
	UPDATE {t} SET "lease_until" = NULL, "leased_by" = NULL, "delivery_starts" = 0
	WHERE "sequence" = ANY(@released::bigint[]) AND "leased_by" = @token AND "published_at" IS NULL RETURNING "sequence", "attempts", NULL::timestamptz AS next, false AS dead
), unavailable AS (
	UPDATE {t} o SET "lease_until" = NULL, "leased_by" = NULL,
		"delivery_starts" = CASE WHEN (@keep::bool[])[array_position(@unavailable::bigint[], o."sequence")] THEN o."delivery_starts" ELSE 0 END,
		"last_error" = (@notes::text[])[array_position(@unavailable::bigint[], o."sequence")],
		"last_error_class" = CASE WHEN (@keep::bool[])[array_position(@unavailable::bigint[], o."sequence")] THEN 'not_attempted' ELSE 'unavailable' END
	WHERE o."sequence" = ANY(@unavailable::bigint[]) AND "leased_by" = @token AND "published_at" IS NULL RETURNING o."sequence", o."attempts", NULL::timestamptz AS next, false AS dead
), failed AS (
	UPDATE {t} o SET "attempts" = o."attempts" + 1,
		"last_error" = (@errs::text[])[array_position(@failed::bigint[], o."sequence")],
		"last_error_class" = CASE WHEN (@perm::bool[])[array_position(@failed::bigint[], o."sequence")] THEN 'permanent' ELSE 'failure' END,
		"dead_lettered_at" = CASE WHEN o."attempts" + 1 >= @max_attempts OR (@perm::bool[])[array_position(@failed::bigint[], o."sequence")] THEN now() END,
		"next_attempt_at" = CASE WHEN o."attempts" + 1 < @max_attempts AND NOT (@perm::bool[])[array_position(@failed::bigint[], o."sequence")]
			THEN now() + LEAST(@retry_base_us::float8 * power(2::float8, LEAST(o."attempts", 62)), @retry_max_us::float8)
			* (@jitters::float8[])[array_position(@failed::bigint[], o."sequence")] * interval '1 microsecond' END,
		"lease_until" = NULL, "leased_by" = NULL, "delivery_starts" = 0
	WHERE o."sequence" = ANY(@failed::bigint[]) AND "leased_by" = @token AND "published_at" IS NULL RETURNING o."sequence", o."attempts", o."next_attempt_at" AS next, o."dead_lettered_at" IS NOT NULL AS dead
), held AS (
	UPDATE {t} o SET "delivery_starts" = GREATEST(o."delivery_starts" - 1, 0), "lease_until" = NULL, "leased_by" = NULL,
		"next_attempt_at" = now() + (@held_for::bigint[])[array_position(@held::bigint[], o."sequence")] * interval '1 microsecond',
		"last_error" = (@held_notes::text[])[array_position(@held::bigint[], o."sequence")], "last_error_class" = 'held'
	WHERE o."sequence" = ANY(@held::bigint[]) AND "leased_by" = @token AND "published_at" IS NULL RETURNING o."sequence", o."attempts", o."next_attempt_at" AS next, false AS dead
), abandoned AS (
	UPDATE {t} SET "delivery_starts" = GREATEST("delivery_starts" - 1, 0), "lease_until" = NULL, "leased_by" = NULL
	WHERE "sequence" = ANY(@abandoned::bigint[]) AND "leased_by" = @token AND "published_at" IS NULL RETURNING "sequence"
)
SELECT "sequence", "attempts", next, dead, now() FROM acked
UNION ALL SELECT "sequence", "attempts", next, dead, now() FROM released
UNION ALL SELECT "sequence", "attempts", next, dead, now() FROM unavailable
UNION ALL SELECT "sequence", "attempts", next, dead, now() FROM failed
UNION ALL SELECT "sequence", "attempts", next, dead, now() FROM held

-- name: renew
-- Extends the lease of a batch's events still held under its token (count = events held).
UPDATE {t} SET "lease_until" = now() + @lease_us * interval '1 microsecond' WHERE "sequence" = ANY(@seqs::bigint[]) AND "leased_by" = @token AND "published_at" IS NULL
