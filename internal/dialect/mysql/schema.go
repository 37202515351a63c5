package mysql

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/watermill-outbox/outbox/internal/dialect"
)

// Index name suffixes of the idempotency index: global (unique per table) and scoped (unique
// per Table.Scope). They differ so that a table moved from one to the other is recognised.
const (
	globalKeyIndex = "idempotency_key_idx"
	scopedKeyIndex = "idempotency_scope_idx"
)

// idempotencyIndex returns the unquoted name of t's idempotency index.
func idempotencyIndex(t *dialect.Table) string {
	if len(t.Scope) > 0 {
		return t.IndexBase + "_" + scopedKeyIndex
	}
	return t.IndexBase + "_" + globalKeyIndex
}

// idempotencyColumns returns the quoted columns of t's idempotency index: the scope columns,
// then idempotency_key.
func idempotencyColumns(t *dialect.Table) string {
	cols := make([]string, 0, len(t.Scope)+1)
	for _, c := range t.Scope {
		cols = append(cols, ident(c))
	}
	return strings.Join(append(cols, "`idempotency_key`"), ", ")
}

// The DDL of an outbox table. Why each index looks as it does: measured on MariaDB 10.11 (2
// cores) by TestIndexBounds, which asserts the bounds, as Handler_read_* rows per statement on
// 10,000 pending events over 1,000 keys, without and with 100,000 published events:
//
//   - MySQL has no partial indexes, and refuses a generated column that references an
//     AUTO_INCREMENT column, so "pending by sequence" is (flag, sequence) over a STORED
//     generated flag, outbox_pending: 1 for a pending keyed event, 0 for a pending unordered
//     one, NULL once published or dead-lettered. The claim's walk of the oldest pending keyed
//     events is `outbox_pending = 1 ORDER BY sequence LIMIT 100`, a ref scan starting at the
//     first live entry (the history sits under NULL, in front of it): 100 reads without and
//     with the history. The same walk on the table's own columns (published_at IS NULL AND
//     dead_lettered_at IS NULL AND ordering_key IS NOT NULL) read the primary key from the
//     start: 127 reads without the history, 100,125 with it.
//   - outbox_key is ordering_key while the event is unpublished (dead-lettered included, so a
//     dead-lettered head holds its key) and NULL once published; (outbox_key, sequence) finds
//     a key's head in one read and drives the key skip scan. It is a plain column, not a
//     generated one: MariaDB uses no loose index scan on a generated column (the skip scan
//     then read every event of the keys it passed), nor a range for a correlated
//     outbox_key > k. Insert fills it through its DEFAULT (ordering_key), the ack clears it,
//     and a CHECK constraint refuses any write that breaks outbox_key = IF(published_at IS
//     NULL, ordering_key, NULL) (publishing by hand must clear it too).
//     A whole claim of 100 events (walk window with its head checks, head locks, skip scan of
//     100 keys, runs, locks, unordered scan, lease): 1,995 reads without the history, 2,003
//     with it; its mark: 500 and 500.
//   - published_at and dead_lettered_at are indexed as they are: NULLs sort first, so Cleanup's
//     `published_at < cutoff ORDER BY published_at LIMIT 1000` reads 1,000 entries, and
//     `published_at IS NULL` (BacklogByTopic) reads the unpublished rows only. Backlog: 28,790
//     reads without the history, 28,794 with it (three passes over the pending rows).
//   - The idempotency index is UNIQUE (scope columns…, idempotency_key): NULL keys never
//     conflict, so no partial index is needed; it holds one (NULL) entry per keyless event.
//   - No (topic, sequence) index: no statement here needs one, and the claim names its
//     indexes (FORCE INDEX) so that a topic filter never steers the planner into the history.
//
// Text columns are utf8mb4 with a binary NO PAD collation (byte order, case-sensitive equality
// and trailing spaces significant, as on PostgreSQL): MariaDB's utf8mb4_nopad_bin, which
// Migrate swaps for MySQL 8's utf8mb4_0900_bin on a MySQL server. utf8mb4_bin would compare
// 'k' and 'k ' equal (PAD SPACE), so an idempotency key with a trailing space would be taken
// for another key's duplicate.
// Payloads are LONGTEXT checked with JSON_VALID rather than MySQL's JSON type, which would
// normalise them (key order, whitespace, duplicate keys): the bytes are kept as written.
// outbox_pending and outbox_key are INVISIBLE (SELECT * leaves them out; MySQL 8.0.23+).
func createTable(t *dialect.Table) string {
	n := namesOf(t)
	b := t.IndexBase
	payload := "`payload`          LONGTEXT CHARACTER SET utf8mb4 COLLATE " + textCollation + " NOT NULL"
	payloadCheck := fmt.Sprintf(",\n\tCONSTRAINT %s CHECK (JSON_VALID(`payload`))", ident(b+"_payload_chk"))
	if t.Payload == dialect.PayloadBytea {
		payload = "`payload`          LONGBLOB NOT NULL"
		payloadCheck = ""
	}
	var extra strings.Builder
	for _, c := range t.Extra {
		fmt.Fprintf(&extra, ",\n\t%s %s", ident(c.Name), c.Type)
	}
	return fmt.Sprintf("CREATE TABLE IF NOT EXISTS %[1]s (\n"+
		"\t`sequence`         BIGINT NOT NULL AUTO_INCREMENT,\n"+
		"\t`id`               CHAR(36) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,\n"+
		"\t`topic`            VARCHAR(255) NOT NULL,\n"+
		"\t%[2]s,\n"+
		"\t`headers`          LONGTEXT NOT NULL DEFAULT ('{}'),\n"+
		"\t`ordering_key`     VARCHAR(255) NULL,\n"+
		"\t`idempotency_key`  VARCHAR(255) NULL,\n"+
		"\t`created_at`       DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),\n"+
		"\t`attempts`         INT NOT NULL DEFAULT 0,\n"+
		"\t`last_error`       LONGTEXT NULL,\n"+
		"\t`next_attempt_at`  DATETIME(6) NULL,\n"+
		"\t`lease_until`      DATETIME(6) NULL,\n"+
		"\t`leased_by`        VARCHAR(1024) NULL,\n"+
		"\t`published_at`     DATETIME(6) NULL,\n"+
		"\t`dead_lettered_at` DATETIME(6) NULL,\n"+
		"\t`delivery_starts`  INT NOT NULL DEFAULT 0,\n"+
		"\t`last_error_class` VARCHAR(32) NULL%[3]s,\n"+
		"\t`outbox_pending`   TINYINT AS (CASE WHEN `published_at` IS NULL AND `dead_lettered_at` IS NULL THEN `ordering_key` IS NOT NULL END) STORED INVISIBLE,\n"+
		"\t`outbox_key`       VARCHAR(255) NULL DEFAULT (`ordering_key`) INVISIBLE,\n"+
		"\tPRIMARY KEY (`sequence`),\n"+
		"\tCONSTRAINT %[4]s UNIQUE (`id`),\n"+
		"\tCONSTRAINT %[5]s CHECK (`id` LIKE '________-____-____-____-____________'),\n"+
		"\tCONSTRAINT %[6]s CHECK (`topic` <> ''),\n"+
		"\tCONSTRAINT %[7]s CHECK (`ordering_key` <> ''),\n"+
		"\tCONSTRAINT %[8]s CHECK (JSON_VALID(`headers`))%[9]s,\n"+
		"\tCONSTRAINT %[16]s CHECK (`outbox_key` <=> IF(`published_at` IS NULL, `ordering_key`, NULL)),\n"+
		"\tINDEX %[10]s (`outbox_pending`, `sequence`),\n"+
		"\tINDEX %[11]s (`outbox_key`, `sequence`),\n"+
		"\tUNIQUE INDEX %[12]s (%[13]s),\n"+
		"\tINDEX %[14]s (`published_at`),\n"+
		"\tINDEX %[15]s (`dead_lettered_at`)\n"+
		") ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE="+textCollation,
		n.table, payload, extra.String(),
		ident(b+"_id_key"), ident(b+"_id_chk"), ident(b+"_topic_chk"), ident(b+"_okey_chk"), ident(b+"_headers_chk"), payloadCheck,
		n.pending, n.keyIdx, ident(idempotencyIndex(t)), idempotencyColumns(t),
		ident(b+"_published_idx"), ident(b+"_dead_idx"), ident(b+"_outbox_key_chk"))
}

