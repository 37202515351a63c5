package main

// MariaDB/MySQL behind --db mysql://… or mariadb://…: the URL, the connection and its errors.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"

	"github.com/go-sql-driver/mysql"
)

// mysqlForm is the accepted MariaDB/MySQL --db form, for messages.
const mysqlForm = "mysql://user:password@host:3306/dbname (or mariadb://…) for MariaDB/MySQL"

// MySQL error numbers the connection messages name a fix for.
const (
	erDBAccessDenied = 1044 // ER_DBACCESS_DENIED_ERROR: the user may not use the database
	erAccessDenied   = 1045 // ER_ACCESS_DENIED_ERROR: wrong user or password
	erBadDB          = 1049 // ER_BAD_DB_ERROR: unknown database
	erAccessDeniedNP = 1698 // ER_ACCESS_DENIED_NO_PASSWORD_ERROR: MariaDB's answer for an unknown user, too
)

// mysqlURL parses a mysql:// or mariadb:// --db value (s, scheme in any case) into a
// go-sql-driver/mysql configuration: TCP to host (port 3306 when none is given), the user,
// password and database of the URL, parseTime and interpolateParams on, a connect timeout of
// connectTimeout, and the URL's query parameters passed to the driver as its DSN parameters
// (driver settings such as tls=true or timeout=10s, the rest as session variables); a parameter
// given in the URL wins over these defaults. Errors are usage errors naming the accepted form,
// with the password hidden.
func mysqlURL(s string) (dbURL, error) {
	i := strings.Index(s, "://")
	s = strings.ToLower(s[:i]) + s[i:]
	u, err := url.Parse(s)
	if err != nil {
		return dbURL{}, &usageError{fmt.Errorf("database URL %q is not a valid URL (%s): use %s", redactDSN(s), urlErrText(err), mysqlForm)}
	}
	shown := u.Redacted()
	bad := func(why string) (dbURL, error) {
		return dbURL{}, &usageError{fmt.Errorf("database URL %q %s: use %s", shown, why, mysqlForm)}
	}
	dbName := strings.TrimPrefix(u.Path, "/")
	switch {
	case u.Hostname() == "":
		return bad("names no host")
	case u.User == nil || u.User.Username() == "":
		return bad("names no user")
	case dbName == "":
		return bad("names no database")
	case strings.Contains(dbName, "/"):
		return bad(fmt.Sprintf("has a path %q that is not one database name", u.Path))
	}
	query, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return bad(fmt.Sprintf("has a query that does not parse (%v)", err))
	}
	port := u.Port()
	if port == "" {
		port = "3306"
	}
	addr := net.JoinHostPort(u.Hostname(), port)
	// The driver reads its own parameters (re-encoded, so that no '/' of a value is taken for
	// the DSN's database separator) and keeps the others as session variables.
	cfg, err := mysql.ParseDSN("tcp(" + addr + ")/?" + query.Encode())
	if err != nil {
		return bad(fmt.Sprintf("has a parameter the MySQL driver refuses (%s)", oneLine(err.Error())))
	}
	cfg.User = u.User.Username()
	cfg.Passwd, _ = u.User.Password()
	cfg.DBName = dbName
	if !query.Has("parseTime") {
		cfg.ParseTime = true
	}
	if !query.Has("interpolateParams") {
		cfg.InterpolateParams = true // one round trip per statement instead of prepare, execute, close
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = connectTimeout
	}
	// The driver's own log (to stderr by default) would break the one-line messages; what it
	// logs, the failed statement also returns.
	cfg.Logger = &mysql.NopLogger{}
	if _, err := mysql.NewConnector(cfg); err != nil { // the driver's checks of the whole configuration
		return bad(fmt.Sprintf("has settings the MySQL driver refuses (%s)", oneLine(err.Error())))
	}
	return dbURL{raw: s, shown: shown, kind: kindMySQL, my: cfg}, nil
}

