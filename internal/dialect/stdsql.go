package dialect

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// SQLHandle is the part of database/sql a statement runs on: *sql.DB, *sql.Conn, *sql.Tx.
type SQLHandle interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// StdSQL is the Executor of a database/sql handle. Pgx is set for the pgx stdlib driver,
// whose statements take pgx options (OneShot) as arguments.
type StdSQL struct {
	D   SQLHandle
	Tx  bool
	Pgx bool
}

type stdRows struct{ *sql.Rows }

func (r stdRows) Close() { _ = r.Rows.Close() }

// Query implements Executor.
func (e StdSQL) Query(ctx context.Context, q string, args ...any) (Rows, error) {
	r, err := e.D.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	return stdRows{r}, nil
}

// Exec implements Executor.
func (e StdSQL) Exec(ctx context.Context, q string, args ...any) (int64, error) {
	res, err := e.D.ExecContext(ctx, q, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// InTx implements Executor.
func (e StdSQL) InTx() bool { return e.Tx }

// OneShot implements Executor.
func (e StdSQL) OneShot(args []any) []any {
	if e.Pgx {
		return append([]any{pgx.QueryExecModeExec}, args...)
	}
	return args
}

// Handle implements Executor.
func (e StdSQL) Handle() any { return e.D }

// WithTx runs fn in a transaction: ex itself when it is one (or cannot begin one), else a new
// transaction of its *sql.DB or *sql.Conn with opts, committed when fn returns nil and rolled
// back otherwise.
func WithTx(ctx context.Context, ex Executor, opts *sql.TxOptions, fn func(Executor) error) error {
	if ex.InTx() {
		return fn(ex)
	}
	db, ok := ex.Handle().(interface {
		BeginTx(context.Context, *sql.TxOptions) (*sql.Tx, error)
	})
	if !ok {
		return fn(ex)
	}
	tx, err := db.BeginTx(ctx, opts)
	if err != nil {
		return err
	}
	if err := fn(StdSQL{D: tx, Tx: true}); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}

// JSONList encodes vals as a JSON array: the array parameter of dialects without arrays (read
// with json_each or JSON_TABLE).
func JSONList[T any](vals []T) string {
	b, _ := json.Marshal(vals)
	return string(b)
}

// QuoteLiteral renders s as a standard SQL string literal.
func QuoteLiteral(s string) string {
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}

// DoubleQuote quotes an identifier with double quotes (PostgreSQL, SQLite).
func DoubleQuote(parts ...string) string { return pgx.Identifier(parts).Sanitize() }

// Index suffixes of the global and the scoped idempotency index. The names differ so that a
// table migrated from one to the other is recognised by name.
const (
	GlobalKeyIndex = "idempotency_key_idx"
	ScopedKeyIndex = "idempotency_scope_idx"
)

// ScopeMismatch is returned (wrapped) by Migrate when the table's idempotency index does not
// match Table.Scope; Reason names the fix.
type ScopeMismatch struct{ Reason string }

func (e *ScopeMismatch) Error() string { return e.Reason }

// ScopeMismatchReason is the text of a ScopeMismatch: the table has the global index
// (haveGlobal) or a scoped one over haveScoped, and t wants Table.Scope.
func ScopeMismatchReason(quoted string, t *Table, haveGlobal bool, haveScoped []string) string {
	want := append(append([]string(nil), t.Scope...), "idempotency_key")
	fix := "run the statements of outbox.IdempotencyScopeMigrationSQL(cfg) (README, \"Multi-tenant outboxes\"), then Migrate"
	switch {
	case len(t.Scope) > 0 && haveGlobal:
		return fmt.Sprintf("table %s has the global idempotency index %q but SchemaConfig.IdempotencyScope is %v: %s",
			quoted, t.IndexBase+"_"+GlobalKeyIndex, t.Scope, fix)
	case len(t.Scope) > 0:
		return fmt.Sprintf("table %s has the idempotency index %q over %v, want %v: %s",
			quoted, t.IndexBase+"_"+ScopedKeyIndex, haveScoped, want, fix)
	default:
		return fmt.Sprintf("table %s has the scoped idempotency index %q over %v but SchemaConfig.IdempotencyScope is empty: %s",
			quoted, t.IndexBase+"_"+ScopedKeyIndex, haveScoped, fix)
	}
}

// IdempotencyIndexName is the unquoted name of t's idempotency index.
func (t *Table) IdempotencyIndexName() string {
	if len(t.Scope) > 0 {
		return t.IndexBase + "_" + ScopedKeyIndex
	}
	return t.IndexBase + "_" + GlobalKeyIndex
}
