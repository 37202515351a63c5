package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/internal/dialect"
	"github.com/watermill-outbox/outbox/internal/dialect/dburl"
	"github.com/watermill-outbox/outbox/internal/dialect/mysql/mysqlurl"     // mysql://, mariadb://
	_ "github.com/watermill-outbox/outbox/internal/dialect/postgres/pgurl"   // postgres://
	_ "github.com/watermill-outbox/outbox/internal/dialect/sqlite/sqliteurl" // sqlite://, *.db
)

// dbForms lists the accepted --db forms, for error messages.
const dbForms = "postgres://user:password@host:5432/dbname (or postgresql://…) for PostgreSQL; " +
	mysqlurl.Form + "; " +
	"sqlite://PATH, sqlite:PATH, file:PATH or a path ending in .db, .sqlite or .sqlite3 for SQLite"

// dbFlagForms lists the accepted --db forms briefly, for the flag's help.
const dbFlagForms = "postgres://user:password@host:5432/dbname, mysql://user:password@host:3306/dbname, sqlite://PATH or a path ending in .db"

// parseDBURL parses a --db value with the dialects linked into the command (dburl). Errors
// are usage errors naming the accepted forms.
func parseDBURL(s string) (dburl.URL, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, &usageError{fmt.Errorf("no database given: pass --db URL or set OUTBOX_DB (accepted: %s)", dbForms)}
	}
	u, ok, err := dburl.Parse(s, dbForms)
	if err != nil {
		return nil, &usageError{err}
	}
	if !ok {
		return nil, &usageError{fmt.Errorf("database URL %q is not supported: use %s", redactDSN(s), dbForms)}
	}
	return u, nil
}

// redactDSN hides a password in s (dburl.RedactDSN).
func redactDSN(s string) string { return dburl.RedactDSN(s) }

// urlErrText is the cause of a url.Parse error without the URL (dburl.URLErrText).
func urlErrText(err error) string { return dburl.URLErrText(err) }

// database is an open --db with the outbox table's schema; the embedded dburl.DB is what
// differs by database.
type database struct {
	dburl.DB
	url    dburl.URL
	schema outbox.SchemaConfig
}

// openOptions say how openDB treats a database that does not exist yet.
type openOptions struct {
	// create allows creating a missing SQLite file (migrate, demo); otherwise a missing file is
	// reported as a missing outbox table.
	create bool
	// applicationName names the sessions (PostgreSQL's application_name); "" keeps the URL's.
	applicationName string
}

// openDB connects to u and checks that the connection works. Errors are one line and name
// the fix.
func openDB(ctx context.Context, u dburl.URL, table string, opts openOptions) (*database, error) {
	d := &database{url: u, schema: schemaFor(u, table)}
	if err := d.schema.Validate(); err != nil {
		return nil, badFlag("table", fmt.Sprintf(" %q: %v", table, err))
	}
	db, err := u.Open(ctx, dburl.OpenOptions{Create: opts.create, MigrateHint: d.migrateHint(), ApplicationName: opts.applicationName})
	if err != nil {
		return nil, err
	}
	d.DB = db
	return d, nil
}

// connectFailure is a failure to connect to the database server (down, unreachable, or
// refusing the connection): one that may pass, which status --watch retries.
type connectFailure = dburl.ConnectFailure

// probes reports whether a relay of d probes the table for new events
// (SubscriberConfig.WakeProbeInterval).
func (d *database) probes() bool {
	_, ok := d.url.SQL().(dialect.WakeProber)
	return ok
}

// where names the database for messages.
func (d *database) where() string { return d.url.Where() }

// migrateHint is the command that creates the outbox table of d.
func (d *database) migrateHint() string {
	h := "`outbox migrate --db " + shellQuote(d.url.Shown())
	if t := d.schema.Table; t != "" && t != outbox.DefaultTable {
		h += " --table " + shellQuote(t)
	}
	return h + "`"
}

// shellQuote quotes s for a POSIX shell when it holds anything but safe characters.
func shellQuote(s string) string { return dburl.ShellQuote(s) }

// requireTable returns a one-line error naming `outbox migrate` when the outbox table is missing.
func (d *database) requireTable(ctx context.Context) error {
	err := checkTable(ctx, d)
	if err == nil {
		return nil
	}
	if errors.Is(err, errTableNotFound) {
		if schema, serr := d.missingSchema(ctx); serr == nil && schema != "" {
			word, create := d.CreateSchema(schema)
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
	if !d.url.SQL().Capabilities().SchemaQualified || i < 0 {
		return "", nil
	}
	schema := d.tableName()[:i]
	ok, err := d.SchemaExists(ctx, schema)
	if err != nil || ok {
		return "", err
	}
	return schema, nil
}

// schemaMissingError is migrate's message when the schema (MariaDB/MySQL: the database) of
// --table does not exist.
func (d *database) schemaMissingError(schema string) error {
	word, create := d.CreateSchema(schema)
	return fmt.Errorf("cannot create outbox table %q in %s: %s %q does not exist; create it first with `%s`, then run %s again",
		d.tableName(), d.where(), word, schema, create, d.migrateHint())
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

// txExec runs a statement inside a transaction of database.InTx.
type txExec = dburl.Exec

// dropTables drops the tables that exist among names, one statement each so that a failure
// leaves no other behind, and returns the first error.
func (d *database) dropTables(ctx context.Context, names ...string) error {
	var first error
	for _, n := range names {
		if err := d.Exec(ctx, "DROP TABLE IF EXISTS "+d.Ident(n)); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// refuseUnsupported returns the usage error of command, which works on PostgreSQL and SQLite
// only, when supported is false for u's database (why: what it lacks there), and nil
// otherwise.
func refuseUnsupported(u dburl.URL, command string, supported bool, why string) error {
	if supported {
		return nil
	}
	return &usageError{fmt.Errorf("%s supports PostgreSQL and SQLite only (%s), not %s (--db %s): give a postgres:// URL or an SQLite file", command, why, dburl.Title(u), u.Shown())}
}
