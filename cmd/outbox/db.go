package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "modernc.org/sqlite" // registers the pure-Go "sqlite" database/sql driver

	"github.com/watermill-outbox/outbox"
	_ "github.com/watermill-outbox/outbox/mysql"  // outbox.DialectMySQL
	_ "github.com/watermill-outbox/outbox/sqlite" // outbox.DialectSQLite
)

// dbForms lists the accepted --db forms, for error messages.
const dbForms = "postgres://user:password@host:5432/dbname (or postgresql://…) for PostgreSQL; " +
	mysqlForm + "; " +
	"sqlite://PATH, sqlite:PATH, file:PATH or a path ending in .db, .sqlite or .sqlite3 for SQLite"

// dbFlagForms lists the accepted --db forms briefly, for the flag's help.
const dbFlagForms = "postgres://user:password@host:5432/dbname, mysql://user:password@host:3306/dbname, sqlite://PATH or a path ending in .db"

// connectTimeout bounds connecting to PostgreSQL when the DSN sets no connect_timeout, and to
// MariaDB/MySQL when the URL sets no timeout.
const connectTimeout = 5 * time.Second

// dbKind is the database behind a --db URL.
type dbKind int

const (
	kindPostgres dbKind = iota
	kindSQLite
	kindMySQL // MariaDB or MySQL
)

func (k dbKind) String() string {
	switch k {
	case kindSQLite:
		return "SQLite"
	case kindMySQL:
		return "MariaDB/MySQL"
	}
	return "PostgreSQL"
}

// dbURL is a parsed --db value.
type dbURL struct {
	// raw is the value as given; shown is the same with any password removed.
	raw, shown string
	kind       dbKind
	// pg is the pool configuration (kindPostgres).
	pg *pgxpool.Config
	// path is the SQLite file (kindSQLite).
	path string
	// my is the driver configuration (kindMySQL).
	my *mysql.Config
}

// parseDBURL parses a --db value. Errors name the accepted forms.
func parseDBURL(s string) (dbURL, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return dbURL{}, &usageError{fmt.Errorf("no database given: pass --db URL or set OUTBOX_DB (accepted: %s)", dbForms)}
	}
	lower := strings.ToLower(s)
	switch {
	case strings.HasPrefix(lower, "postgres://"), strings.HasPrefix(lower, "postgresql://"):
		i := strings.Index(s, "://")
		s = lower[:i] + s[i:] // pgx accepts the scheme in lower case only
		shown := s
		if u, err := url.Parse(s); err == nil {
			shown = redactURL(u)
		} else {
			return dbURL{}, &usageError{fmt.Errorf("database URL %q is not a valid URL (%s): use %s", redactDSN(s), urlErrText(err), dbForms)}
		}
		cfg, err := pgxpool.ParseConfig(s)
		if err != nil {
			return dbURL{}, &usageError{fmt.Errorf("database URL %q is not a valid PostgreSQL URL (%s): use %s", shown, oneLine(errText(err)), dbForms)}
		}
		if cfg.ConnConfig.ConnectTimeout == 0 {
			cfg.ConnConfig.ConnectTimeout = connectTimeout
		}
		return dbURL{raw: s, shown: shown, kind: kindPostgres, pg: cfg}, nil
	case strings.HasPrefix(lower, "mysql://"), strings.HasPrefix(lower, "mariadb://"):
		return mysqlURL(s)
	case strings.HasPrefix(lower, "sqlite://"):
		return sqliteURL(s, s[len("sqlite://"):])
	case strings.HasPrefix(lower, "sqlite:"):
		return sqliteURL(s, s[len("sqlite:"):])
	case strings.HasPrefix(lower, "file:"):
		return sqliteURL(s, s[len("file:"):])
	case !strings.Contains(s, "://") && (strings.HasSuffix(lower, ".db") || strings.HasSuffix(lower, ".sqlite") || strings.HasSuffix(lower, ".sqlite3")):
		return sqliteURL(s, s)
	}
	return dbURL{}, &usageError{fmt.Errorf("database URL %q is not supported: use %s", redactDSN(s), dbForms)}
}

// sqliteURL builds the dbURL of an SQLite path; a query string ("?mode=ro") is dropped because
// the outbox sets its own pragmas (outbox.SQLiteDSN).
func sqliteURL(raw, path string) (dbURL, error) {
	if i := strings.IndexByte(path, '?'); i >= 0 {
		path = path[:i]
	}
	if path == "" || path == ":memory:" || strings.HasPrefix(path, ":memory:") {
		return dbURL{}, &usageError{fmt.Errorf("database URL %q names no SQLite file (an in-memory database is not shared between connections): use %s", raw, dbForms)}
	}
	return dbURL{raw: raw, shown: raw, kind: kindSQLite, path: path}, nil
}

