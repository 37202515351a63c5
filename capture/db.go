package capture

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/watermill-outbox/outbox"
)

// conn runs the statements of one Install, SQL or Uninstall inside one transaction.
type conn interface {
	query(ctx context.Context, q string, args ...any) (rowScanner, error)
	exec(ctx context.Context, q string) error
}

type rowScanner interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
	Close()
}

type pgxConn struct{ tx pgx.Tx }

func (c pgxConn) query(ctx context.Context, q string, args ...any) (rowScanner, error) {
	return c.tx.Query(ctx, q, args...)
}

func (c pgxConn) exec(ctx context.Context, q string) error {
	_, err := c.tx.Exec(ctx, q)
	return err
}

type sqlConn struct{ tx *sql.Tx }

type sqlRows struct{ *sql.Rows }

func (r sqlRows) Close() { _ = r.Rows.Close() }

func (c sqlConn) query(ctx context.Context, q string, args ...any) (rowScanner, error) {
	r, err := c.tx.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	return sqlRows{r}, nil
}

func (c sqlConn) exec(ctx context.Context, q string) error {
	_, err := c.tx.ExecContext(ctx, q)
	return err
}

// inTx runs fn in a transaction on db: the caller's when db is one (pgx.Tx, *sql.Tx; then
// the caller commits), else a new one committed when fn returns nil and rolled back otherwise.
func inTx(ctx context.Context, db any, fn func(conn) error) error {
	switch d := db.(type) {
	case nil:
		return &outbox.ConfigError{Field: "db", Reason: "nil database handle", Err: outbox.ErrUnsupportedDB}
	case pgx.Tx:
		return fn(pgxConn{d})
	case interface {
		Begin(context.Context) (pgx.Tx, error)
	}:
		tx, err := d.Begin(ctx)
		if err != nil {
			return fmt.Errorf("capture: begin: %w", err)
		}
		if err := fn(pgxConn{tx}); err != nil {
			return errors.Join(err, ignoreClosed(tx.Rollback(context.WithoutCancel(ctx))))
		}
		return tx.Commit(ctx)
	case *sql.Tx:
		return fn(sqlConn{d})
	case interface {
		BeginTx(context.Context, *sql.TxOptions) (*sql.Tx, error)
	}:
		tx, err := d.BeginTx(ctx, nil)
		if err != nil {
			return fmt.Errorf("capture: begin: %w", err)
		}
		if err := fn(sqlConn{tx}); err != nil {
			_ = tx.Rollback()
			return err
		}
		return tx.Commit()
	}
	return &outbox.ConfigError{Field: "db", Reason: fmt.Sprintf("%T: want pgx.Tx, *pgx.Conn, *pgxpool.Pool, *sql.DB, *sql.Conn or *sql.Tx", db), Err: outbox.ErrUnsupportedDB}
}

func ignoreClosed(err error) error {
	if errors.Is(err, pgx.ErrTxClosed) {
		return nil
	}
	return err
}

// queryStrings runs q and returns the first column of every row.
func queryStrings(ctx context.Context, c conn, q string, args ...any) ([]string, error) {
	rs, err := c.query(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rs.Close()
	var out []string
	for rs.Next() {
		var s string
		if err := rs.Scan(&s); err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, rs.Err()
}

func isTx(db any) bool {
	switch db.(type) {
	case pgx.Tx, *sql.Tx:
		return true
	}
	return false
}
