package outbox

import (
	"database/sql"
	"fmt"
	"net/url"

	"github.com/watermill-outbox/outbox/internal/dialect"
	"github.com/watermill-outbox/outbox/internal/dialect/postgres"
)

// Dialect is the SQL database an outbox table lives in. The same claim, order, lease, retry and
// dead-letter rules hold in every dialect; only SQL text differs.
type Dialect int

const (
	// DialectPostgreSQL (the zero value, default) is PostgreSQL 13+ through pgx/v5 or
	// database/sql with the pgx stdlib driver. Relays share a table through FOR UPDATE SKIP
	// LOCKED, and every lease and retry time comes from the database clock.
	DialectPostgreSQL Dialect = iota
	// DialectSQLite is SQLite 3.35+ (RETURNING, partial indexes, JSON functions) through
	// database/sql with a pure-Go driver such as modernc.org/sqlite (driver name "sqlite"; open
	// it with SQLiteDSN). SQLite has one writer at a time, which replaces SKIP LOCKED: each claim
	// is one statement, so relays in several processes still never lease the same event. Times
	// are INTEGER microseconds since the Unix epoch (UTC) taken from the writer's and the relay's
	// clock. Payloads of a PayloadJSON (or PayloadJSONB) table are JSON text checked with json_valid, stored
	// as written; PayloadBytea
	// stores a BLOB. The table name must not be schema-qualified. A program using it imports
	// github.com/watermill-outbox/outbox/sqlite for its side effect.
	DialectSQLite
	// DialectMySQL is MariaDB 10.6+ and MySQL 8.0.23+ through database/sql with
	// github.com/go-sql-driver/mysql (tested on MariaDB 10.11). Relays share a table through
	// FOR UPDATE SKIP LOCKED, times are DATETIME(6) in UTC from the database clock, and a
	// writer's ordering keys are locked through rows of a companion table "<table>_keys" until
	// its transaction ends (MySQL has no transaction-scoped advisory lock). Payloads of a JSON
	// table are LONGTEXT checked with JSON_VALID (stored as written), PayloadBytea a LONGBLOB.
	// The table may be qualified by its database ("app.outbox"). Migrate needs a *sql.DB (DDL
	// commits implicitly in MySQL). Add interpolateParams=true to the DSN to save a round trip
	// per statement. The session's sql_mode should be strict (the servers' default). A program
	// using it imports github.com/watermill-outbox/outbox/mysql for its side effect.
	DialectMySQL
)

// String returns "postgresql", "sqlite" or "mysql".
func (d Dialect) String() string {
	switch d {
	case DialectPostgreSQL:
		return "postgresql"
	case DialectSQLite:
		return "sqlite"
	case DialectMySQL:
		return "mysql"
	}
	return fmt.Sprintf("Dialect(%d)", int(d))
}

// Capabilities says what a dialect does beyond the rules every dialect keeps (order per
// ordering key, leases, fencing, retries, dead letters); see the README's dialect table.
type Capabilities struct {
	// Notify: PublisherConfig.NotifyChannel wakes relays in other processes through the
	// database (PostgreSQL LISTEN/NOTIFY, see wakeup/pgnotify).
	Notify bool
	// ConcurrentRelays: relays share a table through row locks (FOR UPDATE SKIP LOCKED) and
	// claim side by side; otherwise claims and marks take the database's single write lock in
	// turn (SQLite).
	ConcurrentRelays bool
	// ContinuedRuns: a relay leases a hot ordering key's next run while the marks of its
	// previous run are still being written, instead of waiting for them.
	ContinuedRuns bool
	// DatabaseClock: lease, retry and created_at times come from the database's clock;
	// otherwise from the writers' and the relay's clocks.
	DatabaseClock bool
	// SchemaQualified: SchemaConfig.Table may be qualified ("schema.table", "db.table").
	SchemaQualified bool
	// ClaimAhead: a relay claims its next batch while the current one is out (PostgreSQL,
	// SQLite; not MariaDB/MySQL, see docs/design/relay.md).
	ClaimAhead bool
}

// Capabilities returns what d does; the zero Capabilities for an unknown dialect or one whose
// package the program does not import (see DialectSQLite, DialectMySQL). Safe for concurrent
// use.
func (d Dialect) Capabilities() Capabilities {
	impl := d.impl()
	if impl == nil {
		return Capabilities{}
	}
	c := impl.Capabilities()
	return Capabilities{Notify: c.Notify, ConcurrentRelays: c.SkipLocked, ContinuedRuns: c.Continuations,
		DatabaseClock: c.DatabaseClock, SchemaQualified: c.SchemaQualified, ClaimAhead: c.ClaimAhead}
}

