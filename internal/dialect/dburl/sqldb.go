package dburl

import (
	"context"
	"database/sql"
	"errors"
	"strconv"
	"strings"
)

// SQLDB is the part of DB that every database/sql database shares: embed it.
type SQLDB struct{ DB *sql.DB }

// Handle returns the *sql.DB.
func (d SQLDB) Handle() any { return d.DB }

// NewHandle returns the same *sql.DB (its pool serves both) and a no-op closer.
func (d SQLDB) NewHandle(context.Context) (any, func(), error) { return d.DB, func() {}, nil }

// Close closes the *sql.DB.
func (d SQLDB) Close() { _ = d.DB.Close() }

// Exec runs one statement.
func (d SQLDB) Exec(ctx context.Context, query string, args ...any) error {
	_, err := d.DB.ExecContext(ctx, query, args...)
	return err
}

// Strings runs query and returns its single text column.
func (d SQLDB) Strings(ctx context.Context, query string, args ...any) ([]string, error) {
	rs, err := d.DB.QueryContext(ctx, query, args...)
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

// Int runs query and returns its single integer.
func (d SQLDB) Int(ctx context.Context, query string, args ...any) (int64, error) {
	var n int64
	err := d.DB.QueryRowContext(ctx, query, args...).Scan(&n)
	return n, err
}

// InTx runs fn in a database/sql transaction (see DB.InTx).
func (d SQLDB) InTx(ctx context.Context, fn func(tx any, exec Exec) error) error {
	tx, err := d.DB.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := fn(tx, func(q string, args ...any) error {
		_, err := tx.ExecContext(ctx, q, args...)
		return err
	}); err != nil {
		return errors.Join(err, ignoreDone(tx.Rollback()))
	}
	return tx.Commit()
}

// ignoreDone drops sql.ErrTxDone (a rollback after the driver already ended the transaction).
func ignoreDone(err error) error {
	if errors.Is(err, sql.ErrTxDone) {
		return nil
	}
	return err
}

// LeasedSeqs reads a raw bench loop's leased rows (sequence, id, topic, payload, headers, as
// a relay would) and returns their sequences. pgx.Rows and *sql.Rows both qualify.
func LeasedSeqs(rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
}) ([]int64, error) {
	var seqs []int64
	for rows.Next() {
		var seq int64
		var id, topic, payload, headers string
		if err := rows.Scan(&seq, &id, &topic, &payload, &headers); err != nil {
			return nil, err
		}
		seqs = append(seqs, seq)
	}
	return seqs, rows.Err()
}

// LeasedSQL is LeasedSeqs of database/sql rows (or the error of the query that returned
// them), which it closes.
func LeasedSQL(rows *sql.Rows, err error) ([]int64, error) {
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	return LeasedSeqs(rows)
}

// SeqList is seqs as an SQL list of integer literals ("1,2,3").
func SeqList(seqs []int64) string {
	list := make([]string, len(seqs))
	for i, s := range seqs {
		list[i] = strconv.FormatInt(s, 10)
	}
	return strings.Join(list, ",")
}

// HoldSQLSnapshot is Bench.HoldSnapshot on a connection of db: the begin statements, a read
// of the quoted table, then idle until release.
func HoldSQLSnapshot(ctx context.Context, db *sql.DB, _, quoted string, begin ...string) (func(), error) {
	conn, err := db.Conn(ctx)
	if err != nil {
		return nil, err
	}
	for _, st := range begin {
		if _, err := conn.ExecContext(ctx, st); err != nil {
			_ = conn.Close()
			return nil, err
		}
	}
	var n int
	if err := conn.QueryRowContext(ctx, `SELECT count(*) FROM `+quoted).Scan(&n); err != nil {
		_, _ = conn.ExecContext(context.Background(), `ROLLBACK`)
		_ = conn.Close()
		return nil, err
	}
	return func() { _, _ = conn.ExecContext(context.Background(), `ROLLBACK`); _ = conn.Close() }, nil
}