// redactDSN hides a password in s: as url.URL.Redacted does when s parses as a URL with a
// host part, else the text between the first ':' and the last '@' of what follows the scheme
// ("scheme://" or "scheme:") up to the first '/', '?' or '#' (a URL with a bad port, or
// "mysql:user:password@host/db", still shows no password).
func redactDSN(s string) string {
	u, err := url.Parse(s)
	if err == nil && u.Opaque == "" {
		if u.User != nil {
			return u.Redacted()
		}
		return s
	}
	i := strings.IndexByte(s, ':')
	if i < 0 {
		return s
	}
	start := i + 1
	if strings.HasPrefix(s[start:], "//") {
		start += 2
	}
	auth := s[start:]
	if end := strings.IndexAny(auth, "/?#"); end >= 0 {
		auth = auth[:end]
	}
	at := strings.LastIndexByte(auth, '@')
	colon := strings.IndexByte(auth, ':')
	if at < 0 || colon < 0 || colon > at {
		return s
	}
	return s[:start+colon+1] + "xxxxx" + s[start+at:]
}

// redactURL is u as url.URL.Redacted shows it, with a password query parameter (pgx reads
// ?password=) hidden too.
func redactURL(u *url.URL) string {
	q := u.Query()
	if !q.Has("password") {
		return u.Redacted()
	}
	q.Set("password", "xxxxx")
	c := *u
	c.RawQuery = q.Encode()
	return c.Redacted()
}

// urlErrText is the cause of a url.Parse error without the URL, which can carry a password.
func urlErrText(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err.Error()
	}
	return err.Error()
}

// errText is err's text without pgx's connection-string prefix, which can carry the password.
func errText(err error) string {
	s := err.Error()
	if i := strings.Index(s, "cannot parse `"); i >= 0 {
		if j := strings.Index(s[i+len("cannot parse `"):], "`: "); j >= 0 {
			return s[:i] + "cannot parse the URL: " + s[i+len("cannot parse `")+j+3:]
		}
	}
	return s
}

// database is an open --db with the outbox table's schema.
type database struct {
	url    dbURL
	schema outbox.SchemaConfig
	pool   *pgxpool.Pool // kindPostgres
	sqlDB  *sql.DB       // kindSQLite, kindMySQL
}

// openOptions say how openDB treats a database that does not exist yet.
type openOptions struct {
	// create allows creating a missing SQLite file (migrate, demo); otherwise a missing file is
	// reported as a missing outbox table.
	create bool
}

// openDB connects to u and checks that the connection works. Errors are one line and name
// the fix.
func openDB(ctx context.Context, u dbURL, table string, opts openOptions) (*database, error) {
	d := &database{url: u, schema: schemaFor(u.kind, table)}
	if err := d.schema.Validate(); err != nil {
		return nil, badFlag("table", fmt.Sprintf(" %q: %v", table, err))
	}
	switch u.kind {
	case kindPostgres:
		pool, err := pgxpool.NewWithConfig(ctx, u.pg)
		if err != nil {
			return nil, d.connectError(err)
		}
		pctx, cancel := context.WithTimeout(ctx, 2*connectTimeout)
		defer cancel()
		if err := pool.Ping(pctx); err != nil {
			pool.Close()
			return nil, d.connectError(err)
		}
		d.pool = pool
	case kindSQLite:
		st, err := os.Stat(u.path)
		switch {
		case err == nil && st.IsDir():
			return nil, fmt.Errorf("SQLite path %q is a directory: give the database file, e.g. --db sqlite://%s", u.path, strings.TrimSuffix(u.path, "/")+"/outbox.db")
		case errors.Is(err, os.ErrNotExist) && !opts.create:
			return nil, fmt.Errorf("SQLite file %q does not exist, so it has no outbox table: create it with %s", u.path, d.migrateHint())
		}
		db, err := sql.Open("sqlite", sqliteDSN(u.path))
		if err == nil {
			err = db.PingContext(ctx)
			if err != nil {
				_ = db.Close()
			}
		}
		if err != nil {
			return nil, fmt.Errorf("cannot open SQLite file %q (%s): check that its directory exists and is writable", u.path, oneLine(err.Error()))
		}
		d.sqlDB = db
	case kindMySQL:
		if err := d.openMySQL(ctx); err != nil {
			return nil, err
		}
	}
	return d, nil
}

// connectError turns a PostgreSQL connection failure into a one-line message with the fix.
func (d *database) connectError(err error) error {
	where := d.hostPort()
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return &connectFailure{fmt.Errorf("PostgreSQL at %s refused the connection (%s, SQLSTATE %s): check the user, password and database name in --db %s", where, pgErr.Message, pgErr.Code, d.url.shown)}
	}
	return d.unreachable("PostgreSQL", where, errText(err), err)
}

// unreachable is the message of a connection to server at where that failed before the server
// answered: the network error, "timed out", or else cause (err's text, as the caller cleaned
// it).
func (d *database) unreachable(server, where, cause string, err error) error {
	var opErr *net.OpError
	if errors.As(err, &opErr) {
		cause = opErr.Error()
	} else if errors.Is(err, context.DeadlineExceeded) {
		cause = "timed out"
	}
	return &connectFailure{fmt.Errorf("cannot connect to %s at %s (%s): check that the server runs and that --db %s names the right host, port and database", server, where, oneLine(cause), d.url.shown)}
}

// connectFailure is a failure to connect to the database server (down, unreachable, or
// refusing the connection): one that may pass, which status --watch retries.
type connectFailure struct{ error }

func (e *connectFailure) Unwrap() error { return e.error }

// hostPort is the server's address as host:port (or the PostgreSQL socket path); the SQLite
// file's path.
func (d *database) hostPort() string {
	if d.url.my != nil {
		return d.url.my.Addr
	}
	if d.url.pg == nil {
		return d.url.path
	}
	c := d.url.pg.ConnConfig
	return net.JoinHostPort(c.Host, strconv.Itoa(int(c.Port)))
}

// where names the database for messages.
func (d *database) where() string {
	switch d.url.kind {
	case kindSQLite:
		return fmt.Sprintf("SQLite file %q", d.url.path)
	case kindMySQL:
		return fmt.Sprintf("MariaDB/MySQL at %s/%s", d.hostPort(), d.url.my.DBName)
	}
	return fmt.Sprintf("PostgreSQL at %s/%s", d.hostPort(), d.url.pg.ConnConfig.Database)
}

// migrateHint is the command that creates the outbox table of d.
func (d *database) migrateHint() string {
	h := "`outbox migrate --db " + shellQuote(d.url.shown)
	if t := d.schema.Table; t != "" && t != outbox.DefaultTable {
		h += " --table " + shellQuote(t)
	}
	return h + "`"
}

// shellQuote quotes s for a POSIX shell when it holds anything but safe characters.
func shellQuote(s string) string {
	safe := true
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./:@%+=,", r)) {
			safe = false
			break
		}
	}
	if safe && s != "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// requireTable returns a one-line error naming `outbox migrate` when the outbox table is missing.
func (d *database) requireTable(ctx context.Context) error {
	err := checkTable(ctx, d)
	if err == nil {
		return nil
	}
	if errors.Is(err, errTableNotFound) {
		if schema, serr := d.missingSchema(ctx); serr == nil && schema != "" {
			word, create := d.createSchema(schema)
			return fmt.Errorf("outbox table %q not found in %s, nor its %s %q: create the %s first with `%s`, then the table with %s",
				d.tableName(), d.where(), word, schema, word, create, d.migrateHint())
		}
		return fmt.Errorf("outbox table %q not found in %s: create it with %s", d.tableName(), d.where(), d.migrateHint())
	}
	if errors.Is(err, outbox.ErrTableOutdated) {
		return fmt.Errorf("%s: upgrade it with %s", strings.TrimPrefix(oneLine(err.Error()), "outbox: "), d.migrateHint())
	}
	return d.queryError("checking the outbox table", err)
}

// missingSchema returns the schema of a schema-qualified PostgreSQL --table (the database of a
// qualified MariaDB/MySQL one) when it does not exist, and "" otherwise.
func (d *database) missingSchema(ctx context.Context) (string, error) {
	i := strings.IndexByte(d.tableName(), '.')
	if d.url.kind == kindSQLite || i < 0 {
		return "", nil
	}
	schema := d.tableName()[:i]
	if d.url.kind == kindMySQL {
		ok, err := d.mysqlDatabaseExists(ctx, schema)
		if err != nil || ok {
			return "", err
		}
		return schema, nil
	}
	var oid *uint32
	// The outbox quotes the table's parts, so the schema name is case-sensitive: quote it too.
	if err := d.pool.QueryRow(ctx, "SELECT to_regnamespace($1)::oid", pgx.Identifier{schema}.Sanitize()).Scan(&oid); err != nil {
		return "", err
	}
	if oid != nil {
		return "", nil
	}
	return schema, nil
}

