package outbox

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// This file holds the SQL text of DialectSQLite. The logic around it — validation, run
// selection, delivery, fencing, backoff, hooks — is shared with PostgreSQL. SQLite has one
// writer at a time, so a claim (one UPDATE … RETURNING statement) needs no SKIP LOCKED, and
// times are INTEGER microseconds since the Unix epoch from the writer's or relay's clock.

// micros returns t as microseconds since the Unix epoch, the SQLite dialect's time value.
func micros(t time.Time) int64 { return t.UnixMicro() }

// microTime scans a time column of either dialect: a time.Time (PostgreSQL) or INTEGER
// microseconds since the Unix epoch (SQLite), into UTC. NULL leaves the zero time.
type microTime time.Time

// Scan implements sql.Scanner.
func (m *microTime) Scan(src any) error {
	switch v := src.(type) {
	case nil:
		*m = microTime{}
	case int64:
		*m = microTime(time.UnixMicro(v).UTC())
	case float64:
		*m = microTime(time.UnixMicro(int64(v)).UTC())
	case time.Time:
		*m = microTime(v)
	case []byte:
		n, err := strconv.ParseInt(string(v), 10, 64)
		if err != nil {
			return fmt.Errorf("outbox: time column: %q is not microseconds", v)
		}
		*m = microTime(time.UnixMicro(n).UTC())
	case string:
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return fmt.Errorf("outbox: time column: %q is not microseconds", v)
		}
		*m = microTime(time.UnixMicro(n).UTC())
	default:
		return fmt.Errorf("outbox: time column: unsupported type %T", src)
	}
	return nil
}

// timeDest returns the scan destination of a time column into t for the schema's dialect.
func (s *schema) timeDest(t *time.Time) any {
	if s.sqlite {
		return (*microTime)(t)
	}
	return t
}

// jsonList encodes vals as a JSON array, the SQLite dialect's array parameter (read with
// json_each).
func jsonList[T any](vals []T) string {
	b, _ := json.Marshal(vals)
	return string(b)
}

// param appends v to args and returns its placeholder ($n, understood by both dialects'
// drivers).
func param(args *[]any, v any) string {
	*args = append(*args, v)
	return "$" + strconv.Itoa(len(*args))
}

// nowSQL returns the current time: now() on PostgreSQL (database clock), a parameter holding
// the caller's clock on SQLite.
func (s *schema) nowSQL(args *[]any) string {
	if s.sqlite {
		return param(args, micros(time.Now()))
	}
	return "now()"
}

// agoSQL returns the time d before now in the dialect's terms.
func (s *schema) agoSQL(d time.Duration, args *[]any) string {
	if s.sqlite {
		return param(args, micros(time.Now().Add(-d)))
	}
	return "now() - " + param(args, d.Microseconds()) + " * interval '1 microsecond'"
}

// inSQL returns "col is one of vals": = ANY($n::typ[]) on PostgreSQL, IN json_each($n) on
// SQLite. typ is the PostgreSQL element type.
func inSQL[T any](s *schema, col string, vals []T, typ string, args *[]any) string {
	if s.sqlite {
		return col + " IN (SELECT value FROM json_each(" + param(args, jsonList(vals)) + "))"
	}
	return col + " = ANY(" + param(args, vals) + "::" + typ + "[])"
}

// textSQL casts a column to text where PostgreSQL stores another type (uuid, jsonb).
func (s *schema) textSQL(col string) string {
	if s.sqlite {
		return col
	}
	return col + "::text"
}

