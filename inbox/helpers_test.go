package inbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/jackc/pgx/v5"
	_ "modernc.org/sqlite" // the "sqlite" database/sql driver

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/inbox"
	"github.com/watermill-outbox/outbox/internal/pgtest"
	_ "github.com/watermill-outbox/outbox/sqlite"
)

// env is one database with an inbox table, an outbox table and a business table "biz" (id
// TEXT PRIMARY KEY, n INTEGER) of fresh names.
type env struct {
	name   string
	handle any // for Migrate and the operations
	inbox  inbox.SchemaConfig
	outbox outbox.SchemaConfig
	biz    string // quoted business table
}

// pgEnv creates the tables on the shared PostgreSQL through handle (the pgx pool or the
// database/sql DB).
func pgEnv(t testing.TB, name string, handle any) *env {
	t.Helper()
	pool := pgtest.Require(t)
	e := &env{name: name, handle: handle,
		inbox:  inbox.SchemaConfig{Table: pgtest.Table(t)},
		outbox: outbox.SchemaConfig{Table: pgtest.Table(t)},
		biz:    pgx.Identifier{pgtest.Table(t)}.Sanitize()}
	if _, err := pool.Exec(context.Background(), fmt.Sprintf(`CREATE TABLE %s (id TEXT PRIMARY KEY, n INT NOT NULL DEFAULT 0)`, e.biz)); err != nil {
		t.Fatal(err)
	}
	e.migrate(t)
	return e
}

// sqliteEnv opens a fresh SQLite file with the three tables.
func sqliteEnv(t *testing.T) (*env, *sql.DB) {
	t.Helper()
	db, err := sql.Open("sqlite", outbox.SQLiteDSN(filepath.Join(t.TempDir(), "inbox.db")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	e := &env{name: "sqlite", handle: db,
		inbox:  inbox.SchemaConfig{Dialect: outbox.DialectSQLite},
		outbox: outbox.SchemaConfig{Dialect: outbox.DialectSQLite},
		biz:    `"biz"`}
	if _, err := db.Exec(`CREATE TABLE biz (id TEXT PRIMARY KEY, n INTEGER NOT NULL DEFAULT 0)`); err != nil {
		t.Fatal(err)
	}
	e.migrate(t)
	return e, db
}

func (e *env) migrate(t testing.TB) {
	t.Helper()
	for range 2 { // idempotent
		if err := inbox.Migrate(context.Background(), e.handle, e.inbox); err != nil {
			t.Fatal(err)
		}
	}
	if err := outbox.Migrate(context.Background(), e.handle, e.outbox); err != nil {
		t.Fatal(err)
	}
}

// config is an inbox Config over e's tables publishing follow-ups to "followups".
func (e *env) config(consumer string) inbox.Config {
	return inbox.Config{Schema: e.inbox, Consumer: consumer, PublishTopic: "followups",
		Outbox: outbox.PublisherConfig{Schema: e.outbox}}
}

// counts returns the rows of the business, outbox and inbox tables.
func (e *env) counts(t *testing.T) [3]int {
	t.Helper()
	var out [3]int
	for i, table := range []string{e.biz, quote(e.outbox.Table, outbox.DefaultTable), quote(e.inbox.Table, inbox.DefaultTable)} {
		out[i] = e.count(t, "SELECT count(*) FROM "+table)
	}
	return out
}

func (e *env) count(t *testing.T, q string, args ...any) int {
	t.Helper()
	var n int
	var err error
	switch h := e.handle.(type) {
	case interface {
		QueryRow(context.Context, string, ...any) pgx.Row
	}:
		err = h.QueryRow(context.Background(), q, args...).Scan(&n)
	case *sql.DB:
		err = h.QueryRow(q, args...).Scan(&n)
	}
	if err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return n
}

func quote(table, def string) string {
	if table == "" {
		table = def
	}
	return pgx.Identifier{table}.Sanitize()
}

// execTx runs a statement in an inbox transaction of either type.
func execTx(ctx context.Context, tx any, q string, args ...any) error {
	switch tx := tx.(type) {
	case pgx.Tx:
		_, err := tx.Exec(ctx, q, args...)
		return err
	case *sql.Tx:
		_, err := tx.ExecContext(ctx, q, args...)
		return err
	}
	return fmt.Errorf("unexpected transaction %T", tx)
}
