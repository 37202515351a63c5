package dialect

import (
	"fmt"
	"strings"
)

// BacklogSQL is the Backlog statement of the dialects that quote with double quotes and have
// partial indexes (PostgreSQL, SQLite): now is the clock expression, least the two-argument
// minimum function (LEAST, or SQLite's min; both arguments are coalesced, since SQLite's
// min(a, NULL) is NULL).
//
// Every count names the predicate of a partial index (keyed_idx, unordered_idx, dead_idx,
// key_idx) so that the planner can use it: a predicate that matches none (for example
// "published_at IS NULL AND dead_lettered_at IS NULL" alone) made PostgreSQL scan the whole
// table, 1.1M rows for 100k pending ones (EXPLAIN, 2026-12-01: 536 ms and 40k buffers for the
// unavailable count, 32 ms and 6.7k buffers split as below).
//
// Unavailable: the pending events of every topic that has a pending event whose last answer
// was classed unavailable (last_error_class): while a destination is down the relay claims
// none of its topics' events (but one probe at a time), so the whole topic is held by the
// outage, not only the events it tried. One pass over the pending rows (both pending indexes),
// grouped by topic.
//
// Held: the candidate heads are the unpublished keyed rows (key_idx) that are dead-lettered or
// have attempts > 0 (a filter on those rows' heap tuples: O(pending keyed), no index holds
// attempts); each is checked to be its key's head and its held successors counted by
// correlated subqueries, one key_idx probe each, so the work beyond the scan is O(failed heads
// + held events). Correlated subqueries rather than joins: the planner misjudges how few
// candidates survive (attempts > 0 is common in the history it has statistics for) and hashed
// every pending keyed row instead (358 ms against 102 ms with 4.7k buffers on 100k pending +
// 1M published rows, 10 failed heads).
func BacklogSQL(table, now, least string) string {
	return fmt.Sprintf(`SELECT
	(SELECT count(*) FROM %[1]s WHERE "published_at" IS NULL AND "dead_lettered_at" IS NULL AND "ordering_key" IS NULL)
	+ (SELECT count(*) FROM %[1]s WHERE "published_at" IS NULL AND "dead_lettered_at" IS NULL AND "ordering_key" IS NOT NULL),
	%[3]s(COALESCE(u.c, k.c), COALESCE(k.c, u.c)),
	(SELECT count(*) FROM %[1]s WHERE "dead_lettered_at" IS NOT NULL),
	%[2]s,
	(SELECT COALESCE(sum(x.n), 0) FROM (SELECT count(*) AS n FROM (
		SELECT "topic", "last_error_class" FROM %[1]s WHERE "published_at" IS NULL AND "dead_lettered_at" IS NULL AND "ordering_key" IS NULL
		UNION ALL SELECT "topic", "last_error_class" FROM %[1]s WHERE "published_at" IS NULL AND "dead_lettered_at" IS NULL AND "ordering_key" IS NOT NULL) p
		GROUP BY p."topic" HAVING max(CASE WHEN p."last_error_class" = 'unavailable' THEN 1 ELSE 0 END) = 1) x),
	(SELECT COALESCE(sum(x.n), 0) FROM (SELECT
		(SELECT count(*) FROM %[1]s r WHERE r."published_at" IS NULL AND r."ordering_key" = h."ordering_key" AND r."sequence" > h."sequence" AND r."dead_lettered_at" IS NULL) AS n
		FROM %[1]s h
		WHERE h."published_at" IS NULL AND h."ordering_key" IS NOT NULL AND (h."dead_lettered_at" IS NOT NULL OR h."attempts" > 0)
		AND h."sequence" = (SELECT min(e."sequence") FROM %[1]s e WHERE e."published_at" IS NULL AND e."ordering_key" = h."ordering_key")) x)
FROM (SELECT (SELECT "created_at" FROM %[1]s WHERE "published_at" IS NULL AND "dead_lettered_at" IS NULL AND "ordering_key" IS NULL ORDER BY "sequence" LIMIT 1) AS c) u,
	(SELECT (SELECT "created_at" FROM %[1]s WHERE "published_at" IS NULL AND "dead_lettered_at" IS NULL AND "ordering_key" IS NOT NULL ORDER BY "sequence" LIMIT 1) AS c) k`,
		table, now, least)
}

