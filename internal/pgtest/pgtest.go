// Package pgtest is the shared harness of the integration tests: one pgx pool and one
// database/sql handle per test binary, fresh table names per test, and the CI guard.
//
// Without a reachable PostgreSQL a test is skipped with a message locally, but fails when the
// environment variable CI is "true", so a green CI never means "nothing ran".
package pgtest

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" database/sql driver
)

// DefaultDSN is used when OUTBOX_TEST_POSTGRES_DSN is unset.
const DefaultDSN = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// DSN returns OUTBOX_TEST_POSTGRES_DSN or DefaultDSN.
func DSN() string {
	if d := os.Getenv("OUTBOX_TEST_POSTGRES_DSN"); d != "" {
		return d
	}
	return DefaultDSN
}

var (
	once    sync.Once
	pool    *pgxpool.Pool
	stdDB   *sql.DB
	initErr error
	counter atomic.Int64
)

func setup() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cfg, err := pgxpool.ParseConfig(DSN())
	if err != nil {
		initErr = err
		return
	}
	cfg.MaxConns = 24
	pool, err = pgxpool.NewWithConfig(ctx, cfg)
	if err == nil {
		err = pool.Ping(ctx)
	}
	if err != nil {
		initErr = err
		return
	}
	stdDB, initErr = sql.Open("pgx", DSN())
	if initErr == nil {
		stdDB.SetMaxOpenConns(24)
		initErr = stdDB.PingContext(ctx)
	}
}

// Require returns the shared pool, skipping the test (or failing it when CI=true) if
// PostgreSQL is unreachable.
func Require(tb testing.TB) *pgxpool.Pool {
	tb.Helper()
	once.Do(setup)
	if initErr != nil {
		if os.Getenv("CI") == "true" {
			tb.Fatalf("PostgreSQL at %s unreachable and CI=true: %v", DSN(), initErr)
		}
		tb.Skipf("PostgreSQL at %s unreachable (set OUTBOX_TEST_POSTGRES_DSN; in CI this fails): %v", DSN(), initErr)
	}
	return pool
}

// StdDB returns the shared database/sql handle (pgx stdlib driver); it calls Require first.
func StdDB(tb testing.TB) *sql.DB {
	tb.Helper()
	Require(tb)
	return stdDB
}

// Table returns a fresh table name for tb, unique within the run and across runs, and drops the
// table when the test ends.
func Table(tb testing.TB) string {
	tb.Helper()
	p := Require(tb)
	name := strings.ToLower(fmt.Sprintf("t_%d_%d_%s", os.Getpid(), counter.Add(1), sanitize(tb.Name())))
	if len(name) > 40 {
		name = name[:40]
	}
	tb.Cleanup(func() {
		_, _ = p.Exec(context.Background(), fmt.Sprintf(`DROP TABLE IF EXISTS %q CASCADE`, name))
	})
	return name
}

func sanitize(s string) string {
	var b strings.Builder
	for _, r := range s {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	return b.String()
}

// Eventually polls cond every few milliseconds until it returns true or timeout passes, then
// fails tb with msg.
func Eventually(tb testing.TB, timeout time.Duration, msg string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("condition not met within %s: %s", timeout, msg)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
