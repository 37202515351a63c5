package mysqlurl

import (
	"context"
	"database/sql"
	"errors"
	"regexp"
	"slices"
	"strings"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/go-sql-driver/mysql"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/internal/dialect/dburl"
)

// DB is an open MariaDB/MySQL database.
type DB struct{ dburl.SQLDB }

// SchemaExists implements dburl.DB: whether database name exists on the server.
func (d *DB) SchemaExists(ctx context.Context, name string) (bool, error) {
	n, err := d.Int(ctx, "SELECT COUNT(*) FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = ?", name)
	return n > 0, err
}

// CreateSchema implements dburl.DB: a table is qualified by its database.
func (*DB) CreateSchema(name string) (word, stmt string) {
	return "database", "CREATE DATABASE " + Ident(name)
}

// SchemaGone implements dburl.DB: unknown database.
func (*DB) SchemaGone(err error) bool {
	var myErr *mysql.MySQLError
	return errors.As(err, &myErr) && myErr.Number == erBadDB
}

// Ident implements dburl.DB: backticks.
func (*DB) Ident(name string) string { return dburl.QuoteParts(name, "`") }

// Params implements dburl.DB: "?, ?, …" (go-sql-driver/mysql knows no numbered placeholders).
func (*DB) Params(n int) string { return strings.Repeat("?, ", n-1) + "?" }

// KeyType implements dburl.DB: MariaDB/MySQL cannot index TEXT without a prefix length, so
// VARCHAR(64).
func (*DB) KeyType() string { return "VARCHAR(64)" }

// OutboxTables implements dburl.DB: the table and its key-lock table "<table>_keys"
// (outbox.DialectMySQL), whose name is the table's own plus "_keys" for names of at most 40
// bytes; a longer name's companion is named after a hash and is not returned.
func (*DB) OutboxTables(table string) []string {
	if len(table) <= 40 {
		return []string{table, table + "_keys"}
	}
	return []string{table}
}