// BacklogByTopicSQL is the BacklogByTopic statement of PostgreSQL and SQLite (see BacklogSQL).
// failed: each key whose head failed (see Backlog.Held), with the head's sequence. It reads
// every unpublished row, through the partial indexes: the unpublished rows are split into the
// three predicates of key_idx, unordered_idx and dead_idx (an OR that PostgreSQL serves with a
// BitmapOr of the three), since "published_at IS NULL" alone matches no index and read the
// whole table (EXPLAIN ANALYZE, 200k published + 10k pending + 100 dead rows, 2026-12-02:
// sequential scan of 5,994 heap pages, 12.4k buffers in all; with the split 325 heap and 45
// index buffers, 6.7k in all, the rest the failed heads' key_idx probes).
func BacklogByTopicSQL(table, now string) string {
	return fmt.Sprintf(`WITH failed AS (
	SELECT h."ordering_key" AS k, h."sequence" AS s FROM %[1]s h
	WHERE h."published_at" IS NULL AND h."ordering_key" IS NOT NULL AND (h."dead_lettered_at" IS NOT NULL OR h."attempts" > 0)
	AND h."sequence" = (SELECT min(e."sequence") FROM %[1]s e WHERE e."published_at" IS NULL AND e."ordering_key" = h."ordering_key"))
SELECT o."topic",
	count(*) FILTER (WHERE o."dead_lettered_at" IS NULL),
	min(o."created_at") FILTER (WHERE o."dead_lettered_at" IS NULL),
	count(*) FILTER (WHERE o."dead_lettered_at" IS NOT NULL),
	%[2]s,
	CASE WHEN count(*) FILTER (WHERE o."dead_lettered_at" IS NULL AND o."last_error_class" = 'unavailable') > 0 THEN count(*) FILTER (WHERE o."dead_lettered_at" IS NULL) ELSE 0 END,
	count(*) FILTER (WHERE o."dead_lettered_at" IS NULL AND o."sequence" > f.s)
FROM %[1]s o LEFT JOIN failed f ON f.k = o."ordering_key"
WHERE o."published_at" IS NULL AND (o."ordering_key" IS NOT NULL
	OR (o."ordering_key" IS NULL AND o."dead_lettered_at" IS NULL) OR (o."ordering_key" IS NULL AND o."dead_lettered_at" IS NOT NULL))
GROUP BY o."topic" ORDER BY o."topic"`, table, now)
}

// ScanBacklog reads the one row of a Backlog statement: pending, oldest created_at, dead
// letters, now, unavailable, held.
func ScanBacklog(rs Rows) (BacklogRow, error) {
	defer rs.Close()
	var b BacklogRow
	if rs.Next() {
		if err := rs.Scan(&b.Pending, (*Time)(&b.Oldest), &b.DeadLettered, (*Time)(&b.Now), &b.Unavailable, &b.Held); err != nil {
			return BacklogRow{}, err
		}
	}
	return b, rs.Err()
}

// ScanBacklogByTopic reads a BacklogByTopic statement's rows: topic, then ScanBacklog's columns.
func ScanBacklogByTopic(rs Rows) ([]BacklogRow, error) {
	defer rs.Close()
	var out []BacklogRow
	for rs.Next() {
		var b BacklogRow
		if err := rs.Scan(&b.Topic, &b.Pending, (*Time)(&b.Oldest), &b.DeadLettered, (*Time)(&b.Now), &b.Unavailable, &b.Held); err != nil {
			return nil, err
		}
		out = append(out, b)
	}
	return out, rs.Err()
}

