package mysql

import (
	"context"
	"database/sql"
	_ "embed"
	"fmt"
	"sync"
	"time"

	"github.com/watermill-outbox/outbox/internal/dialect"
)

var _ dialect.Operator = (*Dialect)(nil)

//go:embed console.sql
var consoleFile string

var consoleStmts = dialect.ParseSQLFile(consoleFile)

// consoleCache holds the compiled console.sql statements of each table shape (names key).
var consoleCache sync.Map // string (quoted table) → map[string]*dialect.Stmt

// consoleOf returns console.sql's statements compiled for t.
func consoleOf(t *dialect.Table) map[string]*dialect.Stmt {
	n := namesOf(t)
	if st, ok := consoleCache.Load(n.table); ok {
		return st.(map[string]*dialect.Stmt)
	}
	shape := map[string]string{"t": n.table, "pending_idx": n.pending, "key_idx": n.keyIdx, "dead_idx": ident(t.IndexBase + "_dead_idx"),
		"published_idx": ident(t.IndexBase + "_published_idx"), "held": itoa(dialect.HeldCountLimit), "held_skip": itoa(dialect.HeldCountLimit - 1),
		"scan": itoa(dialect.LeaseScan), "skipped": dialect.SkippedKeyHeader}
	st := map[string]*dialect.Stmt{}
	for name, q := range consoleStmts {
		st[name] = dialect.Compile(dialect.Fill(q, shape), dialect.Question)
	}
	consoleCache.Store(n.table, st)
	return st
}

// runConsole runs console.sql's statement name of t with named parameters.
func runConsole(ctx context.Context, q querier, t *dialect.Table, name string, named map[string]any) (dialect.Rows, error) {
	stmt, args := consoleOf(t)[name].Expand(named)
	return q.query(ctx, stmt, args...)
}

// execConsole is runConsole for a statement without rows.
func execConsole(ctx context.Context, q querier, t *dialect.Table, name string, named map[string]any) (int64, error) {
	stmt, args := consoleOf(t)[name].Expand(named)
	return q.exec(ctx, stmt, args...)
}

// BlockedKeys implements dialect.Operator (console.sql's blocked_keys): its cost grows with
// the keys that have unpublished events and the failed heads' later events, never with the
// history.
func (*Dialect) BlockedKeys(ctx context.Context, ex dialect.Executor, t *dialect.Table, limit int) ([]dialect.BlockedKeyRow, error) {
	rs, err := runConsole(ctx, exQuerier{ex}, t, "blocked_keys", map[string]any{"limit": limit})
	if err != nil {
		return nil, err
	}
	var out []dialect.BlockedKeyRow
	err = scanEach(rs, func(rs dialect.Rows) error {
		var b dialect.BlockedKeyRow
		if err := rs.Scan(&b.Key, &b.Sequence, &b.ID, &b.Topic, &b.Attempts, &b.LastError, (*dbTime)(&b.NextAttemptAt),
			(*dbTime)(&b.DeadLetteredAt), (*dbTime)(&b.CreatedAt), &b.Held, (*dbTime)(&b.Now)); err != nil {
			return err
		}
		out = append(out, b)
		return nil
	})
	return out, err
}

// ActOnHead implements dialect.Operator in one READ COMMITTED transaction: the key's head is
// read and locked FOR UPDATE through the key index (a relay's claim skips it, a mark waits),
// checked in Go (it is event seq, failed or dead-lettered, and not leased), then changed by
// primary key; when it left the key's way, the key's next event is made due at once. MySQL
// refuses an UPDATE whose condition reads its own table (error 1093), hence the steps.
func (*Dialect) ActOnHead(ctx context.Context, ex dialect.Executor, t *dialect.Table, key string, seq int64, a dialect.HeadAction) (int64, error) {
	var change, next string
	switch a {
	case dialect.HeadRetry:
		change = "head_retry"
	case dialect.HeadSkip:
		change, next = "head_skip", "next_unpublished"
	case dialect.HeadPurge:
		change, next = "head_purge", "next_pending"
	default:
		return 0, fmt.Errorf("mysql: unknown head action %d", a)
	}
	var n int64
	err := inTx(ctx, ex, sql.LevelReadCommitted, func(q querier) error {
		n = 0
		named := map[string]any{"key": key, "seq": seq}
		rs, err := runConsole(ctx, q, t, "head", named)
		if err != nil {
			return err
		}
		var (
			head         int64
			failed, free bool
			found        bool
		)
		if err := scanEach(rs, func(rs dialect.Rows) error { found = true; return rs.Scan(&head, &failed, &free) }); err != nil {
			return err
		}
		if !found || head != seq || !failed || !free {
			return nil
		}
		if n, err = execConsole(ctx, q, t, change, named); err != nil || next == "" {
			return err
		}
		rs, err = runConsole(ctx, q, t, next, named)
		if err != nil {
			return err
		}
		var succ int64
		found = false
		if err := scanEach(rs, func(rs dialect.Rows) error { found = true; return rs.Scan(&succ) }); err != nil || !found {
			return err
		}
		_, err = execConsole(ctx, q, t, "due_now", map[string]any{"seq": succ})
		return err
	})
	if err != nil {
		return 0, err
	}
	return n, nil
}

// DeliveryStats implements dialect.Operator (console.sql's stats): the newest maxRows+1
// events published within the window (the extra one tells that the window holds more; the
// oldest minute read is then partial and left out).
func (*Dialect) DeliveryStats(ctx context.Context, ex dialect.Executor, t *dialect.Table, window time.Duration, maxRows int) (dialect.DeliveryStatsRow, error) {
	rs, err := runConsole(ctx, exQuerier{ex}, t, "stats", map[string]any{"window_us": window.Microseconds(), "rows": maxRows + 1})
	if err != nil {
		return dialect.DeliveryStatsRow{}, err
	}
	return dialect.ScanStats(rs, maxRows)
}

// Leases implements dialect.Operator (console.sql's leases), grouped in Go.
func (*Dialect) Leases(ctx context.Context, ex dialect.Executor, t *dialect.Table, limit int) (dialect.LeasesRow, error) {
	rs, err := runConsole(ctx, exQuerier{ex}, t, "leases", map[string]any{"rows": limit + 1})
	if err != nil {
		return dialect.LeasesRow{}, err
	}
	return dialect.ScanLeases(rs, limit)
}

// BacklogOverview implements dialect.Operator (console.sql's overview): its cost is
// O(limit) whatever the backlog and the history.
func (*Dialect) BacklogOverview(ctx context.Context, ex dialect.Executor, t *dialect.Table, limit int) (dialect.OverviewRow, error) {
	rs, err := runConsole(ctx, exQuerier{ex}, t, "overview", map[string]any{"limit": limit})
	if err != nil {
		return dialect.OverviewRow{}, err
	}
	return dialect.ScanOverview(rs)
}
