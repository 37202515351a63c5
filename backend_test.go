package outbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "modernc.org/sqlite" // registers the "sqlite" database/sql driver (pure Go)

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/internal/mariadbtest"
	"github.com/watermill-outbox/outbox/internal/pgtest"
	"github.com/watermill-outbox/outbox/internal/privatepgbouncer"
)

// backend is one dialect the behavioural suite runs against: the same test body runs on
// PostgreSQL (the shared pool), on SQLite (a fresh database file per test) and on MariaDB (the
// shared server, a fresh table per test).
type backend struct {
	dialect outbox.Dialect
	// db is the handle given to Migrate, NewSubscriber and pool-level publishers: a
	// *pgxpool.Pool or the SQLite *sql.DB.
	db any
	// raw runs the tests' own SQL: the pgx stdlib *sql.DB, the SQLite *sql.DB, or a MariaDB
	// *sql.DB whose sessions accept double-quoted identifiers (ANSI_QUOTES).
	raw *sql.DB
}

// eachBackend runs fn as a subtest per backend: "postgresql", "pgbouncer" (PostgreSQL through
// a private PgBouncer in transaction pooling mode, pgx exec mode "exec"), "sqlite" and
// "mariadb".
func eachBackend(t *testing.T, fn func(t *testing.T, b *backend)) {
	t.Helper()
	t.Run("postgresql", func(t *testing.T) {
		fn(t, pgBackend(t))
	})
	t.Run("pgbouncer", func(t *testing.T) {
		fn(t, pgBouncerBackend(t))
	})
	t.Run("sqlite", func(t *testing.T) {
		fn(t, sqliteBackend(t))
	})
	t.Run("mariadb", func(t *testing.T) {
		fn(t, mariaDBBackend(t))
	})
}

// mariaDBBackend is the shared MariaDB test database (internal/mariadbtest).
func mariaDBBackend(t *testing.T) *backend {
	t.Helper()
	return &backend{dialect: outbox.DialectMySQL, db: mariadbtest.Require(t), raw: mariadbtest.Raw(t)}
}

// pgBouncerBackend is the test database through a PgBouncer of its own in transaction pooling
// mode (the handle given to the outbox is a pool in exec mode, which PgBouncer 1.18 serves;
// the statement cache is refused there); raw checks go to the server directly.
func pgBouncerBackend(t *testing.T) *backend {
	t.Helper()
	pgtest.Require(t)
	bn := privatepgbouncer.Start(t, pgtest.DSN())
	cfg, err := pgxpool.ParseConfig(bn.DSN("default_query_exec_mode=exec"))
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return &backend{dialect: outbox.DialectPostgreSQL, db: pool, raw: pgtest.StdDB(t)}
}

// pgBackend is the PostgreSQL backend of the test database (the pool, and database/sql for
// raw checks).
func pgBackend(t *testing.T) *backend {
	t.Helper()
	return &backend{dialect: outbox.DialectPostgreSQL, db: pgtest.Require(t), raw: pgtest.StdDB(t)}
}

// sqliteBackend opens a fresh SQLite database file for t.
func sqliteBackend(t *testing.T) *backend {
	t.Helper()
	return sqliteBackendAt(t, filepath.Join(t.TempDir(), "outbox.db"))
}

// sqliteBackendAt opens the SQLite database file at path (closed when t ends).
func sqliteBackendAt(t *testing.T, path string) *backend {
	t.Helper()
	db, err := sql.Open("sqlite", outbox.SQLiteDSN(path))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return &backend{dialect: outbox.DialectSQLite, db: db, raw: db}
}

// scale returns n, or n/div for SQLite under the race detector (modernc.org/sqlite is C
// translated to Go and runs tens of times slower when every memory access is instrumented).
func (b *backend) scale(n, div int) int {
	if raceEnabled && b.dialect == outbox.DialectSQLite {
		return max(n/div, 1)
	}
	return n
}

