package sqlite

import (
	"context"
	"errors"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/watermill-outbox/outbox/internal/dialect"
)

// TestWriteTurnWaitsThenGoesOn: while the process's turn to write is held, another writer on
// the same *sql.DB waits for it, ends its wait with its context, and after the busy timeout
// goes on without a turn (the holder keeps it: the next writer still waits).
func TestWriteTurnWaitsThenGoesOn(t *testing.T) {
	const busy = 300 * time.Millisecond
	db := openPool(t, filepath.Join(t.TempDir(), "turn.db"), int(busy/time.Millisecond))
	ctx := context.Background()
	ex := dialect.StdSQL{D: db}
	end, err := writeTurn(ctx, ex)
	if err != nil {
		t.Fatal(err)
	}

	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := writeTurn(cctx, ex); !errors.Is(err, context.Canceled) {
		t.Fatalf("wait with a cancelled context: %v, want context.Canceled", err)
	}

	start := time.Now()
	end2, err := writeTurn(ctx, ex)
	if err != nil {
		t.Fatal(err)
	}
	if waited := time.Since(start); waited < busy {
		t.Fatalf("second writer went on after %s, before the busy timeout %s", waited, busy)
	}
	end2() // without the turn: ends nothing

	select {
	case gateOf(db).turn <- struct{}{}:
		t.Fatal("the turn was free while its first holder had not ended it")
	default:
	}
	end()
	end3, err := writeTurn(ctx, ex)
	if err != nil {
		t.Fatal(err)
	}
	end3()
}

// TestWriteTurnOnlyForOwnWrites: a transaction, a *sql.Conn and another *sql.DB get no turn:
// they go on at once while the turn of db is held.
func TestWriteTurnOnlyForOwnWrites(t *testing.T) {
	path := filepath.Join(t.TempDir(), "turn.db")
	db, other := openPool(t, path, 10_000), openPool(t, path, 10_000)
	ctx := context.Background()
	end, err := writeTurn(ctx, dialect.StdSQL{D: db})
	if err != nil {
		t.Fatal(err)
	}
	defer end()
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	for name, ex := range map[string]dialect.Executor{
		"transaction":   dialect.StdSQL{D: tx, Tx: true},
		"*sql.Conn":     dialect.StdSQL{D: conn},
		"other *sql.DB": dialect.StdSQL{D: other},
	} {
		tctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		e, err := writeTurn(tctx, ex)
		cancel()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		e()
	}
}

// TestOwnWritesTakeTheTurn: a write in inTurn (the Publisher's own insert and a lease renewal
// use it through writeTurn) and a relay's transactions (withRelayTx: plain, eager, read first
// that found work) each wait for the turn (held here): they finish only after the busy
// timeout, with nothing else holding SQLite's lock.
func TestOwnWritesTakeTheTurn(t *testing.T) {
	const busy = 300 * time.Millisecond
	db := openPool(t, filepath.Join(t.TempDir(), "turn.db"), int(busy/time.Millisecond))
	ctx := context.Background()
	if _, err := db.Exec(`CREATE TABLE t (x INTEGER)`); err != nil {
		t.Fatal(err)
	}
	ex := dialect.StdSQL{D: db}
	end, err := writeTurn(ctx, ex)
	if err != nil {
		t.Fatal(err)
	}
	defer end()
	insert := func(ex dialect.Executor) error {
		_, err := ex.Exec(ctx, `INSERT INTO t VALUES (1)`)
		return err
	}
	for name, write := range map[string]func() error{
		"inTurn":                 func() error { return inTurn(ctx, ex, func() error { return insert(ex) }) },
		"withRelayTx":            func() error { return withRelayTx(ctx, ex, false, false, insert) },
		"withRelayTx eager":      func() error { return withRelayTx(ctx, ex, true, false, insert) },
		"withRelayTx read first": func() error { return withRelayTx(ctx, ex, false, true, readThenBusy(insert)) },
	} {
		start := time.Now()
		if err := write(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if waited := time.Since(start); waited < busy {
			t.Fatalf("%s wrote after %s, without waiting for the turn", name, waited)
		}
	}
	if n := count(t, db); n != 4 {
		t.Fatalf("%d rows, want 4", n)
	}
}

// readThenBusy returns fn as a read-first claim that found work: its deferred try fails as a
// write meeting the lock would (SQLITE_BUSY), so it runs again in the turn.
func readThenBusy(fn func(dialect.Executor) error) func(dialect.Executor) error {
	tried := false
	return func(ex dialect.Executor) error {
		if !tried {
			tried = true
			return busyError{}
		}
		return fn(ex)
	}
}

// busyError is SQLITE_BUSY as sqliteBusy recognises it.
type busyError struct{}

func (busyError) Error() string { return "database is locked (5) (SQLITE_BUSY)" }
func (busyError) Code() int     { return 5 }

// TestManyWritersTakeTurns: 50 goroutines each insert 20 rows through the turn on one pool
// with a 2 s busy timeout while a relay-like writer marks in transactions: every insert
// succeeds (no writer loses the busy handler's draw for the whole timeout) and every row is
// there.
func TestManyWritersTakeTurns(t *testing.T) {
	db := openPool(t, filepath.Join(t.TempDir(), "turn.db"), 2000)
	ctx := context.Background()
	if _, err := db.Exec(`CREATE TABLE t (x INTEGER)`); err != nil {
		t.Fatal(err)
	}
	ex := dialect.StdSQL{D: db}
	const writers, each = 50, 20
	var wg sync.WaitGroup
	errs := make(chan error, writers*each+1)
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				if err := inTurn(ctx, ex, func() error {
					_, err := ex.Exec(ctx, `INSERT INTO t VALUES ($1)`, w*each+i)
					return err
				}); err != nil {
					errs <- err
				}
			}
		})
	}
	stop := make(chan struct{})
	var relay sync.WaitGroup
	relay.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if err := withRelayTx(ctx, ex, false, false, func(ex dialect.Executor) error {
				_, err := ex.Exec(ctx, `UPDATE t SET x = x WHERE x < 10`)
				return err
			}); err != nil {
				errs <- err
				return
			}
		}
	})
	wg.Wait()
	close(stop)
	relay.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("write: %v", err)
	}
	if n := count(t, db); n != writers*each {
		t.Fatalf("%d rows, want %d", n, writers*each)
	}
	var distinct int
	if err := db.QueryRow(`SELECT count(DISTINCT x) FROM t`).Scan(&distinct); err != nil {
		t.Fatal(err)
	}
	if distinct != writers*each {
		t.Fatalf("%d distinct rows, want %d", distinct, writers*each)
	}
}