// schemaMissingError is migrate's message when the schema (MariaDB/MySQL: the database) of
// --table does not exist.
func (d *database) schemaMissingError(schema string) error {
	word, create := d.createSchema(schema)
	return fmt.Errorf("cannot create outbox table %q in %s: %s %q does not exist; create it first with `%s`, then run %s again",
		d.tableName(), d.where(), word, schema, create, d.migrateHint())
}

// schemaGone reports whether err says that the schema (PostgreSQL: invalid_schema_name) or
// database (MariaDB/MySQL: unknown database) of a qualified table does not exist.
func schemaGone(err error) bool {
	var pgErr *pgconn.PgError
	var myErr *mysql.MySQLError
	return errors.As(err, &pgErr) && pgErr.Code == "3F000" || errors.As(err, &myErr) && myErr.Number == erBadDB
}

// createSchema names what qualifies a table in d's database ("schema"; "database" on
// MariaDB/MySQL) and the statement that creates the one named name.
func (d *database) createSchema(name string) (word, stmt string) {
	if d.url.kind == kindMySQL {
		return "database", "CREATE DATABASE " + mysqlIdent(name)
	}
	return "schema", "CREATE SCHEMA " + sqlIdent(name)
}

// sqlIdent is name as an SQL identifier: bare when PostgreSQL would not fold or reject it,
// double-quoted otherwise.
func sqlIdent(name string) string {
	bare := name != ""
	for i, r := range name {
		if !(r >= 'a' && r <= 'z' || r == '_' || i > 0 && (r >= '0' && r <= '9' || r == '$')) {
			bare = false
			break
		}
	}
	if bare {
		return name
	}
	return pgx.Identifier{name}.Sanitize()
}

// queryError wraps a failed statement with what was being done and where. The outbox
// package's own "outbox: " prefix is dropped: the command prints its own.
func (d *database) queryError(doing string, err error) error {
	return fmt.Errorf("%s in %s: %s", doing, d.where(), strings.TrimPrefix(oneLine(err.Error()), "outbox: "))
}

// tableName is the outbox table's name.
func (d *database) tableName() string {
	if d.schema.Table == "" {
		return outbox.DefaultTable
	}
	return d.schema.Table
}

// handle is the database handle for the outbox package: a *pgxpool.Pool or a *sql.DB.
func (d *database) handle() any {
	if d.pool != nil {
		return d.pool
	}
	return d.sqlDB
}

// Close closes the pool or DB.
func (d *database) Close() {
	if d.pool != nil {
		d.pool.Close()
	}
	if d.sqlDB != nil {
		_ = d.sqlDB.Close()
	}
}

// exec runs one statement outside any transaction (placeholders as d.params writes them).
func (d *database) exec(ctx context.Context, query string, args ...any) error {
	if d.pool != nil {
		_, err := d.pool.Exec(ctx, query, args...)
		return err
	}
	_, err := d.sqlDB.ExecContext(ctx, query, args...)
	return err
}

// txExec runs a statement inside a transaction of inTx.
type txExec func(query string, args ...any) error

// inTx runs fn in a transaction: tx is the handle for outbox.NewPublisher (pgx.Tx or *sql.Tx),
// exec runs business statements in it. It commits when fn returns nil and rolls back
// otherwise, returning fn's error.
func (d *database) inTx(ctx context.Context, fn func(tx any, exec txExec) error) error {
	if d.pool != nil {
		return pgx.BeginFunc(ctx, d.pool, func(tx pgx.Tx) error {
			return fn(tx, func(q string, args ...any) error {
				_, err := tx.Exec(ctx, q, args...)
				return err
			})
		})
	}
	tx, err := d.sqlDB.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := fn(tx, func(q string, args ...any) error {
		_, err := tx.ExecContext(ctx, q, args...)
		return err
	}); err != nil {
		return errors.Join(err, ignoreDone(tx.Rollback()))
	}
	return tx.Commit()
}

// ignoreDone drops sql.ErrTxDone (a rollback after the driver already ended the transaction).
func ignoreDone(err error) error {
	if errors.Is(err, sql.ErrTxDone) {
		return nil
	}
	return err
}
