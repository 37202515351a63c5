package sqlite

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"time"

	"github.com/watermill-outbox/outbox/internal/dialect"
)

// sqliteLockRetry is how often a woken relay tries again for SQLite's write lock while a
// writer holds it, instead of waiting through SQLite's own busy handler (PRAGMA busy_timeout).
// That handler sleeps 1, 2, 5, 10, 15, 20, 25, 25, 25, 50, 50 and then 100 ms between tries
// (sqliteDefaultBusyCallback), so under a steady stream of writer transactions a claim or mark
// slept through the moments the lock was free: with 4 writer processes committing 1,000
// events/s, claims waited up to 656 ms (p99 63 ms) and commit → handler was p50 32–39 ms, p99
// 283–563 ms; retrying every 250 µs gave p50 10–15 ms, p99 79–162 ms (wakeup/sqlitewal's
// BenchmarkCrossProcessLatency, on a 2-core machine shared with other work). Retrying for only
// the first 5 ms, then through the busy handler, kept p50 at 37–42 ms: a writer that holds the
// lock when the machine is busy holds it longer than that.
//
// Only a relay woken by a wakeup signal (events were just committed) retries so: relays that
// retry on every poll could keep the lock from writers sleeping in the busy handler.
const sqliteLockRetry = 250 * time.Microsecond

// withRelayTx is dialect.WithTx for a relay's claim or mark on a *sql.DB: with eager set,
// it takes one connection of the pool, sets PRAGMA busy_timeout = 0 and tries BEGIN IMMEDIATE
// every sqliteLockRetry for up to the connection's busy timeout, then restores the busy
// timeout before running fn (the pool's other users keep theirs, and fn's statements and
// COMMIT wait as usual). Without eager, or with any other handle, it
// is dialect.WithTx.
func withRelayTx(ctx context.Context, ex dialect.Executor, eager bool, fn func(ex dialect.Executor) error) (err error) {
	db, ok := ex.Handle().(*sql.DB)
	if !ok || ex.InTx() || !eager {
		return dialect.WithTx(ctx, ex, nil, fn)
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	var timeoutMS int64
	if err := conn.QueryRowContext(ctx, `PRAGMA busy_timeout`).Scan(&timeoutMS); err != nil {
		return err
	}
	if _, err := conn.ExecContext(ctx, `PRAGMA busy_timeout = 0`); err != nil {
		return err
	}
	// The busy timeout goes back as soon as the lock is held (or the wait gave up): the
	// statements and COMMIT run with it, as they would without eager locking (in rollback
	// journal mode COMMIT itself may wait for readers).
	restored := false
	restore := func() error {
		if restored {
			return nil
		}
		restored = true
		if _, err := conn.ExecContext(context.WithoutCancel(ctx), fmt.Sprintf(`PRAGMA busy_timeout = %d`, timeoutMS)); err != nil {
			// The connection must not go back to the pool without its busy timeout.
			_ = conn.Raw(func(any) error { return driver.ErrBadConn })
			return err
		}
		return nil
	}
	defer func() { err = errors.Join(err, restore()) }()
	until := time.Now().Add(time.Duration(timeoutMS) * time.Millisecond)
	for {
		_, err = conn.ExecContext(ctx, `BEGIN IMMEDIATE`)
		if err == nil || !sqliteBusy(err) || !time.Now().Before(until) {
			break
		}
		t := time.NewTimer(sqliteLockRetry)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
	}
	if err != nil {
		return err
	}
	if err := restore(); err != nil {
		_, _ = conn.ExecContext(context.WithoutCancel(ctx), `ROLLBACK`)
		return err
	}
	if err := fn(dialect.StdSQL{D: conn, Tx: true}); err != nil {
		_, _ = conn.ExecContext(context.WithoutCancel(ctx), `ROLLBACK`)
		return err
	}
	if _, err := conn.ExecContext(ctx, `COMMIT`); err != nil {
		_, _ = conn.ExecContext(context.WithoutCancel(ctx), `ROLLBACK`)
		return err
	}
	return nil
}

// sqliteBusy reports whether err is SQLITE_BUSY (primary result code 5, any extended code),
// from drivers whose errors have a Code() int method (modernc.org/sqlite, mattn/go-sqlite3's
// is an ErrNo field, which is not recognised: its relay waits through the busy handler).
func sqliteBusy(err error) bool {
	var c interface{ Code() int }
	return errors.As(err, &c) && c.Code()&0xff == 5
}
