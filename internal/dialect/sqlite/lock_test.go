package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"strconv"
	"testing"

	_ "modernc.org/sqlite"

	"github.com/watermill-outbox/outbox/internal/dialect"
)

// openPool opens the WAL database at path with the given busy timeout (ms) and IMMEDIATE
// transactions, as outbox.SQLiteDSN does.
func openPool(t *testing.T, path string, busyMS int) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout("+strconv.Itoa(busyMS)+")&_pragma=journal_mode(WAL)&_txlock=immediate")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// lockTestDB returns two pools on one new database holding table t(x): relay's with busy
// timeout busyMS, other's (the "writer") with none.
func lockTestDB(t *testing.T, busyMS int) (relay, other *sql.DB) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "lock.db")
	other = openPool(t, path, 0)
	if _, err := other.Exec(`CREATE TABLE t (x INTEGER)`); err != nil {
		t.Fatal(err)
	}
	return openPool(t, path, busyMS), other
}

// holdLock begins a write transaction on other (holding SQLite's write lock until the
// returned transaction ends).
func holdLock(t *testing.T, other *sql.DB) *sql.Tx {
	t.Helper()
	tx, err := other.Begin() // BEGIN IMMEDIATE (_txlock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback() })
	return tx
}

func count(t *testing.T, db *sql.DB) int {
	t.Helper()
	var n int
	if err := db.QueryRow(`SELECT count(*) FROM t`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestReadFirstTakesNoLockForReads: while another connection holds the write lock, a read-only
// fn under readFirst completes (it never asks for the lock), and the same fn without
// readFirst fails with SQLITE_BUSY (busy timeout 0: BEGIN IMMEDIATE does not wait).
func TestReadFirstTakesNoLockForReads(t *testing.T) {
	relay, other := lockTestDB(t, 0)
	holdLock(t, other)
	ctx := context.Background()
	read := func(ex dialect.Executor) error {
		rs, err := ex.Query(ctx, `SELECT x FROM t`)
		if err != nil {
			return err
		}
		defer rs.Close()
		for rs.Next() {
		}
		return rs.Err()
	}
	ex := dialect.StdSQL{D: relay}
	if err := withRelayTx(ctx, ex, false, true, read); err != nil {
		t.Fatalf("readFirst read under another writer's lock: %v", err)
	}
	if err := withRelayTx(ctx, ex, false, false, read); !sqliteBusy(err) {
		t.Fatalf("without readFirst: got %v, want SQLITE_BUSY", err)
	}
}

// TestReadFirstRetriesWrites: fn's write under readFirst meets the lock held by another
// connection: the deferred try is rolled back (nothing written) and BEGIN IMMEDIATE follows,
// which fails here (busy timeout 0) before fn runs again; once the lock is free, one deferred
// run writes.
func TestReadFirstRetriesWrites(t *testing.T) {
	relay, other := lockTestDB(t, 0)
	tx := holdLock(t, other)
	ctx := context.Background()
	runs := 0
	write := func(ex dialect.Executor) error {
		runs++
		_, err := ex.Exec(ctx, `INSERT INTO t VALUES (1)`)
		return err
	}
	ex := dialect.StdSQL{D: relay}
	if err := withRelayTx(ctx, ex, false, true, write); !sqliteBusy(err) {
		t.Fatalf("write under another writer's lock: got %v, want SQLITE_BUSY", err)
	}
	if runs != 1 {
		t.Fatalf("fn ran %d times, want 1 (the deferred try)", runs)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	if n := count(t, other); n != 0 {
		t.Fatalf("%d rows after the failed tries, want 0", n)
	}
	runs = 0
	if err := withRelayTx(ctx, ex, false, true, write); err != nil {
		t.Fatal(err)
	}
	if runs != 1 {
		t.Fatalf("fn ran %d times with the lock free, want 1", runs)
	}
	if n := count(t, other); n != 1 {
		t.Fatalf("%d rows, want 1", n)
	}
}

// TestReadFirstStaleSnapshot: another connection commits between fn's read and its write, so
// the deferred try's snapshot is outdated (SQLITE_BUSY_SNAPSHOT): fn runs again under the
// write lock and sees that commit.
func TestReadFirstStaleSnapshot(t *testing.T) {
	relay, other := lockTestDB(t, 10000)
	ctx := context.Background()
	var seen []int
	runs := 0
	fn := func(ex dialect.Executor) error {
		runs++
		rs, err := ex.Query(ctx, `SELECT count(*) FROM t`)
		if err != nil {
			return err
		}
		n := 0
		for rs.Next() {
			if err := rs.Scan(&n); err != nil {
				rs.Close()
				return err
			}
		}
		rs.Close()
		seen = append(seen, n)
		if runs == 1 {
			if _, err := other.Exec(`INSERT INTO t VALUES (1)`); err != nil {
				return err
			}
		}
		_, err = ex.Exec(ctx, `INSERT INTO t VALUES (2)`)
		return err
	}
	if err := withRelayTx(ctx, dialect.StdSQL{D: relay}, true, true, fn); err != nil {
		t.Fatal(err)
	}
	if runs != 2 || seen[0] != 0 || seen[1] != 1 {
		t.Fatalf("runs %d, rows seen %v; want 2 runs seeing [0 1]", runs, seen)
	}
	if n := count(t, other); n != 2 {
		t.Fatalf("%d rows, want 2", n)
	}
}

// TestEagerRestoresBusyTimeout: an eager transaction started while another connection holds
// the lock (it retries BEGIN IMMEDIATE with busy_timeout 0 until the lock is released, if it
// gets there first) runs once, and gives the connection back with its busy timeout, also
// when fn fails.
func TestEagerRestoresBusyTimeout(t *testing.T) {
	relay, other := lockTestDB(t, 10000)
	relay.SetMaxOpenConns(1)
	tx := holdLock(t, other)
	ctx := context.Background()
	done := make(chan error, 1)
	go func() {
		done <- withRelayTx(ctx, dialect.StdSQL{D: relay}, true, false, func(ex dialect.Executor) error {
			_, err := ex.Exec(ctx, `INSERT INTO t VALUES (1)`)
			return err
		})
	}()
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	var ms int
	if err := relay.QueryRow(`PRAGMA busy_timeout`).Scan(&ms); err != nil {
		t.Fatal(err)
	}
	if ms != 10000 {
		t.Fatalf("busy_timeout %d after an eager transaction, want 10000", ms)
	}
	if n := count(t, other); n != 1 {
		t.Fatalf("%d rows, want 1", n)
	}
	boom := errors.New("boom")
	if err := withRelayTx(ctx, dialect.StdSQL{D: relay}, true, false, func(dialect.Executor) error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("fn's error: got %v", err)
	}
	if err := relay.QueryRow(`PRAGMA busy_timeout`).Scan(&ms); err != nil || ms != 10000 {
		t.Fatalf("busy_timeout %d (%v) after a failed eager transaction, want 10000", ms, err)
	}
	if n := count(t, other); n != 1 {
		t.Fatalf("%d rows after the failed transaction, want 1", n)
	}
}
