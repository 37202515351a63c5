package mariadbtest

import (
	"context"
	"database/sql/driver"
	"regexp"

	"github.com/go-sql-driver/mysql"
)

// dollarConnector opens go-sql-driver/mysql connections whose statements may use PostgreSQL's
// $1, $2 … placeholders (rewritten to ?), so that the behavioural suite's own SQL runs
// unchanged on MariaDB. Only "$" followed by digits is rewritten; each must be used once and in
// order (the suite's queries are written so).
type dollarConnector struct{ driver.Connector }

var dollarRe = regexp.MustCompile(`\$[0-9]+`)

func rewrite(q string) string { return dollarRe.ReplaceAllString(q, "?") }

func (c dollarConnector) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return dollarConn{conn}, nil
}

type dollarConn struct{ driver.Conn }

func (c dollarConn) Prepare(q string) (driver.Stmt, error) { return c.Conn.Prepare(rewrite(q)) }

func (c dollarConn) PrepareContext(ctx context.Context, q string) (driver.Stmt, error) {
	return c.Conn.(driver.ConnPrepareContext).PrepareContext(ctx, rewrite(q))
}

func (c dollarConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	return c.Conn.(driver.ConnBeginTx).BeginTx(ctx, opts)
}

func (c dollarConn) ResetSession(ctx context.Context) error {
	if r, ok := c.Conn.(driver.SessionResetter); ok {
		return r.ResetSession(ctx)
	}
	return nil
}

func (c dollarConn) IsValid() bool {
	if v, ok := c.Conn.(driver.Validator); ok {
		return v.IsValid()
	}
	return true
}

func (c dollarConn) CheckNamedValue(nv *driver.NamedValue) error {
	if ch, ok := c.Conn.(driver.NamedValueChecker); ok {
		return ch.CheckNamedValue(nv)
	}
	return driver.ErrSkip
}

// newDollarConnector returns a connector for dsn (go-sql-driver/mysql form).
func newDollarConnector(dsn string) (driver.Connector, error) {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return nil, err
	}
	c, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, err
	}
	return dollarConnector{c}, nil
}