// table migrates a fresh outbox table and returns its config.
func (b *backend) table(t *testing.T, mod ...func(*outbox.SchemaConfig)) outbox.SchemaConfig {
	t.Helper()
	cfg := outbox.SchemaConfig{Table: b.tableName(t, "watermill_outbox"), Dialect: b.dialect}
	for _, m := range mod {
		m(&cfg)
	}
	if err := outbox.Migrate(ctx, b.db, cfg); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// tableName returns a fresh table name on the shared servers (dropped when t ends), or name in
// a SQLite database of t's own.
func (b *backend) tableName(t *testing.T, name string) string {
	t.Helper()
	switch b.dialect {
	case outbox.DialectPostgreSQL:
		return pgtest.Table(t)
	case outbox.DialectMySQL:
		return mariadbtest.Table(t)
	}
	return name
}

// setPublished is the SET clause that gives published_at the value expr ("NULL": pending
// again). On MariaDB the key index's column outbox_key goes with it (a CHECK constraint keeps
// it equal to the ordering key while the event is unpublished, NULL after).
func (b *backend) setPublished(expr string) string {
	if b.dialect != outbox.DialectMySQL {
		return "published_at = " + expr
	}
	if expr == "NULL" {
		return "published_at = NULL, outbox_key = ordering_key"
	}
	return "published_at = " + expr + ", outbox_key = NULL"
}

// count runs a query returning one integer.
func (b *backend) count(t *testing.T, q string, args ...any) int {
	t.Helper()
	var n int
	if err := b.raw.QueryRowContext(ctx, q, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return n
}

// exec runs a statement of the test's own.
func (b *backend) exec(t *testing.T, q string, args ...any) {
	t.Helper()
	if _, err := b.raw.ExecContext(ctx, q, args...); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

// at returns a SQL expression for the time now+d in the dialect's time column type.
func (b *backend) at(d time.Duration) string {
	switch b.dialect {
	case outbox.DialectSQLite:
		return fmt.Sprint(time.Now().Add(d).UnixMicro())
	case outbox.DialectMySQL:
		return fmt.Sprintf("(UTC_TIMESTAMP(6) + INTERVAL %d MICROSECOND)", d.Microseconds())
	}
	return fmt.Sprintf("(now() + interval '%d microseconds')", d.Microseconds())
}

// newSub returns a Subscriber on b closed when t ends.
func (b *backend) newSub(t *testing.T, cfg outbox.SubscriberConfig) *outbox.Subscriber {
	t.Helper()
	var logger watermill.LoggerAdapter = watermill.NopLogger{}
	if os.Getenv("OUTBOX_TEST_LOG") != "" {
		logger = watermill.NewStdLogger(true, false)
	}
	s, err := outbox.NewSubscriber(b.db, cfg, logger)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// publisher returns a Publisher on b's pool-level handle (each call commits at once).
func (b *backend) publisher(t *testing.T, cfg outbox.PublisherConfig) *outbox.Publisher {
	t.Helper()
	return mustPublisher(t, b.db, cfg)
}

// seed writes n events round-robin over keys (key "" = unordered) on topic, in batches.
func (b *backend) seed(t *testing.T, schema outbox.SchemaConfig, topic string, n int, keys []string) {
	t.Helper()
	const chunk = 500
	for start := 0; start < n; start += chunk {
		var ks []string
		for i := start; i < min(n, start+chunk); i++ {
			ks = append(ks, keys[i%len(keys)])
		}
		b.publishKeys(t, schema, topic, start, ks)
	}
}

// publishKeys writes one event per element of keys (its ordering key, "" = unordered) on topic
// in one Publish call, so in that order; payloads are {"i":first}, {"i":first+1} …
func (b *backend) publishKeys(t *testing.T, schema outbox.SchemaConfig, topic string, first int, keys []string) {
	t.Helper()
	msgs := make([]*message.Message, len(keys))
	for i, k := range keys {
		msgs[i] = outbox.NewMessage([]byte(fmt.Sprintf(`{"i":%d}`, first+i)))
		if k != "" {
			outbox.SetOrderingKey(msgs[i], k)
		}
	}
	if err := b.publisher(t, outbox.PublisherConfig{Schema: schema}).Publish(topic, msgs...); err != nil {
		t.Fatal(err)
	}
}
