package inbox

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// pgxConnTx is the inbox transaction of FromPgx over a *pgxpool.Pool or *pgx.Conn: BEGIN and
// the inbox row's INSERT go to the server in one pipelined round trip (pgx.Batch), which saves
// the round trip of a separate BEGIN on every message. It implements pgx.Tx on the connection
// the transaction runs on; Begin makes a savepoint (a pseudo nested transaction, as pgx does).
type pgxConnTx struct {
	conn      *pgx.Conn
	release   func() // returns a pool connection; nil for a *pgx.Conn
	savepoint int    // 0: the real transaction; n: savepoint n of parent
	parent    *pgxConnTx
	children  int
	closed    bool
	commitSQL string // opts.CommitQuery, or "commit"
}

// ended reports whether tx, or the transaction it is a savepoint of, has ended: its
// connection may be back in the pool.
func (tx *pgxConnTx) ended() bool { return tx.closed || tx.parent != nil && tx.parent.closed }

// beginSQL renders opts like pgx's own BeginTx does.
func beginSQL(opts pgx.TxOptions) string {
	if opts.BeginQuery != "" {
		return opts.BeginQuery
	}
	var b strings.Builder
	b.WriteString("begin")
	if opts.IsoLevel != "" {
		b.WriteString(" isolation level " + string(opts.IsoLevel))
	}
	if opts.AccessMode != "" {
		b.WriteString(" " + string(opts.AccessMode))
	}
	if opts.DeferrableMode != "" {
		b.WriteString(" " + string(opts.DeferrableMode))
	}
	return b.String()
}

// beginRecord sends BEGIN and the inbox INSERT in one batch on conn and returns the
// transaction and the INSERT's row count. On an error the transaction is rolled back (or the
// connection closed) and release is called.
func beginRecord(ctx context.Context, conn *pgx.Conn, release func(), begin, commit, insert string, args []any) (*pgxConnTx, int64, error) {
	if st := conn.PgConn().TxStatus(); st != 'I' {
		if release != nil {
			release()
		}
		return nil, 0, fmt.Errorf("outbox inbox: the connection is already in a transaction (status %q): is the *pgx.Conn used by several goroutines or Inboxes at once?", st)
	}
	b := &pgx.Batch{}
	b.Queue(begin)
	b.Queue(insert, args...)
	br := conn.SendBatch(ctx, b)
	_, beginErr := br.Exec()
	tag, insErr := br.Exec()
	closeErr := br.Close()
	if closeErr != nil && (errors.Is(closeErr, insErr) || errors.Is(closeErr, beginErr)) {
		closeErr = nil // Close reports the statement's error again
	}
	if commit == "" {
		commit = "commit"
	}
	tx := &pgxConnTx{conn: conn, release: release, commitSQL: commit}
	if err := errors.Join(beginErr, insErr, closeErr); err != nil {
		if beginErr == nil && conn.PgConn().TxStatus() != 'I' {
			_ = tx.Rollback(context.WithoutCancel(ctx))
		} else if tx.release != nil {
			tx.release()
		}
		return nil, 0, err
	}
	return tx, tag.RowsAffected(), nil
}

func (tx *pgxConnTx) end(ctx context.Context, sql string, commit bool) error {
	if tx.ended() {
		return pgx.ErrTxClosed
	}
	tx.closed = true
	tag, err := tx.conn.Exec(ctx, sql)
	if tx.savepoint > 0 {
		return err
	}
	if err != nil && tx.conn.PgConn().TxStatus() != 'I' {
		_ = tx.conn.Close(context.WithoutCancel(ctx)) // the connection is in an unknown state
	}
	if tx.release != nil {
		tx.release() // a pool drops a connection that is closed or still in a transaction
	}
	if err == nil && commit && tag.String() == "ROLLBACK" {
		return pgx.ErrTxCommitRollback
	}
	return err
}

// Commit commits the transaction, or releases the savepoint of a nested one.
func (tx *pgxConnTx) Commit(ctx context.Context) error {
	if tx.savepoint > 0 {
		return tx.end(ctx, fmt.Sprintf("release savepoint sp_%d", tx.savepoint), false)
	}
	return tx.end(ctx, tx.commitSQL, true)
}

// Rollback rolls the transaction back, or to the savepoint of a nested one.
func (tx *pgxConnTx) Rollback(ctx context.Context) error {
	if tx.savepoint > 0 {
		return tx.end(ctx, fmt.Sprintf("rollback to savepoint sp_%d", tx.savepoint), false)
	}
	return tx.end(ctx, "rollback", false)
}

// Begin starts a pseudo nested transaction (a savepoint).
func (tx *pgxConnTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if tx.ended() {
		return nil, pgx.ErrTxClosed
	}
	root := tx
	for root.parent != nil {
		root = root.parent
	}
	root.children++
	n := root.children
	if _, err := tx.conn.Exec(ctx, fmt.Sprintf("savepoint sp_%d", n)); err != nil {
		return nil, err
	}
	return &pgxConnTx{conn: tx.conn, savepoint: n, parent: root}, nil
}

// The statements below refuse to run once the transaction (or the one it is a savepoint of)
// has ended, as pgx's own transaction does (pgx.ErrTxClosed): its connection may be back in the
// pool, in autocommit or serving another message's transaction.

func (tx *pgxConnTx) CopyFrom(ctx context.Context, tableName pgx.Identifier, columnNames []string, rowSrc pgx.CopyFromSource) (int64, error) {
	if tx.ended() {
		return 0, pgx.ErrTxClosed
	}
	return tx.conn.CopyFrom(ctx, tableName, columnNames, rowSrc)
}

func (tx *pgxConnTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if tx.ended() {
		return pgx.FailedBatchResults(b, pgx.ErrTxClosed)
	}
	return tx.conn.SendBatch(ctx, b)
}

// LargeObjects returns pgx's large-object API on the transaction's connection. pgx builds it
// only from its own transaction type, so this takes one round trip (a pgx transaction handle
// whose "begin" is a no-op SELECT on the connection already in the transaction); if that fails
// it returns the zero value, whose methods panic (also once the transaction has ended).
func (tx *pgxConnTx) LargeObjects() pgx.LargeObjects {
	if tx.ended() {
		return pgx.LargeObjects{}
	}
	h, err := tx.conn.BeginTx(context.Background(), pgx.TxOptions{BeginQuery: "select 1"})
	if err != nil {
		return pgx.LargeObjects{}
	}
	return h.LargeObjects()
}

func (tx *pgxConnTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if tx.ended() {
		return nil, pgx.ErrTxClosed
	}
	return tx.conn.Prepare(ctx, name, sql)
}

func (tx *pgxConnTx) Exec(ctx context.Context, sql string, arguments ...any) (pgconn.CommandTag, error) {
	if tx.ended() {
		return pgconn.CommandTag{}, pgx.ErrTxClosed
	}
	return tx.conn.Exec(ctx, sql, arguments...)
}

func (tx *pgxConnTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if tx.ended() {
		return nil, pgx.ErrTxClosed
	}
	return tx.conn.Query(ctx, sql, args...)
}

func (tx *pgxConnTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if tx.ended() {
		return errRow{pgx.ErrTxClosed}
	}
	return tx.conn.QueryRow(ctx, sql, args...)
}

// Conn returns the connection the transaction runs on.
func (tx *pgxConnTx) Conn() *pgx.Conn { return tx.conn }

var _ pgx.Tx = (*pgxConnTx)(nil)

// errRow is the pgx.Row of a statement refused before it ran.
type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }
