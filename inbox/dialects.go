package inbox

import (
	"context"
	"fmt"
	"time"

	"github.com/watermill-outbox/outbox"
)

// dialectSQL is the inbox's SQL of one database: what differs between the databases the
// package supports (dialects). Implementations are stateless.
type dialectSQL interface {
	// title names the database in messages.
	title() string
	// qualified reports whether the table name may be schema-qualified.
	qualified() bool
	// pgxRefusal is why a pgx handle cannot serve the database, "" when it can.
	pgxRefusal() string
	// insertNow is the processed_at value of the inbox INSERT, and insertArgs appends its
	// arguments beyond consumer, message id and topic.
	insertNow() string
	insertArgs(args []any) []any
	// statements returns the idempotent DDL of the quoted table with the quoted index idx.
	statements(table, idx string) []string
	// migrate runs the DDL, serialised against concurrent Migrates.
	migrate(ctx context.Context, ex execer, s *schema) error
	// cutoff is the processed_at bound of rows older than olderThan: an SQL expression of
	// parameter $1 and its argument.
	cutoff(olderThan time.Duration) (expr string, arg any)
	// timeDest is the scan destination of a processed_at column into t.
	timeDest(t *time.Time) any
}

// dialects are the databases the package supports.
var dialects = map[outbox.Dialect]dialectSQL{
	outbox.DialectPostgreSQL: postgresSQL{},
	outbox.DialectSQLite:     sqliteSQL{},
}

// Supports reports whether the package has the SQL of dialect d (PostgreSQL and SQLite).
func Supports(d outbox.Dialect) bool {
	_, ok := dialects[d]
	return ok
}

// postgresSQL is PostgreSQL: the database clock, TIMESTAMPTZ, an advisory lock for Migrate.
type postgresSQL struct{}

func (postgresSQL) title() string               { return "PostgreSQL" }
func (postgresSQL) qualified() bool             { return true }
func (postgresSQL) pgxRefusal() string          { return "" }
func (postgresSQL) insertNow() string           { return "now()" }
func (postgresSQL) insertArgs(args []any) []any { return args }
func (postgresSQL) timeDest(t *time.Time) any   { return t }

func (postgresSQL) statements(table, idx string) []string {
	return []string{
		fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
	"consumer"     VARCHAR(255) NOT NULL CHECK ("consumer" <> ''),
	"message_id"   VARCHAR(255) NOT NULL CHECK ("message_id" <> ''),
	"topic"        VARCHAR(255) NULL,
	"processed_at" TIMESTAMPTZ NOT NULL DEFAULT now(),
	PRIMARY KEY ("consumer", "message_id")
)`, table),
		fmt.Sprintf(`CREATE INDEX IF NOT EXISTS %s ON %s ("processed_at")`, idx, table),
	}
}

// migrate runs the DDL after a transaction-scoped advisory lock, as one parameterless
// multi-statement script: the simple query protocol runs it as one implicit transaction (or
// inside the caller's), so the lock covers every statement.
func (postgresSQL) migrate(ctx context.Context, ex execer, s *schema) error {
	script := fmt.Sprintf("SELECT pg_advisory_xact_lock(%d);\n", s.lockSeed)
	for _, st := range s.statements() {
		script += st + ";\n"
	}
	_, err := ex.script(ctx, script)
	return err
}

func (postgresSQL) cutoff(olderThan time.Duration) (string, any) {
	return "now() - $1 * interval '1 microsecond'", olderThan.Microseconds()
}

// sqliteSQL is SQLite: the writer's clock as INTEGER microseconds since the Unix epoch, the
// write lock for Migrate.
type sqliteSQL struct{}

func (sqliteSQL) title() string   { return "SQLite" }
func (sqliteSQL) qualified() bool { return false }
func (sqliteSQL) pgxRefusal() string {
	return "a pgx handle cannot serve the SQLite dialect: open the SQLite file with database/sql"
}
func (sqliteSQL) insertNow() string { return "$4" }
func (sqliteSQL) insertArgs(args []any) []any {
	return append(args, time.Now().UnixMicro())
}
func (sqliteSQL) timeDest(t *time.Time) any { return (*microTime)(t) }

func (sqliteSQL) statements(table, idx string) []string {
	return []string{
		fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
	"consumer"     TEXT NOT NULL CHECK ("consumer" <> ''),
	"message_id"   TEXT NOT NULL CHECK ("message_id" <> ''),
	"topic"        TEXT NULL,
	"processed_at" INTEGER NOT NULL,
	PRIMARY KEY ("consumer", "message_id")
) WITHOUT ROWID`, table),
		fmt.Sprintf(`CREATE INDEX IF NOT EXISTS %s ON %s ("processed_at")`, idx, table),
	}
}

func (sqliteSQL) migrate(ctx context.Context, ex execer, s *schema) error {
	for _, st := range s.statements() {
		if _, err := ex.exec(ctx, st); err != nil {
			return err
		}
	}
	return nil
}

func (sqliteSQL) cutoff(olderThan time.Duration) (string, any) {
	return "$1", time.Now().Add(-olderThan).UnixMicro()
}
