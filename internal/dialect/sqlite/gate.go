package sqlite

import (
	"context"
	"database/sql"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"weak"

	"github.com/watermill-outbox/outbox/internal/dialect"
)

// SQLite has one write lock per database, and a connection that finds it held waits in the
// busy handler, which sleeps and retries (1, 2, 5 … 100 ms apart) until the busy timeout:
// whoever retries at the moment the lock is free takes it, not whoever has waited longest.
// With many writers in one process a writer can lose every draw: in watermill's universal
// suite (50 goroutines publishing 5,000 events, relays claiming and marking, race detector)
// single inserts failed with SQLITE_BUSY after the whole 10 s busy timeout several times a
// run, and a publisher retrying five times in a row hung the suite in CI.
//
// The writes the outbox begins itself on a *sql.DB (a Publisher's own insert, a relay's
// claims, marks and lease renewals) therefore take turns within the process first, in
// arrival order (a Go channel's blocked senders are served first in, first out), and only
// the turn's holder meets the other processes and the callers' own transactions in the busy
// handler. A writer waits for its turn at most the busy timeout, then goes on without it
// (as before this gate), so a lock held elsewhere makes each writer fail after at most twice
// the busy timeout instead of queueing behind every earlier writer's full timeout.

// gate is one *sql.DB's turn to write.
type gate struct {
	turn chan struct{}
	// busy is the pool's busy timeout (PRAGMA busy_timeout, read once); 0 until read.
	busy atomic.Int64
}

var gates sync.Map // weak.Pointer[sql.DB] → *gate

// gateOf returns db's gate, created on first use and forgotten when db is collected.
func gateOf(db *sql.DB) *gate {
	k := weak.Make(db)
	if g, ok := gates.Load(k); ok {
		return g.(*gate)
	}
	g, loaded := gates.LoadOrStore(k, &gate{turn: make(chan struct{}, 1)})
	if !loaded {
		runtime.AddCleanup(db, func(k weak.Pointer[sql.DB]) { gates.Delete(k) }, k)
	}
	return g.(*gate)
}

// writeTurn waits for the process's turn to write through ex's *sql.DB and returns the
// function that ends it. Handles that are not a *sql.DB (a transaction, a *sql.Conn, another
// driver's handle) get no turn: their writes wait in the busy handler as they always did. The
// wait ends with ctx (its error is returned) or after the busy timeout (the write then goes
// on without a turn).
func writeTurn(ctx context.Context, ex dialect.Executor) (end func(), err error) {
	db, ok := ex.Handle().(*sql.DB)
	if !ok || ex.InTx() {
		return func() {}, nil
	}
	g := gateOf(db)
	select {
	case g.turn <- struct{}{}:
		return g.end, nil
	default:
	}
	ms := g.busy.Load()
	if ms == 0 {
		if err := db.QueryRowContext(ctx, `PRAGMA busy_timeout`).Scan(&ms); err != nil {
			return nil, err
		}
		ms = max(ms, 1)
		g.busy.Store(ms)
	}
	t := time.NewTimer(time.Duration(ms) * time.Millisecond)
	defer t.Stop()
	select {
	case g.turn <- struct{}{}:
		return g.end, nil
	case <-t.C:
		return func() {}, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (g *gate) end() { <-g.turn }

// inTurn runs fn within the process's turn to write through ex (writeTurn).
func inTurn(ctx context.Context, ex dialect.Executor, fn func() error) error {
	end, err := writeTurn(ctx, ex)
	if err != nil {
		return err
	}
	defer end()
	return fn()
}
