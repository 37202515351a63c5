// Package sqliteurl is SQLite behind a sqlite://PATH, sqlite:PATH or file:PATH URL, or a path
// ending in .db, .sqlite or .sqlite3 (package dburl): the file, its connection and messages,
// and the SQL of cmd/outbox's own tables. It registers itself on import, and links the
// outbox's SQLite dialect and the pure-Go driver modernc.org/sqlite.
package sqliteurl

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	_ "modernc.org/sqlite" // registers the pure-Go "sqlite" database/sql driver

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/internal/dialect"
	"github.com/watermill-outbox/outbox/internal/dialect/dburl"
	impl "github.com/watermill-outbox/outbox/internal/dialect/sqlite"
	_ "github.com/watermill-outbox/outbox/sqlite" // outbox.DialectSQLite
	"github.com/watermill-outbox/outbox/wakeup/sqlitewal"
)

func init() { dburl.Register(impl.Dialect{}.Name(), parser{}) }

type parser struct{}

// Parse implements dburl.Parser.
func (parser) Parse(s, forms string) (dburl.URL, bool, error) {
	lower := strings.ToLower(s)
	for _, prefix := range []string{"sqlite://", "sqlite:", "file:"} {
		if strings.HasPrefix(lower, prefix) {
			return parsed(New(s, s[len(prefix):], forms))
		}
	}
	if !strings.Contains(s, "://") && (strings.HasSuffix(lower, ".db") || strings.HasSuffix(lower, ".sqlite") || strings.HasSuffix(lower, ".sqlite3")) {
		return parsed(New(s, s, forms))
	}
	return nil, false, nil
}

// parsed is Parse's answer for a recognised URL: no URL (a nil interface) on error.
func parsed(u *URL, err error) (dburl.URL, bool, error) {
	if err != nil {
		return nil, true, err
	}
	return u, true, nil
}

// File returns the URL of the SQLite file at path, taken as it is.
func File(path string) *URL { return &URL{raw: path, path: path} }

// New returns the URL of the SQLite file at path (raw: the URL as given); a query string
// ("?mode=ro") is dropped because the outbox sets its own pragmas (outbox.SQLiteDSN). An
// in-memory database is refused: it is not shared between connections.
func New(raw, path, forms string) (*URL, error) {
	if i := strings.IndexByte(path, '?'); i >= 0 {
		path = path[:i]
	}
	if path == "" || path == ":memory:" || strings.HasPrefix(path, ":memory:") {
		return nil, fmt.Errorf("database URL %q names no SQLite file (an in-memory database is not shared between connections): use %s", raw, forms)
	}
	return &URL{raw: raw, path: path}, nil
}

// URL is an SQLite file.
type URL struct{ raw, path string }

// Dialect implements dburl.URL.
func (*URL) Dialect() outbox.Dialect { return outbox.DialectSQLite }

// SQL implements dburl.URL.
func (*URL) SQL() dialect.Dialect { return impl.Dialect{} }

// Raw implements dburl.URL.
func (u *URL) Raw() string { return u.raw }

// Shown implements dburl.URL: as given (a file has no password).
func (u *URL) Shown() string { return u.raw }

// HostPort implements dburl.URL: the file's path.
func (u *URL) HostPort() string { return u.path }

// File implements dburl.URL.
func (u *URL) File() string { return u.path }

// Where implements dburl.URL.
func (u *URL) Where() string { return fmt.Sprintf("SQLite file %q", u.path) }

// DropCommand implements dburl.URL: sqlite3, one DROP TABLE per table.
func (u *URL) DropCommand(tables []string) string {
	var b strings.Builder
	for i, t := range tables {
		if i > 0 {
			b.WriteString(" ")
		}
		b.WriteString("DROP TABLE " + t + ";")
	}
	return fmt.Sprintf("sqlite3 %s %s", dburl.ShellQuote(u.path), dburl.ShellQuote(b.String()))
}

// Open implements dburl.URL: a missing file is created only with o.Create.
func (u *URL) Open(ctx context.Context, o dburl.OpenOptions) (dburl.DB, error) {
	st, err := os.Stat(u.path)
	switch {
	case err == nil && st.IsDir():
		return nil, fmt.Errorf("SQLite path %q is a directory: give the database file, e.g. --db sqlite://%s", u.path, strings.TrimSuffix(u.path, "/")+"/outbox.db")
	case errors.Is(err, os.ErrNotExist) && !o.Create:
		return nil, fmt.Errorf("SQLite file %q does not exist, so it has no outbox table: create it with %s", u.path, o.MigrateHint)
	}
	db, err := sql.Open("sqlite", outbox.SQLiteDSN(u.path))
	if err == nil {
		err = db.PingContext(ctx)
		if err != nil {
			_ = db.Close()
		}
	}
	if err != nil {
		return nil, fmt.Errorf("cannot open SQLite file %q (%s): check that its directory exists and is writable", u.path, dburl.OneLine(err.Error()))
	}
	return &DB{SQLDB: dburl.SQLDB{DB: db}, path: u.path}, nil
}

