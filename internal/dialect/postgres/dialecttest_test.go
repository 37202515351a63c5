package postgres

import (
	"context"
	"database/sql"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/watermill-outbox/outbox/internal/dialect"
	"github.com/watermill-outbox/outbox/internal/dialect/dialecttest"
	"github.com/watermill-outbox/outbox/internal/pgtest"
	"github.com/watermill-outbox/outbox/internal/privatepgbouncer"
)

// pgAt is the harness's time expression: the transaction's clock plus d.
func pgAt(d time.Duration) string {
	return fmt.Sprintf("(now() + interval '%d microseconds')", d.Microseconds())
}

func pgTable(t *testing.T) *dialect.Table {
	name := pgtest.Table(t)
	return &dialect.Table{Parts: []string{name}, IndexBase: name, FillFactor: 100, FillDefault: true, LockSeed: 7}
}

// pgListen listens on channel on a connection of its own, straight to the server (LISTEN
// needs a session, which a transaction-mode pooler does not keep).
func pgListen(t *testing.T, channel string) <-chan string {
	ctx, cancel := context.WithCancel(context.Background())
	conn, err := pgx.Connect(ctx, pgtest.DSN())
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
		cancel()
		t.Fatal(err)
	}
	out, done := make(chan string, 64), make(chan struct{})
	go func() {
		defer close(done)
		for {
			n, err := conn.WaitForNotification(ctx)
			if err != nil {
				return
			}
			out <- n.Payload
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		_ = conn.Close(context.Background())
	})
	return out
}

// pgSession and pgWaiting: the backend's pid, and whether it waits for a lock.
func pgSession(ctx context.Context, ex dialect.Executor) (int64, error) {
	rs, err := ex.Query(ctx, `SELECT pg_backend_pid()::bigint`)
	if err != nil {
		return 0, err
	}
	return dialect.ScanOne[int64](rs)
}

func pgWaiting(ex dialect.Executor) func(ctx context.Context, pid int64) (bool, error) {
	return func(ctx context.Context, pid int64) (bool, error) {
		rs, err := ex.Query(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE pid = $1 AND NOT granted)`, pid)
		if err != nil {
			return false, err
		}
		return dialect.ScanOne[bool](rs)
	}
}

// pgCurrentTx is the low 32 bits of ex's transaction id (assigning one).
func pgCurrentTx(ctx context.Context, ex dialect.Executor) (uint32, error) {
	rs, err := ex.Query(ctx, `SELECT pg_current_xact_id()::text::bigint`)
	if err != nil {
		return 0, err
	}
	x, err := dialect.ScanOne[int64](rs)
	return uint32(x), err
}

// pgxHarness runs the suite over a pgx pool.
func pgxHarness(pool *pgxpool.Pool) dialecttest.Harness {
	ex := dialecttest.Pgx{D: pool}
	return dialecttest.Harness{Dialect: Dialect{}, Ex: ex, Raw: ex, Table: pgTable, At: pgAt, TextType: "text", Listen: pgListen,
		Session: pgSession, Waiting: pgWaiting(ex), CurrentTx: pgCurrentTx,
		InTx: func(ctx context.Context, fn func(dialect.Executor) error) error {
			return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return fn(dialecttest.Pgx{D: tx, Tx: true}) })
		}}
}

// stdHarness runs the suite over database/sql with the pgx stdlib driver.
func stdHarness(db *sql.DB) dialecttest.Harness {
	ex := dialect.StdSQL{D: db, Pgx: true}
	return dialecttest.Harness{Dialect: Dialect{}, Ex: ex, Raw: ex, Table: pgTable, At: pgAt, TextType: "text", Listen: pgListen,
		Session: pgSession, Waiting: pgWaiting(ex), CurrentTx: pgCurrentTx}
}

// TestDialectSuitePgx runs the shared dialect suite on PostgreSQL through a pgx pool.
func TestDialectSuitePgx(t *testing.T) {
	dialecttest.Run(t, pgxHarness(pgtest.Require(t)))
}

// TestDialectSuiteStdSQL runs the shared dialect suite on PostgreSQL through database/sql.
func TestDialectSuiteStdSQL(t *testing.T) {
	dialecttest.Run(t, stdHarness(pgtest.StdDB(t)))
}

// TestDialectSuitePgBouncer runs the shared dialect suite on PostgreSQL through PgBouncer in
// transaction pooling mode, with a pgx pool (exec mode: no prepared statements survive a
// transaction there) and with database/sql.
func TestDialectSuitePgBouncer(t *testing.T) {
	pgtest.Require(t)
	b := privatepgbouncer.Start(t, pgtest.DSN())
	dsn := b.DSN("default_query_exec_mode=exec")
	t.Run("pgx", func(t *testing.T) {
		pool, err := pgxpool.New(context.Background(), dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		dialecttest.Run(t, pgxHarness(pool))
	})
	t.Run("database/sql", func(t *testing.T) {
		db, err := sql.Open("pgx", dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = db.Close() })
		dialecttest.Run(t, stdHarness(db))
	})
}
