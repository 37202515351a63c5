package outbox

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"github.com/watermill-outbox/outbox/internal/dialect"

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
type rows = dialect.Rows

// execer runs statements on one of the supported handles (see dialect.Executor).
type execer = dialect.Executor

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
		return dialect.StdSQL{D: d, Tx: tx, Pgx: isPgxStdlib(d)}, nil
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

func (e pgxExecer) Query(ctx context.Context, q string, args ...any) (rows, error) {
	r, err := e.d.Query(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	return r, nil
}

func (e pgxExecer) Exec(ctx context.Context, q string, args ...any) (int64, error) {
	tag, err := e.d.Exec(ctx, q, args...)
	return tag.RowsAffected(), err
}

func (e pgxExecer) InTx() bool { return e.tx }

func (e pgxExecer) OneShot(args []any) []any { return prependExecMode(args) }

func (e pgxExecer) Handle() any { return e.d }

// isPgxStdlib reports whether d is a *sql.DB or *sql.Conn of the pgx stdlib driver.
func isPgxStdlib(d SQLExecutor) bool {
	if db, ok := d.(interface{ Driver() driver.Driver }); ok {
		_, isPgx := db.Driver().(*stdlib.Driver)
		return isPgx
	}
	return false
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

func (e wmExecer) Query(ctx context.Context, q string, args ...any) (rows, error) {
	r, err := e.d.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	return wmRows{r}, nil
}

func (e wmExecer) Exec(ctx context.Context, q string, args ...any) (int64, error) {
	res, err := e.d.ExecContext(ctx, q, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

func (e wmExecer) InTx() bool { return e.tx }

func (e wmExecer) OneShot(args []any) []any { return args }

func (e wmExecer) Handle() any { return e.d }