// fillKeysSQL creates every key-lock row (see lockStripes) the table lacks: "i:00000" …
// "o:04095", the stripe numbers made by a cross join of four 8-row digit tables (no recursive
// CTE: MySQL stops one at cte_max_recursion_depth, 1,000 by default).
func fillKeysSQL(t *dialect.Table) string {
	digits := "(SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7)"
	var ns []string
	for _, n := range lockNamespaces {
		ns = append(ns, "SELECT '"+n+"' AS p")
	}
	return "INSERT INTO " + namesOf(t).keys + " (`ordering_key`) SELECT CONCAT(ns.p, ':', LPAD(a.d * 512 + b.d * 64 + c.d * 8 + e.d, 5, '0')) FROM (" +
		strings.Join(ns, " UNION ALL ") + ") ns, " + digits + " a, " + digits + " b, " + digits + " c, " + digits + " e" +
		" ON DUPLICATE KEY UPDATE `ordering_key` = `ordering_key`"
}

// keysFilled reports whether the key-lock table has every row (one COUNT).
func keysFilled(ctx context.Context, q querier, n names) (bool, error) {
	rs, err := q.query(ctx, "SELECT COUNT(*) FROM "+n.keys)
	if err != nil {
		return false, err
	}
	var have int64
	err = scanEach(rs, func(rs dialect.Rows) error { return rs.Scan(&have) })
	return have >= int64(len(lockNamespaces)*lockStripes), err
}

