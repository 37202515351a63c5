package outbox

import (
	"context"
	"database/sql"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
)

// relaySessionSQL prepares a connection for the relay's statements once per physical
// connection: the claim's recursive key scan has an inflated cost estimate that would trigger
// JIT compilation (hundreds of milliseconds per claim). The setting stays on the pooled
// connection for its other users; jit = off is harmless for short OLTP statements.
const relaySessionSQL = "SET jit = off"

const relaySessionKey = "watermill-outbox.relay-session"

func prepareRelaySession(ctx context.Context, c *pgx.Conn) error {
	data := c.PgConn().CustomData()
	if data[relaySessionKey] != nil {
		return nil
	}
	if _, err := c.Exec(ctx, relaySessionSQL, pgx.QueryExecModeSimpleProtocol); err != nil {
		return err
	}
	data[relaySessionKey] = true
	return nil
}

// newRelayExecer adapts the subscriber's handle: a *pgxpool.Pool or a pgx stdlib *sql.DB gets
// per-connection session preparation; anything else is used as newExecer adapts it.
func newRelayExecer(db any) (execer, error) {
	switch d := db.(type) {
	case *pgxpool.Pool:
		return poolRelayExecer{pool: d}, nil
	case *sql.DB:
		if _, ok := d.Driver().(*stdlib.Driver); ok {
			return stdRelayExecer{db: d}, nil
		}
	}
	return newExecer(db)
}

type poolRelayExecer struct{ pool *pgxpool.Pool }

type poolRows struct {
	pgx.Rows
	conn *pgxpool.Conn
}

func (r poolRows) Close() {
	r.Rows.Close()
	r.conn.Release()
}

func (e poolRelayExecer) acquire(ctx context.Context) (*pgxpool.Conn, error) {
	conn, err := e.pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	if err := prepareRelaySession(ctx, conn.Conn()); err != nil {
		conn.Release()
		return nil, err
	}
	return conn, nil
}

func (e poolRelayExecer) query(ctx context.Context, q string, args ...any) (rows, error) {
	conn, err := e.acquire(ctx)
	if err != nil {
		return nil, err
	}
	r, err := conn.Query(ctx, q, args...)
	if err != nil {
		conn.Release()
		return nil, err
	}
	return poolRows{Rows: r, conn: conn}, nil
}

func (e poolRelayExecer) exec(ctx context.Context, q string, args ...any) (int64, error) {
	conn, err := e.acquire(ctx)
	if err != nil {
		return 0, err
	}
	defer conn.Release()
	tag, err := conn.Exec(ctx, q, args...)
	return tag.RowsAffected(), err
}

func (e poolRelayExecer) inTx() bool { return false }

func (e poolRelayExecer) oneShot(args []any) []any { return prependExecMode(args) }

type stdRelayExecer struct{ db *sql.DB }

type stdConnRows struct {
	*sql.Rows
	conn *sql.Conn
}

func (r stdConnRows) Close() {
	_ = r.Rows.Close()
	_ = r.conn.Close()
}

func (e stdRelayExecer) conn(ctx context.Context) (*sql.Conn, error) {
	conn, err := e.db.Conn(ctx)
	if err != nil {
		return nil, err
	}
	err = conn.Raw(func(dc any) error {
		if sc, ok := dc.(*stdlib.Conn); ok {
			return prepareRelaySession(ctx, sc.Conn())
		}
		return nil
	})
	if err != nil {
		_ = conn.Close()
		return nil, err
	}
	return conn, nil
}

func (e stdRelayExecer) query(ctx context.Context, q string, args ...any) (rows, error) {
	conn, err := e.conn(ctx)
	if err != nil {
		return nil, err
	}
	r, err := conn.QueryContext(ctx, q, args...)
	if err != nil {
		_ = conn.Close()
		return nil, err
	}
	return stdConnRows{Rows: r, conn: conn}, nil
}

func (e stdRelayExecer) exec(ctx context.Context, q string, args ...any) (int64, error) {
	conn, err := e.conn(ctx)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	res, err := conn.ExecContext(ctx, q, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

func (e stdRelayExecer) inTx() bool { return false }

func (e stdRelayExecer) oneShot(args []any) []any { return prependExecMode(args) }
