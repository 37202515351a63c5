package inbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/internal/dialect"
)

// PgxBeginner begins pgx transactions: *pgxpool.Pool and *pgx.Conn satisfy it.
type PgxBeginner interface {
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
}

// DB is the database an Inbox runs its transactions on, with the transaction type T that the
// handler receives: pgx.Tx (FromPgx) or *sql.Tx (FromSQL). Build it with those functions; the
// zero value is invalid.
type DB[T any] struct {
	// start begins a transaction and runs the inbox INSERT in it, returning its row count.
	start  func(ctx context.Context, insert string, args []any) (T, int64, error)
	commit func(ctx context.Context, tx T) error
	abort  func(ctx context.Context, tx T) error
	handle any
	// driver is the name of the dialect the handle's driver speaks ("postgresql", "sqlite";
	// see outbox.Dialect.String), "" when unknown.
	driver string
}

// FromPgx returns the DB of a pgx pool or connection (PostgreSQL); every message is processed
// in a transaction begun with opts (the zero value: the server's default isolation, READ
// COMMITTED unless configured otherwise). The handler receives the pgx.Tx.
//
// With a *pgxpool.Pool or *pgx.Conn, BEGIN and the inbox INSERT go to the server in one
// pipelined round trip, and the handler's pgx.Tx is the package's own implementation on the
// transaction's connection (Begin makes savepoints; like pgx's own, it refuses every statement
// with pgx.ErrTxClosed once it has ended, opts.CommitQuery included in its Commit). A
// *pgx.Conn runs one transaction at a time, so messages take turns on it (concurrent handlers
// wait for the one in progress; the connection must not be used by anything else meanwhile, or
// a message fails with an error naming the connection's transaction status). Any other
// PgxBeginner gets pgx's own transaction and one more round trip per message.
func FromPgx(db PgxBeginner, opts pgx.TxOptions) DB[pgx.Tx] {
	begin := beginSQL(opts)
	d := DB[pgx.Tx]{
		commit: func(ctx context.Context, tx pgx.Tx) error { return tx.Commit(ctx) },
		abort:  func(ctx context.Context, tx pgx.Tx) error { return tx.Rollback(ctx) },
		handle: db,
		driver: outbox.DialectPostgreSQL.String(),
	}
	switch h := db.(type) {
	case *pgxpool.Pool:
		d.start = func(ctx context.Context, insert string, args []any) (pgx.Tx, int64, error) {
			c, err := h.Acquire(ctx)
			if err != nil {
				return nil, 0, err
			}
			return beginRecord(ctx, c.Conn(), c.Release, begin, opts.CommitQuery, insert, args)
		}
	case *pgx.Conn:
		// A *pgx.Conn runs one transaction at a time: messages take turns on it.
		turn := make(chan struct{}, 1)
		d.start = func(ctx context.Context, insert string, args []any) (pgx.Tx, int64, error) {
			select {
			case turn <- struct{}{}:
			case <-ctx.Done():
				return nil, 0, ctx.Err()
			}
			return beginRecord(ctx, h, func() { <-turn }, begin, opts.CommitQuery, insert, args)
		}
	default:
		d.start = func(ctx context.Context, insert string, args []any) (pgx.Tx, int64, error) {
			tx, err := db.BeginTx(ctx, opts)
			if err != nil {
				return nil, 0, err
			}
			n, err := pgxExecer{tx}.exec(ctx, insert, args...)
			if err != nil {
				_ = tx.Rollback(context.WithoutCancel(ctx))
				return nil, 0, err
			}
			return tx, n, nil
		}
	}
	return d
}