// openMySQL opens u's *sql.DB and checks that a connection works.
func (d *database) openMySQL(ctx context.Context) error {
	conn, err := mysql.NewConnector(d.url.my)
	if err != nil {
		return d.mysqlConnectError(err)
	}
	db := sql.OpenDB(conn)
	pctx, cancel := context.WithTimeout(ctx, 2*connectTimeout)
	defer cancel()
	if err := db.PingContext(pctx); err != nil {
		_ = db.Close()
		return d.mysqlConnectError(err)
	}
	d.sqlDB = db
	return nil
}

// mysqlConnectError turns a MariaDB/MySQL connection failure into a one-line message with the
// fix.
func (d *database) mysqlConnectError(err error) error {
	where := d.url.my.Addr
	var myErr *mysql.MySQLError
	if errors.As(err, &myErr) {
		switch myErr.Number {
		case erAccessDenied, erAccessDeniedNP:
			return fmt.Errorf("MariaDB/MySQL at %s refused the login (%s, error %d): check the user and password in --db %s", where, myErr.Message, myErr.Number, d.url.shown)
		case erDBAccessDenied:
			return fmt.Errorf("MariaDB/MySQL at %s refused database %q to the user (%s, error %d): grant the user access to it, or name another database in --db %s", where, d.url.my.DBName, myErr.Message, myErr.Number, d.url.shown)
		case erBadDB:
			return fmt.Errorf("database %q does not exist on MariaDB/MySQL at %s: create it with `CREATE DATABASE %s`, or name another one in --db %s", d.url.my.DBName, where, mysqlIdent(d.url.my.DBName), d.url.shown)
		}
		return fmt.Errorf("MariaDB/MySQL at %s refused the connection (%s, error %d): check the user, password and database name in --db %s", where, myErr.Message, myErr.Number, d.url.shown)
	}
	return d.unreachable("MariaDB/MySQL", where, err.Error(), err)
}

// mysqlIdent is name as a MySQL identifier in a message's statement: bare when it is letters,
// digits, '_' and '$' and not a number, else between backticks (one inside doubled).
func mysqlIdent(name string) string {
	bare, digits := name != "", true
	for _, r := range name {
		letter := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r == '_' || r == '$'
		digit := r >= '0' && r <= '9'
		bare, digits = bare && (letter || digit), digits && digit
	}
	if bare && !digits {
		return name
	}
	return "`" + strings.ReplaceAll(name, "`", "``") + "`"
}

// mysqlDatabaseExists reports whether database name exists on d's server.
func (d *database) mysqlDatabaseExists(ctx context.Context, name string) (bool, error) {
	var n int
	err := d.sqlDB.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = ?", name).Scan(&n)
	return n > 0, err
}

// mysqlClientCommand is the mysql command-line client's invocation that runs stmt on u's
// database, for the lines the demo prints; it asks for the password (--password) rather than
// showing it.
func mysqlClientCommand(u dbURL, stmt string) string {
	host, port, _ := net.SplitHostPort(u.my.Addr)
	args := []string{"mysql", "--host=" + shellQuote(host), "--port=" + port, "--user=" + shellQuote(u.my.User)}
	if u.my.Passwd != "" {
		args = append(args, "--password")
	}
	return strings.Join(append(args, shellQuote(u.my.DBName), "-e", shellQuote(stmt)), " ")
}

// refuseMySQL returns the usage error of command, which works on PostgreSQL and SQLite only,
// when u is a MariaDB/MySQL database (why: what it lacks there), and nil otherwise.
func refuseMySQL(u dbURL, command, why string) error {
	if u.kind != kindMySQL {
		return nil
	}
	return &usageError{fmt.Errorf("%s supports PostgreSQL and SQLite only (%s), not MariaDB/MySQL (--db %s): give a postgres:// URL or an SQLite file", command, why, u.shown)}
}