// MatchTables implements dburl.DB: "db.table" among the server's databases when the pattern
// holds a '.', else the table name among the current database's tables. It lists the outbox
// tables from information_schema and matches them here: information_schema compares names
// without regard to case, and LIKE's escape character depends on sql_mode
// (NO_BACKSLASH_ESCAPES), while table names on the server are case-sensitive
// (lower_case_table_names=0, the Linux default).
func (d *DB) MatchTables(ctx context.Context, pattern string) ([]string, error) {
	q := `SELECT t.TABLE_NAME FROM information_schema.TABLES t WHERE t.TABLE_SCHEMA = DATABASE()`
	if strings.Contains(pattern, ".") {
		q = `SELECT CONCAT(t.TABLE_SCHEMA, '.', t.TABLE_NAME) FROM information_schema.TABLES t
			WHERE t.TABLE_SCHEMA NOT IN ('mysql', 'information_schema', 'performance_schema', 'sys')`
	}
	q += ` AND t.TABLE_TYPE = 'BASE TABLE' AND EXISTS (SELECT 1 FROM information_schema.COLUMNS c
		WHERE c.TABLE_SCHEMA = t.TABLE_SCHEMA AND c.TABLE_NAME = t.TABLE_NAME AND c.COLUMN_NAME = 'leased_by')`
	names, err := d.Strings(ctx, q)
	if err != nil {
		return nil, err
	}
	glob := regexp.MustCompile("^" + strings.NewReplacer(`\*`, ".*", `\?`, ".").Replace(regexp.QuoteMeta(pattern)) + "$")
	var out []string
	for _, n := range names {
		if glob.MatchString(n) {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out, nil
}

// RelayWakeup implements dburl.DB: nothing (no LISTEN/NOTIFY, no probe); the relay polls.
func (*DB) RelayWakeup(cfg outbox.SubscriberConfig, logger watermill.LoggerAdapter) dburl.Wakeup {
	logger.Info("outbox relay polls every --poll-interval: MariaDB/MySQL has no LISTEN/NOTIFY to wake it (lower --poll-interval for lower latency)",
		watermill.LogFields{"poll-interval": cfg.PollInterval.String(), "wakeup": "none"})
	return nil
}

// Settle implements dburl.Bench: InnoDB has no CHECKPOINT statement (it flushes in the
// background); fresh statistics at least give both loops the same plans.
func (d *DB) Settle(ctx context.Context, table string) {
	_ = d.Exec(ctx, "ANALYZE TABLE "+d.Ident(table))
}

// RawIndex implements dburl.Bench: none (no partial indexes); RawRound forces the
// published_at index instead.
func (*DB) RawIndex(context.Context, string) error { return nil }

// RawRound implements dburl.Bench. MariaDB/MySQL have no UPDATE … RETURNING: one READ
// COMMITTED transaction locks the oldest 1,000 claimable rows (SELECT … FOR UPDATE SKIP
// LOCKED, reading them as a relay would) and leases them; the mark is a second statement, as
// in the other databases' loops. The mark also clears outbox_key, which the outbox table's
// CHECK constraint ties to published_at (see internal/dialect/mysql).
//
// FORCE INDEX on the published_at index: left to itself the optimizer walks the primary key
// from the start and rereads the drained history each round; through the index it reads the
// NULL entries only, which InnoDB keeps in primary-key order. A hand-written loop on this table
// would do the same. The index is named <table>_published_idx for table names of at most 40
// bytes, as the bench's are.
func (d *DB) RawRound(ctx context.Context, table string) (int, error) {
	t, idx := d.Ident(table), d.Ident(table+"_published_idx")
	tx, err := d.DB.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return 0, err
	}
	defer func() { _ = tx.Rollback() }()
	seqs, err := dburl.LeasedSQL(tx.QueryContext(ctx, "SELECT `sequence`, id, topic, payload, headers FROM "+t+" FORCE INDEX ("+idx+")"+
		" WHERE published_at IS NULL AND dead_lettered_at IS NULL AND (lease_until IS NULL OR lease_until < UTC_TIMESTAMP(6))"+
		" ORDER BY `sequence` LIMIT 1000 FOR UPDATE SKIP LOCKED"))
	if err != nil || len(seqs) == 0 {
		return 0, err
	}
	list := dburl.SeqList(seqs)
	if _, err := tx.ExecContext(ctx, "UPDATE "+t+" SET lease_until = UTC_TIMESTAMP(6) + INTERVAL 60 SECOND, leased_by = 'raw' WHERE `sequence` IN ("+list+")"); err != nil {
		return 0, err
	}
	if err := tx.Commit(); err != nil {
		return 0, err
	}
	_, err = d.DB.ExecContext(ctx, "UPDATE "+t+" SET published_at = UTC_TIMESTAMP(6), lease_until = NULL, leased_by = NULL, outbox_key = NULL WHERE `sequence` IN ("+list+")")
	return len(seqs), err
}

// RawEventsColumns implements dburl.Bench.
func (*DB) RawEventsColumns() string {
	return `(seq BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY, id CHAR(36) NOT NULL, topic VARCHAR(255) NOT NULL, payload JSON NOT NULL, created_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6))`
}

// HoldSnapshot implements dburl.Bench: a consistent-snapshot transaction (its read view stops
// InnoDB's purge of the row versions that leases and marks leave). A consistent snapshot
// needs REPEATABLE READ; SET TRANSACTION sets it for the next transaction only, so the pooled
// connection keeps its session's level.
func (d *DB) HoldSnapshot(ctx context.Context, table string) (func(), error) {
	return dburl.HoldSQLSnapshot(ctx, d.DB, table, d.Ident(table),
		`SET TRANSACTION ISOLATION LEVEL REPEATABLE READ`, `START TRANSACTION WITH CONSISTENT SNAPSHOT`)
}
