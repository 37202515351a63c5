package outbox

import (
	"context"
	"database/sql"
	"database/sql/driver"

	wmsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
)

// PgxExecutor is the part of pgx/v5 the package uses. It is satisfied by pgx.Tx, *pgx.Conn and
// *pgxpool.Pool.
type PgxExecutor interface {
	Exec(ctx context.Context, sql string, arguments ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// SQLExecutor is the part of database/sql the package uses. It is satisfied by *sql.Tx, *sql.DB
// and *sql.Conn opened with the pgx stdlib driver ("pgx") for PostgreSQL.
type SQLExecutor interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// rows is what the package reads query results through.
type rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
	Close()
}

// execer runs statements on one of the supported handles.
type execer interface {
	query(ctx context.Context, sql string, args ...any) (rows, error)
	exec(ctx context.Context, sql string, args ...any) (int64, error)
	// inTx reports whether statements run inside a caller's transaction.
	inTx() bool
	// oneShot returns args for a statement that must be planned for its actual parameters on
	// every run (the relay's claim and marks: a cached generic plan scans the whole table for
	// their array parameters). With pgx it selects pgx.QueryExecModeExec; other drivers get
	// args unchanged.
	oneShot(args []any) []any
}

func prependExecMode(args []any) []any {
	return append([]any{pgx.QueryExecModeExec}, args...)
}

// newExecer adapts db: a pgx.Tx, *pgx.Conn, *pgxpool.Pool (PgxExecutor), a *sql.Tx, *sql.DB,
// *sql.Conn (SQLExecutor) or a watermill-sql v4 ContextExecutor (TxFromPgx, TxFromStdSQL,
// BeginnerFromPgx, BeginnerFromStdSQL).
func newExecer(db any) (execer, error) {
	switch d := db.(type) {
	case nil:
		return nil, &ConfigError{Field: "db", Reason: "nil database handle", Err: ErrUnsupportedDB}
	case PgxExecutor:
		_, tx := d.(pgx.Tx)
		switch d.(type) {
		case wmsql.PgxTx, *wmsql.PgxTx: // TxFromPgx: Commit/Rollback without a context
			tx = true
		}
		return pgxExecer{d: d, tx: tx}, nil
	case SQLExecutor:
		_, tx := d.(*sql.Tx)
		return sqlExecer{d: d, tx: tx, pgx: isPgxStdlib(d)}, nil
	case wmsql.StdSQLBeginner:
		return newExecer(d.SQLBeginner)
	case wmsql.ContextExecutor:
		_, tx := d.(interface{ Commit() error })
		return wmExecer{d: d, tx: tx}, nil
	default:
		return nil, &ConfigError{Field: "db", Reason: "want pgx.Tx, *pgx.Conn, *pgxpool.Pool, *sql.Tx, *sql.DB, *sql.Conn or a watermill-sql ContextExecutor", Err: ErrUnsupportedDB}
	}
}

type pgxExecer struct {
	d  PgxExecutor
	tx bool
}

func (e pgxExecer) query(ctx context.Context, q string, args ...any) (rows, error) {
	r, err := e.d.Query(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	return r, nil
}

func (e pgxExecer) exec(ctx context.Context, q string, args ...any) (int64, error) {
	tag, err := e.d.Exec(ctx, q, args...)
	return tag.RowsAffected(), err
}

func (e pgxExecer) inTx() bool { return e.tx }

func (e pgxExecer) oneShot(args []any) []any { return prependExecMode(args) }

type sqlExecer struct {
	d   SQLExecutor
	tx  bool
	pgx bool // the pgx stdlib driver: pgx options pass through as arguments
}

// isPgxStdlib reports whether d is a *sql.DB or *sql.Conn of the pgx stdlib driver.
func isPgxStdlib(d SQLExecutor) bool {
	if db, ok := d.(interface{ Driver() driver.Driver }); ok {
		_, isPgx := db.Driver().(*stdlib.Driver)
		return isPgx
	}
	return false
}

type sqlRows struct{ *sql.Rows }

func (r sqlRows) Close() { _ = r.Rows.Close() }

func (e sqlExecer) query(ctx context.Context, q string, args ...any) (rows, error) {
	r, err := e.d.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	return sqlRows{r}, nil
}

func (e sqlExecer) exec(ctx context.Context, q string, args ...any) (int64, error) {
	res, err := e.d.ExecContext(ctx, q, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

func (e sqlExecer) inTx() bool { return e.tx }

func (e sqlExecer) oneShot(args []any) []any {
	if e.pgx {
		return prependExecMode(args)
	}
	return args
}

type wmExecer struct {
	d  wmsql.ContextExecutor
	tx bool
}

type wmRows struct{ wmsql.Rows }

func (r wmRows) Close() { _ = r.Rows.Close() }

func (r wmRows) Err() error {
	if e, ok := r.Rows.(interface{ Err() error }); ok {
		return e.Err()
	}
	return nil
}

func (e wmExecer) query(ctx context.Context, q string, args ...any) (rows, error) {
	r, err := e.d.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	return wmRows{r}, nil
}

func (e wmExecer) exec(ctx context.Context, q string, args ...any) (int64, error) {
	res, err := e.d.ExecContext(ctx, q, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

func (e wmExecer) inTx() bool { return e.tx }

func (e wmExecer) oneShot(args []any) []any { return args }
