package outbox

import (
	"database/sql"
	"testing"

	wmsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TestWatermillSQLInner: the root package, which does not import watermill-sql, finds the
// handle inside each of its v4 adapters that hides its handle's methods, and nothing inside
// anything else.
func TestWatermillSQLInner(t *testing.T) {
	pool, db, conn, tx := &pgxpool.Pool{}, &sql.DB{}, &sql.Conn{}, &sql.Tx{}
	pgxBeginner := wmsql.BeginnerFromPgx(pool).(wmsql.PgxBeginner)
	for _, c := range []struct {
		name   string
		handle any
		inner  any
		ok     bool
	}{
		{"BeginnerFromPgx", pgxBeginner, pool, true},
		{"*PgxBeginner", &pgxBeginner, pool, true},
		{"BeginnerFromStdSQL(*sql.DB)", wmsql.BeginnerFromStdSQL(db), db, true},
		{"BeginnerFromStdSQL(*sql.Conn)", wmsql.BeginnerFromStdSQL(conn), conn, true},
		{"TxFromStdSQL", wmsql.TxFromStdSQL(tx), tx, true},
		{"StdSQLTx without a Tx", &wmsql.StdSQLTx{}, (*sql.Tx)(nil), true},
		{"TxFromPgx", wmsql.TxFromPgx(nil), nil, false},
		{"*pgxpool.Pool", pool, nil, false},
		{"*sql.DB", db, nil, false},
		{"nil", nil, nil, false},
		{"nil *StdSQLTx", (*wmsql.StdSQLTx)(nil), nil, false},
	} {
		inner, ok := watermillSQLInner(c.handle)
		if inner != c.inner || ok != c.ok {
			t.Errorf("%s: watermillSQLInner = %T(%p), %v; want %T(%p), %v", c.name, inner, inner, ok, c.inner, c.inner, c.ok)
		}
	}
}
