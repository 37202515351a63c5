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
func newRelayExecer(db any, async bool) (execer, error) {
	switch d := db.(type) {
	case *pgxpool.Pool:
		return poolRelayExecer{pool: d, async: async}, nil
	case *sql.DB:
		if _, ok := d.Driver().(*stdlib.Driver); ok {
			return stdRelayExecer{db: d}, nil
		}
	}
	return newExecer(db)
}

type poolRelayExecer struct {
	pool *pgxpool.Pool
	// async runs each statement in its own transaction with synchronous_commit = off (and
	// plan_cache_mode = force_custom_plan, the batch's stand-in for QueryExecModeExec), sent
	// with BEGIN and COMMIT as one pipelined batch: one round trip, no wait for the WAL flush.
	async bool
}

// asyncBatch queues q in a transaction that commits without waiting for the WAL flush
// (PostgreSQL docs, "Asynchronous Commit"). args lose a leading pgx.QueryExecMode (a batch
// takes none; the custom plan it asked for comes from plan_cache_mode).
func asyncBatch(q string, args []any) *pgx.Batch {
	if len(args) > 0 {
		if _, ok := args[0].(pgx.QueryExecMode); ok {
			args = args[1:]
		}
	}
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue("SET LOCAL synchronous_commit = off")
	b.Queue("SET LOCAL plan_cache_mode = force_custom_plan")
	b.Queue(q, args...)
	b.Queue("COMMIT")
	return b
}

// batchRows reads the statement's rows of an asyncBatch; when they end it reads the COMMIT's
// result (an error there is reported by Err) and releases the connection.
type batchRows struct {
	pgx.Rows
	br   pgx.BatchResults
	conn *pgxpool.Conn
	err  error
	done bool
}

func (r *batchRows) Next() bool {
	if r.done {
		return false
	}
	if r.Rows.Next() {
		return true
	}
	r.finish()
	return false
}

func (r *batchRows) finish() {
	if r.done {
		return
	}
	r.done = true
	r.Rows.Close()
	r.err = r.Rows.Err()
	if _, err := r.br.Exec(); err != nil && r.err == nil {
		r.err = err
	}
	if err := r.br.Close(); err != nil && r.err == nil {
		r.err = err
	}
	r.conn.Release()
}

func (r *batchRows) Err() error {
	if !r.done {
		return r.Rows.Err()
	}
	return r.err
}

func (r *batchRows) Close() { r.finish() }

// sendAsync sends asyncBatch(q, args) and returns its results positioned at the statement.
func sendAsync(ctx context.Context, conn *pgxpool.Conn, q string, args []any) (pgx.BatchResults, error) {
	br := conn.SendBatch(ctx, asyncBatch(q, args))
	for range 3 { // BEGIN, SET LOCAL, SET LOCAL
		if _, err := br.Exec(); err != nil {
			_ = br.Close()
			return nil, err
		}
	}
	return br, nil
}

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
	if e.async {
		br, err := sendAsync(ctx, conn, q, args)
		if err != nil {
			conn.Release()
			return nil, err
		}
		r, err := br.Query()
		if err != nil {
			_ = br.Close()
			conn.Release()
			return nil, err
		}
		return &batchRows{Rows: r, br: br, conn: conn}, nil
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
	if e.async {
		br, err := sendAsync(ctx, conn, q, args)
		if err != nil {
			return 0, err
		}
		tag, err := br.Exec()
		if _, cerr := br.Exec(); cerr != nil && err == nil { // COMMIT
			err = cerr
		}
		if cerr := br.Close(); cerr != nil && err == nil {
			err = cerr
		}
		return tag.RowsAffected(), err
	}
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