// checkVersion refuses servers older than MariaDB 10.6 or MySQL 8.0.23: the claim needs
// SKIP LOCKED (MariaDB 10.6, MySQL 8.0.1) and JSON_TABLE (MariaDB 10.6, MySQL 8.0.4), the
// schema INVISIBLE columns (MySQL 8.0.23) and a NO PAD binary collation.
func checkVersion(version string) error {
	var major, minor, patch int
	fmt.Sscanf(version, "%d.%d.%d", &major, &minor, &patch)
	mariadb := strings.Contains(strings.ToLower(version), "mariadb")
	ok := major > 10 || (major == 10 && minor >= 6)
	need := "MariaDB 10.6"
	if !mariadb {
		ok = major > 8 || (major == 8 && (minor > 0 || patch >= 23))
		need = "MySQL 8.0.23"
	}
	if !ok {
		return fmt.Errorf("%w: server version %q, need %s or later (FOR UPDATE SKIP LOCKED, JSON_TABLE, invisible columns)", ErrServerVersion, version, need)
	}
	return nil
}

// textCollation is the collation of the tables' text (see Statements); mysqlCollation replaces
// it on MySQL 8, which has no utf8mb4_nopad_bin.
const (
	textCollation  = "utf8mb4_nopad_bin"
	mysqlCollation = "utf8mb4_0900_bin"
)

// createKeys is the key-lock table: one row per stripe of ordering and idempotency keys (see
// lockStripes; Migrate fills it), X-locked by Insert
// until the writer's transaction ends (see Insert).
func createKeys(t *dialect.Table) string {
	return fmt.Sprintf("CREATE TABLE IF NOT EXISTS %s (\n\t`ordering_key` VARCHAR(255) NOT NULL,\n\tPRIMARY KEY (`ordering_key`)\n) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE="+textCollation,
		namesOf(t).keys)
}

// Statements returns the DDL: the outbox table (extra columns included) and its key-lock
// table <table>_keys (<IndexBase>_keys), each CREATE TABLE IF NOT EXISTS, and the INSERT that
// fills the key-lock table (idempotent; the last statement). Migrate also adds
// extra columns missing from an existing table and checks its idempotency index.
func (*Dialect) Statements(t *dialect.Table) []string {
	return []string{createTable(t), createKeys(t), fillKeysSQL(t)}
}

// migrateLockWait is how long Migrate waits for a concurrent Migrate of the same table when
// ctx has no deadline.
const migrateLockWait = 5 * time.Minute

// Migrate creates the tables, adds missing extra columns and the idempotency index, and checks
// that an existing idempotency index matches t.Scope (else a *dialect.ScopeMismatch). Concurrent
// Migrates of one table (any process) are serialised by GET_LOCK, held on one dedicated
// connection of ex's *sql.DB (or ex's *sql.Conn). DDL commits implicitly on MySQL, so a
// transaction handle is refused (ErrHandle).
func (d *Dialect) Migrate(ctx context.Context, ex dialect.Executor, t *dialect.Table) (err error) {
	if ex.InTx() {
		return fmt.Errorf("%w: Migrate runs DDL, which commits a MySQL transaction implicitly: pass a *sql.DB or *sql.Conn", ErrHandle)
	}
	var conn *sql.Conn
	switch h := ex.Handle().(type) {
	case *sql.DB:
		if conn, err = h.Conn(ctx); err != nil {
			return err
		}
		defer conn.Close()
	case *sql.Conn:
		conn = h
	default:
		return fmt.Errorf("%w: %T (want *sql.DB or *sql.Conn)", ErrHandle, h)
	}
	wait := migrateLockWait
	if dl, ok := ctx.Deadline(); ok {
		wait = max(time.Until(dl), time.Second)
	}
	lock := fmt.Sprintf("outbox_migrate_%016x", uint64(t.LockSeed))
	var got sql.NullInt64
	if err := conn.QueryRowContext(ctx, "SELECT GET_LOCK(?, ?)", lock, int64(wait/time.Second)).Scan(&got); err != nil {
		return fmt.Errorf("get lock %s: %w", lock, err)
	}
	if got.Int64 != 1 {
		return fmt.Errorf("get lock %s: not granted within %s (another Migrate holds it)", lock, wait)
	}
	defer func() {
		_, _ = conn.ExecContext(context.WithoutCancel(ctx), "DO RELEASE_LOCK(?)", lock)
	}()
	q := sqlQuerier(conn)
	stmts := d.Statements(t)
	var version string
	if err := conn.QueryRowContext(ctx, "SELECT VERSION()").Scan(&version); err != nil {
		return err
	}
	if err := checkVersion(version); err != nil {
		return err
	}
	if !strings.Contains(strings.ToLower(version), "mariadb") {
		for i := range stmts {
			stmts[i] = strings.ReplaceAll(stmts[i], textCollation, mysqlCollation)
		}
	}
	for i, st := range stmts {
		if i == len(stmts)-1 { // fillKeysSQL: 8,192 rows written again only when some lack
			if full, err := keysFilled(ctx, q, namesOf(t)); err != nil || full {
				if err != nil {
					return err
				}
				continue
			}
		}
		if _, err := q.exec(ctx, st); err != nil {
			return err
		}
	}
	n := namesOf(t)
	have, err := columnsOf(ctx, q, n.schema, n.name)
	if err != nil {
		return err
	}
	// delivery_starts (SubscriberConfig.MaxDeliveryStarts) and last_error_class are added to a
	// table that lacks them, as on the other dialects; an instant ADD COLUMN on InnoDB.
	relayCols := []dialect.Column{{Name: "delivery_starts", Type: "INT NOT NULL DEFAULT 0"}, {Name: "last_error_class", Type: "VARCHAR(32) NULL"}}
	for _, c := range append(relayCols, t.Extra...) {
		if have[strings.ToLower(c.Name)] {
			continue
		}
		if _, err := q.exec(ctx, fmt.Sprintf("ALTER TABLE %s ADD COLUMN %s %s", n.table, ident(c.Name), c.Type)); err != nil {
			return err
		}
	}
	global, err := indexColumns(ctx, q, n.schema, n.name, t.IndexBase+"_"+globalKeyIndex)
	if err != nil {
		return err
	}
	scoped, err := indexColumns(ctx, q, n.schema, n.name, t.IndexBase+"_"+scopedKeyIndex)
	if err != nil {
		return err
	}
	want := append(slices.Clone(t.Scope), "idempotency_key")
	switch {
	case len(t.Scope) > 0 && len(global) > 0:
		return &dialect.ScopeMismatch{Reason: dialect.ScopeMismatchReason(n.table, t, true, nil)}
	case len(scoped) > 0 && (len(t.Scope) == 0 || !slices.Equal(scoped, want)):
		return &dialect.ScopeMismatch{Reason: dialect.ScopeMismatchReason(n.table, t, false, scoped)}
	case len(global) == 0 && len(scoped) == 0:
		// Dropped by hand or half-way through a scope migration: build the wanted one.
		if _, err := q.exec(ctx, fmt.Sprintf("CREATE UNIQUE INDEX %s ON %s (%s)", ident(idempotencyIndex(t)), n.table, idempotencyColumns(t))); err != nil {
			return err
		}
	}
	return nil
}