// DB is an open SQLite file.
type DB struct {
	dburl.SQLDB
	path string
}

// SchemaExists implements dburl.DB: SQLite tables are not qualified.
func (*DB) SchemaExists(context.Context, string) (bool, error) { return true, nil }

// CreateSchema implements dburl.DB (not used: SQLite tables are not qualified).
func (*DB) CreateSchema(name string) (word, stmt string) { return "schema", "" }

// SchemaGone implements dburl.DB: never.
func (*DB) SchemaGone(error) bool { return false }

// Ident implements dburl.DB: double quotes.
func (*DB) Ident(name string) string { return dburl.QuoteParts(name, `"`) }

// Params implements dburl.DB: "$1, $2, …".
func (*DB) Params(n int) string {
	ps := make([]string, n)
	for i := range ps {
		ps[i] = fmt.Sprintf("$%d", i+1)
	}
	return strings.Join(ps, ", ")
}

// KeyType implements dburl.DB.
func (*DB) KeyType() string { return "TEXT" }

// OutboxTables implements dburl.DB: the table alone.
func (*DB) OutboxTables(table string) []string { return []string{table} }

// MatchTables implements dburl.DB: GLOB on the table names.
func (d *DB) MatchTables(ctx context.Context, pattern string) ([]string, error) {
	return d.Strings(ctx, `SELECT m."name" FROM sqlite_master m WHERE m."type" = 'table' AND m."name" GLOB $1
			AND EXISTS (SELECT 1 FROM pragma_table_info(m."name") p WHERE p."name" = 'leased_by') ORDER BY 1`, pattern)
}

// RelayWakeup implements dburl.DB: the relay watches the file's write-ahead log
// (wakeup/sqlitewal), since the writers run in other processes.
func (d *DB) RelayWakeup(cfg outbox.SubscriberConfig, logger watermill.LoggerAdapter) dburl.Wakeup {
	fields := watermill.LogFields{"poll-interval": cfg.PollInterval.String()}
	w, err := sqlitewal.New(d.path, logger)
	if err != nil {
		fields["err"] = err
		logger.Info("SQLite wakeup unavailable, the relay polls every --poll-interval", fields)
		return nil
	}
	fields["wakeup"] = "sqlite-wal"
	logger.Info("outbox relay wakes on each commit to the SQLite file, and polls every --poll-interval", fields)
	return w
}

// Settle implements dburl.Bench: a checkpoint that empties the write-ahead log.
func (d *DB) Settle(ctx context.Context, _ string) {
	_ = d.Exec(ctx, `PRAGMA wal_checkpoint(TRUNCATE)`)
}

// RawIndex implements dburl.Bench: the pending rows by sequence (see the PostgreSQL one's).
func (d *DB) RawIndex(ctx context.Context, table string) error {
	return d.Exec(ctx, `CREATE INDEX `+d.Ident(table+"_raw_pending_idx")+` ON `+d.Ident(table)+
		` ("sequence") WHERE "published_at" IS NULL AND "dead_lettered_at" IS NULL`)
}

// RawRound implements dburl.Bench: UPDATE … RETURNING, then the mark.
func (d *DB) RawRound(ctx context.Context, table string) (int, error) {
	t := d.Ident(table)
	now := time.Now().UnixMicro()
	seqs, err := dburl.LeasedSQL(d.DB.QueryContext(ctx, `UPDATE `+t+` SET lease_until = $1, leased_by = 'raw' WHERE sequence IN (
		SELECT sequence FROM `+t+` WHERE published_at IS NULL AND dead_lettered_at IS NULL AND (lease_until IS NULL OR lease_until < $2)
		ORDER BY sequence LIMIT 1000) RETURNING sequence, id, topic, payload, headers`, now+60e6, now))
	if err != nil || len(seqs) == 0 {
		return 0, err
	}
	_, err = d.DB.ExecContext(ctx, `UPDATE `+t+` SET published_at = $1, lease_until = NULL, leased_by = NULL WHERE sequence IN (SELECT value FROM json_each($2))`,
		time.Now().UnixMicro(), "["+dburl.SeqList(seqs)+"]")
	return len(seqs), err
}

// RawEventsColumns implements dburl.Bench.
func (*DB) RawEventsColumns() string {
	return `(seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL, topic TEXT NOT NULL, payload TEXT NOT NULL, created_at INTEGER NOT NULL DEFAULT (CAST(unixepoch('subsec') * 1000000 AS INTEGER)))`
}

// HoldSnapshot implements dburl.Bench: a read transaction (it stops checkpoints from
// resetting the log).
func (d *DB) HoldSnapshot(ctx context.Context, table string) (func(), error) {
	return dburl.HoldSQLSnapshot(ctx, d.DB, table, d.Ident(table), `BEGIN DEFERRED`)
}
