package sqlite

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/watermill-outbox/outbox/internal/dialect"
)

// sqliteLockRetry is how often a relay locking eagerly (ClaimParams.Eager: while writers are
// committing) tries again for SQLite's write lock while a writer holds it, instead of waiting
// through SQLite's own busy handler (PRAGMA busy_timeout). That handler sleeps 1, 2, 5, 10, 15,
// 20, 25, 25, 25, 50, 50 and then 100 ms between tries (sqliteDefaultBusyCallback), so under a
// steady stream of writer transactions a claim or mark slept through the moments the lock was
// free. With 4 writer processes committing 1,000 events/s in all (wakeup/sqlitewal's
// BenchmarkCrossProcessLatency, 2-core machine shared with other work), commit → handler was:
// every claim and mark through the busy handler (claims reading first) p50 4–8 ms, p99 86–525
// ms; eager for the first claim after each wakeup only p50 6–10 ms, p99 114–586 ms; eager for
// every claim while woken, and for each batch's marks, with claims reading first (withRelayTx)
// p50 1.6–1.9 ms, p99 8–37 ms in 5 of 6 rounds (285 ms in one, at load average 15), the
// writers' p99 wait for the lock 21–34 ms (54 ms with the first-claim policy) and their
// throughput unchanged (see README, SQLite).
//
// The subscriber bounds it (maxEagerFullRun): a relay draining a backlog claims back to back
// and would otherwise take the lock at every turn from writers sleeping in the busy handler.
const sqliteLockRetry = 250 * time.Microsecond

// withRelayTx is dialect.WithTx for a relay's claim or mark on a *sql.DB, with two ways of
// keeping the relay's share of SQLite's single write lock short (with any other handle, or
// with neither set, it is dialect.WithTx):
//
//   - readFirst: fn runs first in a deferred transaction, which reads without the write lock.
//     When it writes nothing (a claim that found nothing) it never takes the lock; when its
//     first write finds the lock held or its snapshot outdated by another commit, SQLite
//     answers SQLITE_BUSY at once (it never waits for a lock a reader upgrades to), and fn runs
//     again as below. An idle relay's claims then stop queueing with the writers for the lock.
//   - eager: the write lock is taken by trying BEGIN IMMEDIATE every sqliteLockRetry with
//     PRAGMA busy_timeout = 0, for up to the connection's busy timeout, which is restored
//     before fn runs (the pool's other users keep theirs, and fn's statements and COMMIT wait
//     as usual).
//
// Whatever takes the write lock waits for the process's turn to write first (writeTurn).
// fn must be safe to run twice (it may write only what it returns).
func withRelayTx(ctx context.Context, ex dialect.Executor, eager, readFirst bool, fn func(ex dialect.Executor) error) (err error) {
	db, ok := ex.Handle().(*sql.DB)
	if !ok || ex.InTx() {
		return dialect.WithTx(ctx, ex, nil, fn)
	}
	if readFirst {
		if done, err := readFirstTx(ctx, db, fn); done || err != nil {
			return err
		}
	}
	// The turn is taken before the connection: with a pool of one connection, a writer
	// holding the turn must not wait for a connection held by one waiting for the turn.
	end, err := writeTurn(ctx, ex)
	if err != nil {
		return err
	}
	defer end()
	if !eager && !readFirst {
		return dialect.WithTx(ctx, ex, nil, fn)
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	if !eager {
		if _, err := conn.ExecContext(ctx, `BEGIN IMMEDIATE`); err != nil {
			abandon(ctx, conn)
			return err
		}
		return runLocked(ctx, conn, fn)
	}
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
		abandon(ctx, conn)
		return err
	}
	if err := restore(); err != nil {
		abandon(ctx, conn)
		return err
	}
	return runLocked(ctx, conn, fn)
}

// readFirstTx runs tryDeferred on a connection of its own, given back before the caller waits
// for its turn to write.
func readFirstTx(ctx context.Context, db *sql.DB, fn func(ex dialect.Executor) error) (done bool, err error) {
	conn, err := db.Conn(ctx)
	if err != nil {
		return true, err
	}
	defer conn.Close()
	return tryDeferred(ctx, conn, fn)
}

// tryDeferred runs fn in a deferred transaction on conn (see withRelayTx's readFirst). done
// is false when fn's write met SQLITE_BUSY (rolled back; nothing written): the caller runs fn
// again under the write lock.
func tryDeferred(ctx context.Context, conn *sql.Conn, fn func(ex dialect.Executor) error) (done bool, err error) {
	if _, err := conn.ExecContext(ctx, `BEGIN DEFERRED`); err != nil {
		abandon(ctx, conn)
		return true, err
	}
	err = fn(dialect.StdSQL{D: conn, Tx: true})
	if err == nil {
		if _, err = conn.ExecContext(ctx, `COMMIT`); err == nil {
			return true, nil
		}
	}
	abandon(ctx, conn)
	if sqliteBusy(err) {
		return false, nil
	}
	return true, err
}

// runLocked runs fn in the transaction begun on conn and commits it, or rolls it back on an
// error.
func runLocked(ctx context.Context, conn *sql.Conn, fn func(ex dialect.Executor) error) error {
	if err := fn(dialect.StdSQL{D: conn, Tx: true}); err != nil {
		abandon(ctx, conn)
		return err
	}
	if _, err := conn.ExecContext(ctx, `COMMIT`); err != nil {
		abandon(ctx, conn)
		return err
	}
	return nil
}

// abandon rolls back whatever transaction conn may have open after a failed statement (a
// BEGIN cut short by a cancelled context may still have begun one) and, when that fails,
// takes conn out of the pool: a connection must not go back inside a transaction, where the
// next user's BEGIN would fail and a read snapshot would stay pinned.
func abandon(ctx context.Context, conn *sql.Conn) {
	_, err := conn.ExecContext(context.WithoutCancel(ctx), `ROLLBACK`)
	if err != nil && !strings.Contains(err.Error(), "no transaction is active") {
		_ = conn.Raw(func(any) error { return driver.ErrBadConn })
	}
}

// sqliteBusy reports whether err is SQLITE_BUSY (primary result code 5, any extended code),
// from drivers whose errors have a Code() int method (modernc.org/sqlite, mattn/go-sqlite3's
// is an ErrNo field, which is not recognised: its relay waits through the busy handler).
func sqliteBusy(err error) bool {
	var c interface{ Code() int }
	return errors.As(err, &c) && c.Code()&0xff == 5
}