// schemaCond is the information_schema condition for a table of schema ("" = the
// connection's database) and name.
const schemaCond = "TABLE_SCHEMA = COALESCE(NULLIF(?, ''), DATABASE()) AND TABLE_NAME = ?"

// columnsOf returns the lower-cased column names of a table.
func columnsOf(ctx context.Context, q querier, schema, name string) (map[string]bool, error) {
	rs, err := q.query(ctx, "SELECT COLUMN_NAME FROM information_schema.COLUMNS WHERE "+schemaCond, schema, name)
	if err != nil {
		return nil, err
	}
	defer rs.Close()
	have := map[string]bool{}
	for rs.Next() {
		var c string
		if err := rs.Scan(&c); err != nil {
			return nil, err
		}
		have[strings.ToLower(c)] = true
	}
	return have, rs.Err()
}

// indexColumns returns the columns of a table's index in index order (none when it does not
// exist).
func indexColumns(ctx context.Context, q querier, schema, name, index string) ([]string, error) {
	rs, err := q.query(ctx, "SELECT COLUMN_NAME FROM information_schema.STATISTICS WHERE "+schemaCond+" AND INDEX_NAME = ? ORDER BY SEQ_IN_INDEX", schema, name, index)
	if err != nil {
		return nil, err
	}
	return dialect.ScanList[string](rs)
}

// ScopeMigration returns the statements that move an existing table's idempotency index to
// t's scope, to run one by one, in order. Each ALTER TABLE leaves the algorithm and lock level
// to the server, which builds the index in place without blocking writers where it can; a
// unique index over a TEXT/BLOB scope column is a hash over a hidden virtual column in MariaDB,
// which only ALGORITHM=COPY can add (a forced INPLACE fails with error 1846), so that case
// copies the table and blocks writers meanwhile: give scope columns a VARCHAR type. With a scope: build the new index under a
// temporary name, drop the old scoped and the global index, rename the new one. Without: build
// the global index, drop the scoped one. The drops use DROP INDEX IF EXISTS, which MariaDB has
// and MySQL 8 has not: on MySQL leave out the drop of the index the table does not have.
func (*Dialect) ScopeMigration(t *dialect.Table) ([]string, error) {
	n := namesOf(t)
	add := func(name string) string {
		return fmt.Sprintf("ALTER TABLE %s ADD UNIQUE INDEX %s (%s)", n.table, ident(name), idempotencyColumns(t))
	}
	drop := func(name string) string {
		return fmt.Sprintf("ALTER TABLE %s DROP INDEX IF EXISTS %s", n.table, ident(name))
	}
	global, scoped := t.IndexBase+"_"+globalKeyIndex, t.IndexBase+"_"+scopedKeyIndex
	if len(t.Scope) == 0 {
		return []string{add(global), drop(scoped)}, nil
	}
	tmp := t.IndexBase + "_idempotency_new"
	return []string{
		add(tmp),
		drop(scoped),
		drop(global),
		fmt.Sprintf("ALTER TABLE %s RENAME INDEX %s TO %s", n.table, ident(tmp), ident(scoped)),
	}, nil
}

// Columns implements dialect.Dialect.
func (*Dialect) Columns(ctx context.Context, ex dialect.Executor, t *dialect.Table) (map[string]bool, error) {
	n := namesOf(t)
	return columnsOf(ctx, exQuerier{ex}, n.schema, n.name)
}

// TableExists reports whether t exists (information_schema.TABLES; the connection's database
// when t is not qualified).
func (*Dialect) TableExists(ctx context.Context, ex dialect.Executor, t *dialect.Table) (bool, error) {
	n := namesOf(t)
	rs, err := ex.Query(ctx, "SELECT COUNT(*) FROM information_schema.TABLES WHERE "+schemaCond, n.schema, n.name)
	if err != nil {
		return false, err
	}
	defer rs.Close()
	var c int64
	if rs.Next() {
		if err := rs.Scan(&c); err != nil {
			return false, err
		}
	}
	return c > 0, rs.Err()
}