// sqliteStatements returns the SQLite DDL: the table (extra columns included) and the same
// partial indexes as on PostgreSQL.
func (s *schema) sqliteStatements() []string {
	t := s.table
	payload := `"payload"          TEXT NOT NULL CHECK (json_valid("payload"))`
	if s.cfg.PayloadType == PayloadBytea {
		payload = `"payload"          BLOB NOT NULL`
	}
	var extra strings.Builder
	for _, col := range s.cfg.ExtraColumns {
		fmt.Fprintf(&extra, ",\n\t%s %s", pgx.Identifier{col.Name}.Sanitize(), col.Type)
	}
	stmts := []string{fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
	"sequence"         INTEGER PRIMARY KEY AUTOINCREMENT,
	"id"               TEXT NOT NULL UNIQUE,
	"topic"            TEXT NOT NULL CHECK ("topic" <> ''),
	%s,
	"headers"          TEXT NOT NULL DEFAULT '{}' CHECK (json_valid("headers")),
	"ordering_key"     TEXT NULL CHECK ("ordering_key" <> ''),
	"idempotency_key"  TEXT NULL,
	"created_at"       INTEGER NOT NULL DEFAULT (CAST(unixepoch('subsec') * 1000000 AS INTEGER)),
	"attempts"         INTEGER NOT NULL DEFAULT 0,
	"last_error"       TEXT NULL,
	"next_attempt_at"  INTEGER NULL,
	"lease_until"      INTEGER NULL,
	"leased_by"        TEXT NULL,
	"published_at"     INTEGER NULL,
	"dead_lettered_at" INTEGER NULL,
	"delivery_starts"  INTEGER NOT NULL DEFAULT 0%s
)`, t, payload, extra.String())}
	return append(stmts, s.indexStatements()...)
}

// indexStatements returns the relay's indexes (identical text in both dialects).
func (s *schema) indexStatements() []string {
	t := s.table
	return []string{
		// Pending events by sequence, in two partial indexes: keyed ones (the relay's walk of
		// the oldest claimable keyed events) and unordered ones (the relay's unordered scan).
		fmt.Sprintf(`CREATE INDEX IF NOT EXISTS %s ON %s ("sequence") WHERE "published_at" IS NULL AND "dead_lettered_at" IS NULL AND "ordering_key" IS NOT NULL`, s.index("keyed_idx"), t),
		fmt.Sprintf(`CREATE INDEX IF NOT EXISTS %s ON %s ("sequence") WHERE "published_at" IS NULL AND "dead_lettered_at" IS NULL AND "ordering_key" IS NULL`, s.index("unordered_idx"), t),
		// Unpublished keyed events by key: finds each key's head. It must cover dead-lettered
		// events too, or a dead-lettered head would let its successor through.
		fmt.Sprintf(`CREATE INDEX IF NOT EXISTS %s ON %s ("ordering_key", "sequence") WHERE "published_at" IS NULL AND "ordering_key" IS NOT NULL`, s.index("key_idx"), t),
		// At most one event per idempotency key (per scope, see SchemaConfig.IdempotencyScope).
		s.idempotencyIndexSQL(false),
		fmt.Sprintf(`CREATE INDEX IF NOT EXISTS %s ON %s ("published_at") WHERE "published_at" IS NOT NULL`, s.index("published_idx"), t),
		fmt.Sprintf(`CREATE INDEX IF NOT EXISTS %s ON %s ("dead_lettered_at") WHERE "dead_lettered_at" IS NOT NULL`, s.index("dead_idx"), t),
		fmt.Sprintf(`CREATE INDEX IF NOT EXISTS %s ON %s ("topic", "sequence")`, s.index("topic_idx"), t),
	}
}

// withSQLiteTx runs fn in a transaction: the caller's when ex is one, else a new one on the
// *sql.DB (IMMEDIATE with SQLiteDSN), committed when fn returns nil.
func withSQLiteTx(ctx context.Context, ex execer, fn func(ex execer) error) error {
	if ex.inTx() {
		return fn(ex)
	}
	se, ok := ex.(sqlExecer)
	if !ok {
		return fn(ex)
	}
	db, ok := se.d.(interface {
		BeginTx(context.Context, *sql.TxOptions) (*sql.Tx, error)
	})
	if !ok {
		return fn(ex)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := fn(sqlExecer{d: tx, tx: true}); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}

// sqliteMigrate creates the table and indexes and adds extra columns missing from an existing
// table, in one transaction.
func (s *schema) sqliteMigrate(ctx context.Context, ex execer) error {
	stmts := s.statements()
	err := withSQLiteTx(ctx, ex, func(ex execer) error {
		if _, err := ex.exec(ctx, stmts[0]); err != nil {
			return err
		}
		have := map[string]bool{}
		rs, err := ex.query(ctx, `SELECT "name" FROM pragma_table_info($1)`, s.tableName)
		if err != nil {
			return err
		}
		for rs.Next() {
			var name string
			if err := rs.Scan(&name); err != nil {
				rs.Close()
				return err
			}
			have[strings.ToLower(name)] = true
		}
		rs.Close()
		if err := rs.Err(); err != nil {
			return err
		}
		// A table created before delivery_starts existed gets it (SQLite adds a column with a
		// constant default without rewriting the table).
		if !have["delivery_starts"] {
			if _, err := ex.exec(ctx, fmt.Sprintf(`ALTER TABLE %s ADD COLUMN "delivery_starts" INTEGER NOT NULL DEFAULT 0`, s.table)); err != nil {
				return err
			}
		}
		for _, col := range s.cfg.ExtraColumns {
			if have[strings.ToLower(col.Name)] {
				continue
			}
			if _, err := ex.exec(ctx, fmt.Sprintf(`ALTER TABLE %s ADD COLUMN %s %s`, s.table, pgx.Identifier{col.Name}.Sanitize(), col.Type)); err != nil {
				return err
			}
		}
		if err := s.sqliteScopeCheck(ctx, ex); err != nil {
			return err
		}
		for _, st := range stmts[1:] {
			if _, err := ex.exec(ctx, st); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("outbox: migrate %s: %w", s.table, err)
	}
	return nil
}

// sqliteMaxRowsPerInsert keeps one INSERT below SQLite's default limit of 32766 parameters.
const sqliteMaxRowsPerInsert = 500

// sqliteInsert writes rows with multi-row INSERT … ON CONFLICT DO NOTHING RETURNING statements
// (in one transaction when the handle is not one) and calls add for every inserted event.
// Events whose idempotency key already existed are not returned; the caller reads them.
func (p *Publisher) sqliteInsert(ctx context.Context, rows []row, extraNames []string, add func(Event)) error {
	now := micros(time.Now())
	run := func(ex execer) error {
		for start := 0; start < len(rows); start += sqliteMaxRowsPerInsert {
			chunk := rows[start:min(start+sqliteMaxRowsPerInsert, len(rows))]
			var b strings.Builder
			fmt.Fprintf(&b, `INSERT INTO %s ("id", "topic", "payload", "headers", "ordering_key", "idempotency_key", "created_at"`, p.s.table)
			for _, c := range extraNames {
				b.WriteString(", " + pgx.Identifier{c}.Sanitize())
			}
			b.WriteString(") VALUES ")
			args := make([]any, 0, len(chunk)*(7+len(extraNames)))
			for i, r := range chunk {
				if i > 0 {
					b.WriteString(", ")
				}
				var payload any = r.payload
				if p.s.cfg.PayloadType.isJSON() {
					payload = string(r.payload) // TEXT: json_valid reads a BLOB as JSONB
				}
				b.WriteString("(" + param(&args, r.id.String()) + ", " + param(&args, r.topic) + ", " + param(&args, payload) + ", " +
					param(&args, string(r.headers)) + ", " + param(&args, r.okey) + ", " + param(&args, r.ikey) + ", " + param(&args, now))
				if len(extraNames) > 0 {
					// The same JSON encoding as PostgreSQL's jsonb_populate_record reads: each
					// column takes its value's SQL form (objects and arrays as JSON text).
					var extra any
					if len(r.extra) > 0 {
						enc, _ := EncodePayload(r.extra) // validated by the caller
						extra = string(enc)
					}
					ph := param(&args, extra)
					for _, c := range extraNames {
						fmt.Fprintf(&b, `, %s ->> '$."%s"'`, ph, c)
					}
				}
				b.WriteString(")")
			}
			b.WriteString(` ON CONFLICT (` + p.s.idempotencyColumns() + `) WHERE "idempotency_key" IS NOT NULL DO NOTHING RETURNING "sequence", "id", "topic", "ordering_key", "idempotency_key", "created_at"`)
			rs, err := ex.query(ctx, b.String(), args...)
			if err != nil {
				return err
			}
			for rs.Next() {
				ev, err := p.scanStored(rs)
				if err != nil {
					rs.Close()
					return err
				}
				add(ev)
			}
			rs.Close()
			if err := rs.Err(); err != nil {
				return err
			}
		}
		return nil
	}
	switch {
	case len(rows) <= sqliteMaxRowsPerInsert:
		return run(p.ex)
	case !p.ex.inTx():
		return withSQLiteTx(ctx, p.ex, run)
	}
	// Several statements in the caller's transaction: a failed one does not abort a SQLite
	// transaction, so the chunks before it are undone here, or a caller committing after the
	// error would commit part of the events.
	if _, err := p.ex.exec(ctx, "SAVEPOINT outbox_insert"); err != nil {
		return err
	}
	if err := run(p.ex); err != nil {
		if _, rbErr := p.ex.exec(context.WithoutCancel(ctx), "ROLLBACK TO SAVEPOINT outbox_insert"); rbErr != nil {
			return errors.Join(err, fmt.Errorf("rollback to savepoint: %w", rbErr))
		}
		_, _ = p.ex.exec(context.WithoutCancel(ctx), "RELEASE SAVEPOINT outbox_insert")
		return err
	}
	_, err := p.ex.exec(ctx, "RELEASE SAVEPOINT outbox_insert")
	return err
}

// scanStored reads one (sequence, id, topic, ordering_key, idempotency_key, created_at) row.
func (p *Publisher) scanStored(rs rows) (Event, error) {
	var (
		ev       Event
		id       string
		okey, ik *string
	)
	if err := rs.Scan(&ev.Sequence, &id, &ev.Topic, &okey, &ik, p.s.timeDest(&ev.CreatedAt)); err != nil {
		return ev, err
	}
	ev.ID, _ = uuid.Parse(id)
	if okey != nil {
		ev.OrderingKey = *okey
	}
	if ik != nil {
		ev.IdempotencyKey = *ik
	}
	return ev, nil
}

// buildSQLiteClaimSQL is the selecting half of the SQLite claim; sqliteClaim leases what it
// selects in the same (IMMEDIATE) transaction. Its parameters are $1 the relay's clock
// (microseconds), $2 the key cursor, $3 unused, then the topic filter's. It mirrors the
// PostgreSQL claim without SKIP LOCKED (SQLite's single writer): candidate keys are those of
// the oldest claimable keyed events plus a bounded skip scan of the key index after the cursor
// (so keys behind blocked ones are reached within a few polls); each key's head is claimable
// (not dead-lettered, due, not leased) or the key is skipped; up to MaxRunPerKey events of each
// key are read from its head, BatchSize in all, and only the gap-free claimable start of each
// run is kept. Unordered events come from their own partial index (INDEXED BY: the planner
// would otherwise pick the topic index and read every event of the topic). The last row
// carries the skip scan's last key and how many keys it saw. The relay ranks each key's events
// in Go (1 for the head). CROSS JOIN fixes the join order (SQLite's planner hint): each head
// drives primary-key lookups, never a scan of the topic index per head.
func (s *Subscriber) buildSQLiteClaimSQL(filter string, batch int) string {
	t := s.s.table
	claimable := fmt.Sprintf(`o."dead_lettered_at" IS NULL AND (o."next_attempt_at" IS NULL OR o."next_attempt_at" <= $1) AND (o."lease_until" IS NULL OR o."lease_until" < $1) AND %s`,
		strings.ReplaceAll(filter, `"topic"`, `o."topic"`))
	unpublishedKeyed := `"published_at" IS NULL AND "ordering_key" IS NOT NULL`
	return fmt.Sprintf(`WITH RECURSIVE skip(k) AS (
	SELECT (SELECT min("ordering_key") FROM %[1]s WHERE %[2]s AND "ordering_key" > $2)
	UNION ALL
	SELECT (SELECT min("ordering_key") FROM %[1]s WHERE %[2]s AND "ordering_key" > skip.k) FROM skip WHERE skip.k IS NOT NULL
	LIMIT %[6]d
), scanned AS MATERIALIZED (
	SELECT k FROM skip WHERE k IS NOT NULL
), oldest AS MATERIALIZED (
	SELECT DISTINCT "ordering_key" AS k FROM (SELECT o."ordering_key" FROM %[1]s o INDEXED BY %[7]s
		WHERE o."published_at" IS NULL AND o."ordering_key" IS NOT NULL AND %[3]s ORDER BY o."sequence" LIMIT %[4]d)
), heads AS MATERIALIZED (
	SELECT c.k, (SELECT min("sequence") FROM %[1]s WHERE %[2]s AND "ordering_key" = c.k) AS seq
	FROM (SELECT k FROM oldest UNION SELECT k FROM scanned) c
), ok_heads AS MATERIALIZED (
	SELECT h.k, h.seq FROM heads h CROSS JOIN %[1]s o ON o."sequence" = h.seq WHERE %[3]s ORDER BY h.seq LIMIT %[4]d
), cand AS MATERIALIZED (
	SELECT o."sequence", o."ordering_key", CASE WHEN %[3]s THEN 0 ELSE 1 END AS bad
	FROM ok_heads h CROSS JOIN %[1]s o ON o."sequence" IN (
		SELECT x."sequence" FROM %[1]s x WHERE x."published_at" IS NULL AND x."ordering_key" IS NOT NULL AND x."ordering_key" = h.k ORDER BY x."sequence" LIMIT %[5]d)
	LIMIT %[4]d
), picked AS MATERIALIZED (
	SELECT "sequence" FROM (SELECT "sequence", sum(bad) OVER (PARTITION BY "ordering_key" ORDER BY "sequence") AS bad FROM cand) WHERE bad = 0
	UNION ALL
	SELECT "sequence" FROM (SELECT o."sequence" FROM %[1]s o INDEXED BY %[8]s WHERE o."published_at" IS NULL AND o."ordering_key" IS NULL AND %[3]s ORDER BY o."sequence" LIMIT %[4]d)
	ORDER BY 1 LIMIT %[4]d
)
SELECT "sequence", NULL, NULL FROM picked
UNION ALL
SELECT NULL, (SELECT max(k) FROM scanned), (SELECT count(*) FROM scanned)`,
		t, unpublishedKeyed, claimable, batch, min(s.cfg.MaxRunPerKey, batch), s.cfg.KeyScan, s.s.index("keyed_idx"), s.s.index("unordered_idx"))
}

// buildSQLiteLeaseSQL is the leasing half of the SQLite claim: $1 the lease end
// (microseconds), $2 the fencing token, $3 the selected sequences (a JSON array); it returns
// the rows in the layout scanClaimed reads.
func (s *Subscriber) buildSQLiteLeaseSQL() string {
	var extra strings.Builder
	for _, c := range s.s.cfg.ExtraColumns {
		extra.WriteString(", " + pgx.Identifier{c.Name}.Sanitize())
	}
	return fmt.Sprintf(`UPDATE %s SET "lease_until" = $1, "leased_by" = $2, "delivery_starts" = "delivery_starts" + 1 WHERE "sequence" IN (SELECT value FROM json_each($3))
RETURNING 0, "sequence", "id", "topic", "payload", "headers", "ordering_key", "created_at", "attempts", "last_error", NULL, "delivery_starts"%s, NULL, NULL, NULL`, s.s.table, extra.String())
}

// sqliteClaim runs the SQLite claim: the selection (buildSQLiteClaimSQL) and an UPDATE …
// RETURNING that leases it, in one IMMEDIATE transaction so no other writer comes between.
func (sub *subscription) sqliteClaim(token, q string, paused []string) (items []*item, cursor *string, scanned *int64, err error) {
	s := sub.s
	// Eager locking for the first claim after a wakeup only (and that batch's marks): a relay
	// draining a backlog claims back to back and takes its turn like the writers.
	eager := sub.woken.Swap(false)
	sub.eagerMarks.Store(eager)
	err = withSQLiteRelayTx(sub.ctx, s.db, eager, func(ex execer) error {
		// The clock is read once the write lock is held: BEGIN IMMEDIATE may wait up to the
		// busy timeout, and a lease computed before that wait could already have expired.
		now := time.Now()
		rs, err := ex.query(sub.ctx, q, append([]any{micros(now), sub.cursor, jsonList(paused)}, sub.args...)...)
		if err != nil {
			return err
		}
		var seqs []int64
		for rs.Next() {
			var (
				seq, sc *int64
				c       *string
			)
			if err := rs.Scan(&seq, &c, &sc); err != nil {
				rs.Close()
				return err
			}
			if seq != nil {
				seqs = append(seqs, *seq)
			} else {
				cursor, scanned = c, sc
			}
		}
		rs.Close()
		if err := rs.Err(); err != nil || len(seqs) == 0 {
			return err
		}
		rs, err = ex.query(sub.ctx, sub.leaseSQL, micros(now.Add(s.cfg.LeaseDuration)), token, jsonList(seqs))
		if err != nil {
			return err
		}
		items, _, _, err = sub.scanClaimed(rs)
		return err
	})
	return items, cursor, scanned, err
}

// sqliteMark writes a batch's outcome in one transaction of fenced UPDATEs (the same
// rules as PostgreSQL's mark statement, with the relay's clock).
func (sub *subscription) sqliteMark(ctx context.Context, token string, m markSets) ([]markResult, error) {
	s := sub.s
	acked, released, failed, errs, jitters := m.acked, m.released, m.failed, m.errs, m.jitters
	var out []markResult
	err := withSQLiteRelayTx(ctx, s.db, sub.eagerMarks.Load(), func(ex execer) error {
		now := time.Now() // once the write lock is held (see sqliteClaim)
		nowUS := micros(now)
		collect := func(q string, args ...any) error {
			rs, err := ex.query(ctx, q, args...)
			if err != nil {
				return err
			}
			defer rs.Close()
			for rs.Next() {
				var (
					r          markResult
					next, dead *int64
				)
				if err := rs.Scan(&r.seq, &r.attempts, &next, &dead); err != nil {
					return err
				}
				if next != nil {
					t := time.UnixMicro(*next).UTC()
					r.next = &t
				}
				r.dead, r.now = dead != nil, now
				out = append(out, r)
			}
			return rs.Err()
		}
		fence := `"leased_by" = $2 AND "published_at" IS NULL`
		if len(acked) > 0 {
			if err := collect(fmt.Sprintf(`UPDATE %s SET "published_at" = $3, "lease_until" = NULL, "leased_by" = NULL, "delivery_starts" = 0 WHERE "sequence" IN (SELECT value FROM json_each($1)) AND %s RETURNING "sequence", "attempts", NULL, NULL`,
				s.s.table, fence), jsonList(acked), token, nowUS); err != nil {
				return err
			}
		}
		if len(released) > 0 {
			if err := collect(fmt.Sprintf(`UPDATE %s SET "lease_until" = NULL, "leased_by" = NULL, "delivery_starts" = 0 WHERE "sequence" IN (SELECT value FROM json_each($1)) AND %s RETURNING "sequence", "attempts", NULL, NULL`,
				s.s.table, fence), jsonList(released), token); err != nil {
				return err
			}
		}
		if len(m.unavailable) > 0 {
			type u struct {
				Seq  int64  `json:"s"`
				Note string `json:"e"`
				Keep bool   `json:"k"`
			}
			us := make([]u, len(m.unavailable))
			for i := range m.unavailable {
				us[i] = u{m.unavailable[i], m.notes[i], m.keep[i]}
			}
			q := fmt.Sprintf(`UPDATE %[1]s AS o SET "last_error" = f.e, "lease_until" = NULL, "leased_by" = NULL,
	"delivery_starts" = CASE WHEN f.k THEN o."delivery_starts" ELSE 0 END
FROM (SELECT value ->> '$.s' AS s, value ->> '$.e' AS e, value ->> '$.k' AS k FROM json_each($1)) AS f
WHERE o."sequence" = f.s AND o.%[2]s
RETURNING "sequence", "attempts", NULL, NULL`, s.s.table, strings.ReplaceAll(fence, `AND "`, `AND o."`))
			if err := collect(q, jsonList(us), token); err != nil {
				return err
			}
		}
		if len(failed) > 0 {
			type f struct {
				Seq    int64   `json:"s"`
				Err    string  `json:"e"`
				Jitter float64 `json:"j"`
				Perm   bool    `json:"p"`
			}
			fs := make([]f, len(failed))
			for i := range failed {
				fs[i] = f{failed[i], errs[i], jitters[i], m.perm[i]}
			}
			q := fmt.Sprintf(`UPDATE %[1]s AS o SET "attempts" = o."attempts" + 1, "last_error" = f.e,
	"dead_lettered_at" = CASE WHEN o."attempts" + 1 >= %[2]d OR f.p THEN $3 END,
	"next_attempt_at" = CASE WHEN o."attempts" + 1 < %[2]d AND NOT f.p THEN $3 + CAST(min(%[3]d * power(2.0, min(o."attempts", 62)), %[4]d.0) * f.j AS INTEGER) END,
	"lease_until" = NULL, "leased_by" = NULL, "delivery_starts" = 0
FROM (SELECT value ->> '$.s' AS s, value ->> '$.e' AS e, value ->> '$.j' AS j, value ->> '$.p' AS p FROM json_each($1)) AS f
WHERE o."sequence" = f.s AND o.%[5]s
RETURNING "sequence", "attempts", "next_attempt_at", "dead_lettered_at"`,
				s.s.table, s.cfg.MaxAttempts, s.cfg.RetryBase.Microseconds(), s.cfg.RetryMax.Microseconds(), strings.ReplaceAll(fence, `AND "`, `AND o."`))
			if err := collect(q, jsonList(fs), token, nowUS); err != nil {
				return err
			}
		}
		if len(m.abandoned) > 0 {
			// Unanswered at a stop: released, and the start does not count (see
			// SubscriberConfig.MaxDeliveryStarts).
			if _, err := ex.exec(ctx, fmt.Sprintf(`UPDATE %s SET "delivery_starts" = max("delivery_starts" - 1, 0), "lease_until" = NULL, "leased_by" = NULL WHERE "sequence" IN (SELECT value FROM json_each($1)) AND %s`,
				s.s.table, fence), jsonList(m.abandoned), token); err != nil {
				return err
			}
		}
		return nil
	})
	return out, err
}

// errNoSQLiteNotify is the reason a SQLite publisher refuses NotifyChannel.
var errNoSQLiteNotify = errors.New("SQLite has no LISTEN/NOTIFY: use an in-process wakeup (OnInserted) instead")
