package outbox

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"reflect"

	"github.com/watermill-outbox/outbox/internal/dialect"

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
// BeginnerFromPgx, BeginnerFromStdSQL, or another implementation).
func newExecer(db any) (execer, error) {
	if inner, ok := watermillSQLInner(db); ok {
		return newExecer(inner)
	}
	switch d := db.(type) {
	case nil:
		return nil, &ConfigError{Field: "db", Reason: "nil database handle", Err: ErrUnsupportedDB}
	case PgxExecutor:
		_, tx := d.(pgx.Tx)
		if _, ok := d.(interface{ Commit() error }); ok {
			tx = true // watermill-sql's TxFromPgx: a pgx.Tx whose Commit and Rollback take no context
		}
		return pgxExecer{d: d, tx: tx}, nil
	case SQLExecutor:
		_, tx := d.(*sql.Tx)
		return dialect.StdSQL{D: d, Tx: tx, Pgx: isPgxStdlib(d)}, nil
	}
	if e, ok := newWMExecer(db); ok {
		return e, nil
	}
	return nil, &ConfigError{Field: "db", Reason: "want pgx.Tx, *pgx.Conn, *pgxpool.Pool, *sql.Tx, *sql.DB, *sql.Conn or a watermill-sql ContextExecutor", Err: ErrUnsupportedDB}
}

// The root package accepts watermill-sql v4 handles without importing watermill-sql, whose
// import links github.com/lib/pq into every program: its adapters are recognised by their type
// and unwrapped (watermillSQLInner), and another implementation of its ContextExecutor is
// called through reflection (wmExecer), since ExecContext and QueryContext return its own
// Result and Rows types, which no interface declared here can name.
const watermillSQLPkg = "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"

// watermillSQLFields names the field holding the wrapped handle of each watermill-sql v4
// adapter that hides its handle's methods: PgxBeginner (BeginnerFromPgx) wraps a pgx pool or
// connection, StdSQLBeginner (BeginnerFromStdSQL) a *sql.DB or *sql.Tx, StdSQLTx
// (TxFromStdSQL) a *sql.Tx. PgxTx (TxFromPgx) runs statements as its pgx.Tx and is used as it is.
var watermillSQLFields = map[string]string{"PgxBeginner": "Conn", "StdSQLBeginner": "SQLBeginner", "StdSQLTx": "Tx"}

// watermillSQLInner returns the handle a watermill-sql v4 adapter (or a pointer to one) wraps
// (nil when the adapter holds none), with ok false for any other db.
func watermillSQLInner(db any) (inner any, ok bool) {
	v := reflect.ValueOf(db)
	if v.Kind() == reflect.Pointer && !v.IsNil() {
		v = v.Elem()
	}
	if v.Kind() != reflect.Struct || v.Type().PkgPath() != watermillSQLPkg {
		return nil, false
	}
	name, ok := watermillSQLFields[v.Type().Name()]
	if !ok {
		return nil, false
	}
	f := v.FieldByName(name)
	if !f.IsValid() {
		return nil, false
	}
	return f.Interface(), true
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

// wmExecer runs statements through a watermill-sql v4 ContextExecutor that is none of its
// adapters, calling its ExecContext and QueryContext by reflection.
type wmExecer struct {
	d           any
	exec, query reflect.Value // the bound methods
	tx          bool
}

// wmResult and wmRowsOf are the method sets of watermill-sql's Result and Rows.
type (
	wmResult interface{ RowsAffected() (int64, error) }
	wmRowsOf interface {
		Scan(dest ...any) error
		Close() error
		Next() bool
	}
)

var (
	ctxType    = reflect.TypeFor[context.Context]()
	stringType = reflect.TypeFor[string]()
	argsType   = reflect.TypeFor[[]any]()
	errorType  = reflect.TypeFor[error]()
)

// newWMExecer adapts db when it has the methods of a watermill-sql ContextExecutor:
// ExecContext and QueryContext taking (context.Context, string, ...any) and returning a Result
// and a Rows with an error. A Commit() error method marks a transaction.
func newWMExecer(db any) (wmExecer, bool) {
	v := reflect.ValueOf(db)
	exec, okExec := contextMethod(v, "ExecContext", reflect.TypeFor[wmResult]())
	query, okQuery := contextMethod(v, "QueryContext", reflect.TypeFor[wmRowsOf]())
	if !okExec || !okQuery {
		return wmExecer{}, false
	}
	_, tx := db.(interface{ Commit() error })
	return wmExecer{d: db, exec: exec, query: query, tx: tx}, true
}

// contextMethod returns v's method name when its signature is func(context.Context, string,
// ...any) (R, error) with R implementing result.
func contextMethod(v reflect.Value, name string, result reflect.Type) (reflect.Value, bool) {
	if !v.IsValid() {
		return reflect.Value{}, false
	}
	m := v.MethodByName(name)
	if !m.IsValid() {
		return reflect.Value{}, false
	}
	t := m.Type()
	ok := t.IsVariadic() && t.NumIn() == 3 && t.In(0) == ctxType && t.In(1) == stringType && t.In(2) == argsType &&
		t.NumOut() == 2 && t.Out(0).Implements(result) && t.Out(1) == errorType
	return m, ok
}

// call runs the bound method m and returns its result, nil when it returned a nil one.
func (e wmExecer) call(m reflect.Value, ctx context.Context, q string, args []any) (any, error) {
	out := m.CallSlice([]reflect.Value{reflect.ValueOf(&ctx).Elem(), reflect.ValueOf(q), reflect.ValueOf(args)})
	err, _ := out[1].Interface().(error)
	return out[0].Interface(), err
}

type wmRows struct{ wmRowsOf }

func (r wmRows) Close() { _ = r.wmRowsOf.Close() }

func (r wmRows) Err() error {
	if e, ok := r.wmRowsOf.(interface{ Err() error }); ok {
		return e.Err()
	}
	return nil
}

func (e wmExecer) Query(ctx context.Context, q string, args ...any) (rows, error) {
	r, err := e.call(e.query, ctx, q, args)
	if err != nil {
		return nil, err
	}
	rs, ok := r.(wmRowsOf)
	if !ok {
		return nil, fmt.Errorf("outbox: %T.QueryContext returned no rows and no error", e.d)
	}
	return wmRows{rs}, nil
}

func (e wmExecer) Exec(ctx context.Context, q string, args ...any) (int64, error) {
	res, err := e.call(e.exec, ctx, q, args)
	if err != nil {
		return 0, err
	}
	r, ok := res.(wmResult)
	if !ok {
		return 0, fmt.Errorf("outbox: %T.ExecContext returned no result and no error", e.d)
	}
	return r.RowsAffected()
}

func (e wmExecer) InTx() bool { return e.tx }

func (e wmExecer) OneShot(args []any) []any { return args }

func (e wmExecer) Handle() any { return e.d }