// ScanDead reads dead letters: sequence, id, topic, payload, headers, ordering_key,
// idempotency_key, created_at, attempts, last_error, dead_lettered_at.
func ScanDead(rs Rows) ([]DeadRow, error) {
	defer rs.Close()
	var out []DeadRow
	for rs.Next() {
		var d DeadRow
		if err := rs.Scan(&d.Sequence, &d.ID, &d.Topic, &d.Payload, &d.Headers, &d.OrderingKey, &d.IdempotencyKey,
			(*Time)(&d.CreatedAt), &d.Attempts, &d.LastError, (*Time)(&d.DeadLetteredAt)); err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	return out, rs.Err()
}

// ScanOne reads the single value of a one-row result (the zero value when there is no row).
func ScanOne[T any](rs Rows) (T, error) {
	defer rs.Close()
	var v T
	if rs.Next() {
		if err := rs.Scan(&v); err != nil {
			return v, err
		}
	}
	return v, rs.Err()
}

// ScanList reads every row's single column and closes rs.
func ScanList[T any](rs Rows) ([]T, error) {
	defer rs.Close()
	var out []T
	for rs.Next() {
		var v T
		if err := rs.Scan(&v); err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rs.Err()
}

// ScanSet reads every row's single text column into a set and closes rs.
func ScanSet(rs Rows) (map[string]bool, error) {
	names, err := ScanList[string](rs)
	if err != nil {
		return nil, err
	}
	set := make(map[string]bool, len(names))
	for _, n := range names {
		set[n] = true
	}
	return set, nil
}

// ScanStoredRows reads Stored rows: sequence, id, topic, ordering_key, idempotency_key,
// created_at.
func ScanStoredRows(rs Rows) ([]Stored, error) {
	defer rs.Close()
	var out []Stored
	for rs.Next() {
		var st Stored
		if err := rs.Scan(&st.Sequence, &st.ID, &st.Topic, &st.OrderingKey, &st.IdempotencyKey, (*Time)(&st.CreatedAt)); err != nil {
			return nil, err
		}
		out = append(out, st)
	}
	return out, rs.Err()
}

// ScanResolved reads a ResolveScoped statement's rows: the probe's index, then the stored
// columns, then whether the extra columns agree.
func ScanResolved(rs Rows) ([]Resolved, error) {
	defer rs.Close()
	var out []Resolved
	for rs.Next() {
		var r Resolved
		if err := rs.Scan(&r.Index, &r.Sequence, &r.ID, &r.Topic, &r.OrderingKey, &r.IdempotencyKey, (*Time)(&r.CreatedAt), &r.Same); err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rs.Err()
}

// IdempotencyColumns returns the quoted columns of the idempotency unique index (double
// quotes): the scope columns, then "idempotency_key". It is also the writers' ON CONFLICT
// target.
func IdempotencyColumns(t *Table) string {
	cols := make([]string, 0, len(t.Scope)+1)
	for _, c := range t.Scope {
		cols = append(cols, DoubleQuote(c))
	}
	return strings.Join(append(cols, `"idempotency_key"`), ", ")
}

// IdempotencyIndexSQL is the DDL of the idempotency unique index named name (PostgreSQL,
// SQLite). Partial, so the common event without a key costs no index entry; the writers' ON
// CONFLICT names the same columns and predicate.
func IdempotencyIndexSQL(t *Table, table, name string, concurrently bool) string {
	how := ""
	if concurrently {
		how = "CONCURRENTLY "
	}
	return fmt.Sprintf(`CREATE UNIQUE INDEX %sIF NOT EXISTS %s ON %s (%s) WHERE "idempotency_key" IS NOT NULL`, how, name, table, IdempotencyColumns(t))
}

// IndexStatements returns the relay's indexes of PostgreSQL and SQLite (identical text).
func IndexStatements(t *Table, table string) []string {
	index := func(suffix string) string { return DoubleQuote(t.IndexBase + "_" + suffix) }
	return []string{
		// Pending events by sequence, in two partial indexes: keyed ones (the relay's walk of
		// the oldest claimable keyed events) and unordered ones (the relay's unordered scan).
		fmt.Sprintf(`CREATE INDEX IF NOT EXISTS %s ON %s ("sequence") WHERE "published_at" IS NULL AND "dead_lettered_at" IS NULL AND "ordering_key" IS NOT NULL`, index("keyed_idx"), table),
		fmt.Sprintf(`CREATE INDEX IF NOT EXISTS %s ON %s ("sequence") WHERE "published_at" IS NULL AND "dead_lettered_at" IS NULL AND "ordering_key" IS NULL`, index("unordered_idx"), table),
		// Unpublished keyed events by key: finds each key's head. It must cover dead-lettered
		// events too, or a dead-lettered head would let its successor through.
		fmt.Sprintf(`CREATE INDEX IF NOT EXISTS %s ON %s ("ordering_key", "sequence") WHERE "published_at" IS NULL AND "ordering_key" IS NOT NULL`, index("key_idx"), table),
		// At most one event per idempotency key (per scope, see SchemaConfig.IdempotencyScope).
		IdempotencyIndexSQL(t, table, DoubleQuote(t.IdempotencyIndexName()), false),
		fmt.Sprintf(`CREATE INDEX IF NOT EXISTS %s ON %s ("published_at") WHERE "published_at" IS NOT NULL`, index("published_idx"), table),
		fmt.Sprintf(`CREATE INDEX IF NOT EXISTS %s ON %s ("dead_lettered_at") WHERE "dead_lettered_at" IS NOT NULL`, index("dead_idx"), table),
		// No ("topic", "sequence") index: it held every event ever written and no bounded
		// read needs it. Claims filter topics on the pending indexes' rows (claim.sql keeps
		// the planner off a topic index on purpose); dead-letter operations by topic, prefix
		// or id read dead_idx (O(dead letters)); cleanup reads published_idx / dead_idx;
		// backlogs read the pending and key indexes (TestOperationPlans proves each). It
		// cost every write and every mark an index entry (WAL per keyed write, 8 writers:
		// scripts/walcost). Tables created with it keep it until dropped:
		// DROP INDEX CONCURRENTLY IF EXISTS "<table>_topic_idx" (see README).
	}
}

// ResolveConds returns the conditions of a ResolveScoped statement: match joins a stored event
// to its probe by the scope columns (val(c) is the probe's value of column c), and same tells
// whether an unscoped table's stored event agrees with every extra column the probe sets
// (agree(c) for column c; truth when there are none). A scoped table's events always agree:
// the scope is part of the match.
func ResolveConds(t *Table, quote func(string) string, val func(string) string, agree func(Column) string, truth string) (match, same string) {
	for _, c := range t.Scope {
		match += " AND o." + quote(c) + " = " + val(c)
	}
	same = truth
	if len(t.Scope) == 0 && len(t.Extra) > 0 {
		conds := make([]string, len(t.Extra))
		for i, col := range t.Extra {
			conds[i] = agree(col)
		}
		same = strings.Join(conds, " AND ")
	}
	return match, same
}

// DeadWhere renders f as a condition on dead-lettered, unpublished events for every dialect:
// deadAt and publishedAt are the quoted columns, topic renders one topic pattern, ids the "id
// is one of" test and older the "dead-lettered more than f.OlderThan ago" test (used when
// OlderThan > 0). No topics and no ids select nothing.
func DeadWhere(f DeadFilter, deadAt, publishedAt string, topic func(Topic) string, ids func([]string) string, older func() string) string {
	var conds []string
	for _, tp := range f.Topics {
		conds = append(conds, topic(tp))
	}
	if len(f.IDs) > 0 {
		conds = append(conds, ids(f.IDs))
	}
	if len(conds) == 0 {
		conds = []string{"1 = 0"}
	}
	w := deadAt + " IS NOT NULL AND " + publishedAt + " IS NULL AND (" + strings.Join(conds, " OR ") + ")"
	if f.OlderThan > 0 {
		w += " AND " + older()
	}
	return w
}