// dialectPackages names the package whose import links each dialect that is not built into
// the root package (see internal/dialect's registry).
var dialectPackages = map[Dialect]string{
	DialectSQLite: "github.com/watermill-outbox/outbox/sqlite",
	DialectMySQL:  "github.com/watermill-outbox/outbox/mysql",
}

// impl returns the dialect's SQL layer, nil for an unknown dialect or one whose package the
// program does not import: the one place the root package selects by dialect.
func (d Dialect) impl() dialect.Dialect {
	if d == DialectPostgreSQL {
		return postgres.Dialect{}
	}
	if _, ok := dialectPackages[d]; ok {
		return dialect.Registered(d.String())
	}
	return nil
}

// lookup returns d's SQL layer, or a *ConfigError for SchemaConfig.Dialect naming the package
// to import when the program does not link d, or saying d is unknown.
func (d Dialect) lookup() (dialect.Dialect, error) {
	if impl := d.impl(); impl != nil {
		return impl, nil
	}
	if pkg, ok := dialectPackages[d]; ok {
		return nil, &ConfigError{Field: "SchemaConfig.Dialect", Reason: fmt.Sprintf("the %s dialect is not linked into the program: add import _ %q", d, pkg)}
	}
	return nil, &ConfigError{Field: "SchemaConfig.Dialect", Reason: fmt.Sprintf("unknown dialect %d", int(d))}
}

// SQLiteDSN returns the data source name to pass to sql.Open("sqlite", …) (modernc.org/sqlite)
// for the SQLite file at path, with the settings the outbox relies on: WAL journal (readers do
// not block the writer), a 10 s busy timeout (writers wait for the single write lock instead of
// failing with SQLITE_BUSY), synchronous=NORMAL (durable across process crashes; the last
// commits may be lost on power failure, see https://www.sqlite.org/wal.html), and IMMEDIATE
// transactions (a transaction takes the write lock at BEGIN, so it never fails half-way when
// it first writes). path is a file path, escaped for the URI ('#', '?' and '%' are safe; use a file: every connection to ":memory:" is a
// separate empty database).
func SQLiteDSN(path string) string {
	q := url.Values{}
	q.Add("_pragma", "busy_timeout(10000)")
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "synchronous(NORMAL)")
	q.Set("_txlock", "immediate")
	return "file:" + (&url.URL{Path: path}).EscapedPath() + "?" + q.Encode()
}

// driverDialect guesses the dialect of a database/sql handle from its driver's package path:
// ok is false when db is not a *sql.DB or *sql.Conn or its driver is not recognised.
func driverDialect(db any) (d Dialect, ok bool) {
	h, isDB := db.(*sql.DB)
	if !isDB {
		return 0, false
	}
	if name, ok := dialect.DriverDialect(h.Driver()); ok {
		return dialectNamed(name)
	}
	return 0, false
}

// dialectNamed returns the Dialect whose String is name.
func dialectNamed(name string) (Dialect, bool) {
	for _, d := range []Dialect{DialectPostgreSQL, DialectSQLite, DialectMySQL} {
		if d.String() == name {
			return d, true
		}
	}
	return 0, false
}

// checkHandle returns a *ConfigError when db cannot serve the dialect: a pgx handle for
// another dialect than PostgreSQL, or a *sql.DB whose driver is of another dialect.
func checkHandle(db any, d Dialect) error {
	if _, isPgx := db.(PgxExecutor); isPgx && d != DialectPostgreSQL {
		return &ConfigError{Field: "db", Reason: fmt.Sprintf("a pgx handle cannot serve SchemaConfig.Dialect %s: open the database with database/sql", d), Err: ErrUnsupportedDB}
	}
	if got, ok := driverDialect(db); ok && got != d {
		return &ConfigError{Field: "SchemaConfig.Dialect", Reason: fmt.Sprintf("the *sql.DB's driver is %s but the dialect is %s: set SchemaConfig.Dialect = outbox.Dialect%s", got, d, map[Dialect]string{DialectSQLite: "SQLite", DialectPostgreSQL: "PostgreSQL", DialectMySQL: "MySQL"}[got]), Err: ErrUnsupportedDB}
	}
	return nil
}
