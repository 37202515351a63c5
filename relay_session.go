package outbox

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
)

// relaySettingsSQL sets the relay's settings for its own transaction only (set_config with
// is_local = true is SET LOCAL), so nothing stays on a pooled connection for its other users,
// nor on a server connection that a transaction pooler such as PgBouncer lends to other clients:
//   - jit = off: the claim's recursive key scan has an inflated cost estimate that would trigger
//     JIT compilation (190–305 ms per claim);
//   - plan_cache_mode = force_custom_plan: a statement prepared by the cache exec modes is
//     planned for its actual parameters on every run (a generic plan scans the whole table for
//     the claim's and marks' array parameters);
//   - synchronous_commit = off unless SubscriberConfig.SyncCommit: the relay's commit does not
//     wait for the WAL flush (PostgreSQL docs, "Asynchronous Commit").
func relaySettingsSQL(async bool) string {
	q := "SELECT set_config('jit', 'off', true), set_config('plan_cache_mode', 'force_custom_plan', true)"
	if async {
		q += ", set_config('synchronous_commit', 'off', true)"
	}
	return q
}

// relayBatch queues q in a transaction of its own with the relay's settings: BEGIN, the
// settings, q, COMMIT, sent as one pipelined batch (one round trip, in the connection's exec
// mode; with the simple protocol pgx sends it as one multi-statement query). args lose a
// leading pgx.QueryExecMode (a batch takes none; the custom plan it asked for comes from
// plan_cache_mode).
func relayBatch(q string, args []any, async bool) *pgx.Batch {
	if len(args) > 0 {
		if _, ok := args[0].(pgx.QueryExecMode); ok {
			args = args[1:]
		}
	}
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue(relaySettingsSQL(async))
	b.Queue(q, args...)
	b.Queue("COMMIT")
	return b
}

// relayPreamble is the number of statements relayBatch queues before q.
const relayPreamble = 2

// newRelayExecer adapts the subscriber's handle: a *pgxpool.Pool or a pgx stdlib *sql.DB,
// also inside a watermill-sql Beginner (BeginnerFromPgx, BeginnerFromStdSQL), runs each
// statement in a transaction of its own with the relay's settings (relayBatch); anything else
// is used as newExecer adapts it. Without the settings a claim over stale statistics was
// compiled with JIT every time: 130–160 ms per claim of 1,000 events against 12–14 ms with
// jit = off (PostgreSQL 15, 100,000 events, half of them published since the last ANALYZE).
func newRelayExecer(db any, async bool) (execer, error) {
	if inner, ok := watermillSQLInner(db); ok {
		return newRelayExecer(inner, async)
	}
	switch d := db.(type) {
	case *pgxpool.Pool:
		return relayExecer{async: async, acquire: func(ctx context.Context) (*pgx.Conn, func(), error) {
			c, err := d.Acquire(ctx)
			if err != nil {
				return nil, nil, err
			}
			return c.Conn(), c.Release, nil
		}}, nil
	case *sql.DB:
		if _, ok := d.Driver().(*stdlib.Driver); ok {
			return relayExecer{async: async, acquire: func(ctx context.Context) (*pgx.Conn, func(), error) {
				return stdConn(ctx, d)
			}}, nil
		}
	}
	return newExecer(db)
}

// stdConn takes a connection of a pgx stdlib *sql.DB and returns its *pgx.Conn, which stays
// reserved to the caller until release (database/sql lends it to nobody else meanwhile; a
// connection released inside a transaction, after an error, is discarded at once).
func stdConn(ctx context.Context, db *sql.DB) (*pgx.Conn, func(), error) {
	c, err := db.Conn(ctx)
	if err != nil {
		return nil, nil, err
	}
	var pc *pgx.Conn
	err = c.Raw(func(dc any) error {
		sc, ok := dc.(*stdlib.Conn)
		if !ok {
			return fmt.Errorf("outbox: want a pgx stdlib connection, got %T", dc)
		}
		pc = sc.Conn()
		return nil
	})
	if err != nil {
		_ = c.Close()
		return nil, nil, err
	}
	release := func() {
		if pc.PgConn().TxStatus() != 'I' {
			// Left inside a transaction (a statement of the batch failed): discard it now, not
			// at its next use, so it holds no server connection (or PgBouncer slot) meanwhile.
			_ = c.Raw(func(any) error { return driver.ErrBadConn })
		}
		_ = c.Close()
	}
	return pc, release, nil
}

// relayExecer runs each statement as relayBatch on a connection it takes for the statement.
type relayExecer struct {
	acquire func(ctx context.Context) (conn *pgx.Conn, release func(), err error)
	async   bool
}

// send takes a connection and sends relayBatch(q, args); it returns the results positioned at
// q's.
func (e relayExecer) send(ctx context.Context, q string, args []any) (pgx.BatchResults, func(), error) {
	conn, release, err := e.acquire(ctx)
	if err != nil {
		return nil, nil, err
	}
	br := conn.SendBatch(ctx, relayBatch(q, args, e.async))
	for range relayPreamble {
		if _, err := br.Exec(); err != nil {
			_ = br.Close()
			release()
			return nil, nil, err
		}
	}
	return br, release, nil
}

func (e relayExecer) Query(ctx context.Context, q string, args ...any) (rows, error) {
	br, release, err := e.send(ctx, q, args)
	if err != nil {
		return nil, err
	}
	r, err := br.Query()
	if err != nil {
		_ = br.Close()
		release()
		return nil, err
	}
	return &batchRows{Rows: r, br: br, release: release}, nil
}

func (e relayExecer) Exec(ctx context.Context, q string, args ...any) (int64, error) {
	br, release, err := e.send(ctx, q, args)
	if err != nil {
		return 0, err
	}
	defer release()
	tag, err := br.Exec()
	if _, cerr := br.Exec(); cerr != nil && err == nil { // COMMIT
		err = cerr
	}
	if cerr := br.Close(); cerr != nil && err == nil {
		err = cerr
	}
	return tag.RowsAffected(), err
}

func (e relayExecer) InTx() bool { return false }

// oneShot returns args unchanged: relayBatch sets plan_cache_mode = force_custom_plan.
func (e relayExecer) OneShot(args []any) []any { return args }

// Handle returns nil: each statement takes its own connection.
func (e relayExecer) Handle() any { return nil }

// batchRows reads the statement's rows of a relayBatch; when they end it reads the COMMIT's
// result (an error there is reported by Err) and releases the connection.
type batchRows struct {
	pgx.Rows
	br      pgx.BatchResults
	release func()
	err     error
	done    bool
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
	r.release()
}

func (r *batchRows) Err() error {
	if !r.done {
		return r.Rows.Err()
	}
	return r.err
}

func (r *batchRows) Close() { r.finish() }
