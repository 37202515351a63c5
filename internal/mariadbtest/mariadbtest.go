// Package mariadbtest gives tests the shared MariaDB/MySQL test database: OUTBOX_MYSQL_DSN, by
// default root on 127.0.0.1:3306, database test (go-sql-driver/mysql DSN form). When it is
// unreachable the tests that need it skip, or fail when CI=true.
package mariadbtest

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

	_ "github.com/go-sql-driver/mysql" // registers the "mysql" database/sql driver
)

var (
	once    sync.Once
	db, raw *sql.DB
	initErr error
	counter atomic.Int64
)

// DSN is the test database's DSN (without options).
func DSN() string {
	if dsn := os.Getenv("OUTBOX_MYSQL_DSN"); dsn != "" {
		return dsn
	}
	return "root@tcp(127.0.0.1:3306)/test"
}

func withOpts(dsn, opts string) string {
	if strings.Contains(dsn, "?") {
		return dsn + "&" + opts
	}
	return dsn + "?" + opts
}

func setup() {
	db, initErr = sql.Open("mysql", withOpts(DSN(), "interpolateParams=true"))
	if initErr != nil {
		return
	}
	// The raw handle lets tests write their own SQL as on PostgreSQL and SQLite: double-quoted
	// identifiers and || for concatenation (ANSI_QUOTES and PIPES_AS_CONCAT added to the
	// session's sql_mode), $n placeholders (dollarConnector); the outbox's own handle keeps the
	// server's default mode.
	conn, err := newDollarConnector(withOpts(DSN(), "sql_mode=CONCAT(@@sql_mode%2C%27%2CANSI_QUOTES%2CPIPES_AS_CONCAT%27)&parseTime=true"))
	if err != nil {
		initErr = err
		return
	}
	raw = sql.OpenDB(conn)
	db.SetMaxOpenConns(40)
	db.SetMaxIdleConns(40)
	raw.SetMaxOpenConns(8)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if initErr = db.PingContext(ctx); initErr == nil {
		initErr = raw.PingContext(ctx)
	}
}

// Require returns the shared handle (interpolateParams=true), skipping the test (or failing it
// when CI=true) if the server is unreachable.
func Require(tb testing.TB) *sql.DB {
	tb.Helper()
	once.Do(setup)
	if initErr != nil {
		if os.Getenv("CI") == "true" {
			tb.Fatalf("MariaDB at %s unreachable and CI=true: %v", DSN(), initErr)
		}
		tb.Skipf("MariaDB at %s unreachable (set OUTBOX_MYSQL_DSN; in CI this fails): %v", DSN(), initErr)
	}
	return db
}

// Raw returns a handle whose sessions have ANSI_QUOTES (double-quoted identifiers) and
// parseTime, for a test's own SQL; it calls Require first.
func Raw(tb testing.TB) *sql.DB {
	tb.Helper()
	Require(tb)
	return raw
}

// Table returns a fresh table name for tb, unique within the run and across runs, and drops the
// table and its key-lock table when the test ends.
func Table(tb testing.TB) string {
	tb.Helper()
	d := Require(tb)
	name := strings.ToLower(fmt.Sprintf("t_%d_%d_%s", os.Getpid(), counter.Add(1), sanitize(tb.Name())))
	if len(name) > 40 {
		name = name[:40]
	}
	tb.Cleanup(func() {
		_, _ = d.ExecContext(context.Background(), fmt.Sprintf("DROP TABLE IF EXISTS `%s`, `%s_keys`", name, name))
	})
	return name
}

func sanitize(s string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(s) {
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	return b.String()
}