// FromSQL returns the DB of a database/sql handle: PostgreSQL through the pgx stdlib driver
// ("pgx"), or SQLite through a pure-Go driver (modernc.org/sqlite, opened with
// outbox.SQLiteDSN). Every message is processed in a transaction begun with opts (nil: the
// driver's default). The handler receives the *sql.Tx.
func FromSQL(db *sql.DB, opts *sql.TxOptions) DB[*sql.Tx] {
	d := DB[*sql.Tx]{
		start: func(ctx context.Context, insert string, args []any) (*sql.Tx, int64, error) {
			// database/sql ends a transaction when its BeginTx context is cancelled, even
			// during COMMIT (whose outcome is then unknown): the inbox ends its transactions
			// itself, so they do not follow the message's context (statements still do).
			tx, err := db.BeginTx(context.WithoutCancel(ctx), opts)
			if err != nil {
				return nil, 0, err
			}
			n, err := sqlExecer{tx}.exec(ctx, insert, args...)
			if err != nil {
				_ = tx.Rollback()
				return nil, 0, err
			}
			return tx, n, nil
		},
		commit: func(_ context.Context, tx *sql.Tx) error { return tx.Commit() },
		abort:  func(_ context.Context, tx *sql.Tx) error { return tx.Rollback() },
		handle: db,
	}
	if db != nil {
		d.driver, _ = dialect.DriverDialect(db.Driver())
	}
	return d
}

// rows is what the package reads query results through.
type rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
	Close()
}

// execer runs statements on a pgx or database/sql handle or transaction.
type execer interface {
	exec(ctx context.Context, q string, args ...any) (int64, error)
	query(ctx context.Context, q string, args ...any) (rows, error)
	// script runs a parameterless multi-statement script in one round trip.
	script(ctx context.Context, q string) (int64, error)
}

// pgxHandle is the part of pgx the package uses: pgx.Tx, *pgx.Conn and *pgxpool.Pool.
type pgxHandle interface {
	Exec(ctx context.Context, sql string, arguments ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// sqlHandle is the part of database/sql the package uses: *sql.DB, *sql.Tx and *sql.Conn.
type sqlHandle interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// newExecer adapts a handle of the operations (Migrate, Cleanup, Count, Status) for dialect d:
// a *pgxpool.Pool, *pgx.Conn or pgx.Tx, or a *sql.DB, *sql.Tx or *sql.Conn. Errors: an
// *outbox.ConfigError wrapping outbox.ErrUnsupportedDB.
func newExecer(db any, d outbox.Dialect) (execer, error) {
	switch h := db.(type) {
	case nil:
		return nil, &outbox.ConfigError{Field: "db", Reason: "nil database handle", Err: outbox.ErrUnsupportedDB}
	case pgxHandle:
		if dd, ok := dialects[d]; ok && dd.pgxRefusal() != "" {
			return nil, &outbox.ConfigError{Field: "db", Reason: dd.pgxRefusal(), Err: outbox.ErrUnsupportedDB}
		}
		return pgxExecer{h}, nil
	case sqlHandle:
		if sdb, ok := h.(*sql.DB); ok {
			if got, ok := dialect.DriverDialect(sdb.Driver()); ok && got != d.String() {
				return nil, &outbox.ConfigError{Field: "inbox.SchemaConfig.Dialect", Reason: fmt.Sprintf("the *sql.DB's driver is %s but the dialect is %s", got, d), Err: outbox.ErrUnsupportedDB}
			}
		}
		return sqlExecer{h}, nil
	}
	return nil, &outbox.ConfigError{Field: "db", Reason: fmt.Sprintf("%T: want *pgxpool.Pool, *pgx.Conn, pgx.Tx, *sql.DB, *sql.Tx or *sql.Conn", db), Err: outbox.ErrUnsupportedDB}
}

type pgxExecer struct{ d pgxHandle }

func (e pgxExecer) exec(ctx context.Context, q string, args ...any) (int64, error) {
	tag, err := e.d.Exec(ctx, q, args...)
	return tag.RowsAffected(), err
}

func (e pgxExecer) query(ctx context.Context, q string, args ...any) (rows, error) {
	r, err := e.d.Query(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	return r, nil
}

func (e pgxExecer) script(ctx context.Context, q string) (int64, error) {
	tag, err := e.d.Exec(ctx, q, pgx.QueryExecModeSimpleProtocol)
	return tag.RowsAffected(), err
}

type sqlExecer struct{ d sqlHandle }

func (e sqlExecer) exec(ctx context.Context, q string, args ...any) (int64, error) {
	res, err := e.d.ExecContext(ctx, q, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
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

func (e sqlExecer) script(ctx context.Context, q string) (int64, error) { return e.exec(ctx, q) }

// isTxDone reports whether a rollback failed only because the transaction had ended already
// (the driver ended it after a failed commit).
func isTxDone(err error) bool {
	return errors.Is(err, sql.ErrTxDone) || errors.Is(err, pgx.ErrTxClosed)
}
