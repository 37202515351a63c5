// Package mysqlurl is MariaDB/MySQL behind a mysql:// or mariadb:// URL (package dburl): the
// URL, the connection and its messages, and the SQL of cmd/outbox's own tables. It registers
// itself on import, and links the outbox's MariaDB/MySQL dialect and go-sql-driver/mysql.
package mysqlurl

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"

	"github.com/go-sql-driver/mysql"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/internal/dialect"
	"github.com/watermill-outbox/outbox/internal/dialect/dburl"
	_ "github.com/watermill-outbox/outbox/mysql" // outbox.DialectMySQL
)

func init() { dburl.Register(outbox.DialectMySQL.String(), parser{}) }

// Form is the accepted MariaDB/MySQL URL form, for messages.
const Form = "mysql://user:password@host:3306/dbname (or mariadb://…) for MariaDB/MySQL"

// MySQL error numbers the connection messages name a fix for.
const (
	erDBAccessDenied = 1044 // ER_DBACCESS_DENIED_ERROR: the user may not use the database
	erAccessDenied   = 1045 // ER_ACCESS_DENIED_ERROR: wrong user or password
	erBadDB          = 1049 // ER_BAD_DB_ERROR: unknown database
	erAccessDeniedNP = 1698 // ER_ACCESS_DENIED_NO_PASSWORD_ERROR: MariaDB's answer for an unknown user, too
)

type parser struct{}

// Parse implements dburl.Parser: a mysql:// or mariadb:// URL (scheme in any case) becomes a
// go-sql-driver/mysql configuration: TCP to host (port 3306 when none is given), the user,
// password and database of the URL, parseTime and interpolateParams on, a connect timeout of
// dburl.ConnectTimeout, and the URL's query parameters passed to the driver as its DSN
// parameters (driver settings such as tls=true or timeout=10s, the rest as session
// variables); a parameter given in the URL wins over these defaults. Errors name the accepted
// form, with the password hidden.
func (parser) Parse(s, _ string) (dburl.URL, bool, error) {
	lower := strings.ToLower(s)
	if !strings.HasPrefix(lower, "mysql://") && !strings.HasPrefix(lower, "mariadb://") {
		return nil, false, nil
	}
	u, err := parse(s)
	if err != nil {
		return nil, true, err
	}
	return u, true, nil
}

func parse(s string) (*URL, error) {
	i := strings.Index(s, "://")
	s = strings.ToLower(s[:i]) + s[i:]
	u, err := url.Parse(s)
	if err != nil {
		return nil, fmt.Errorf("database URL %q is not a valid URL (%s): use %s", dburl.RedactDSN(s), dburl.URLErrText(err), Form)
	}
	shown := u.Redacted()
	bad := func(why string) (*URL, error) {
		return nil, fmt.Errorf("database URL %q %s: use %s", shown, why, Form)
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
		return bad(fmt.Sprintf("has a parameter the MySQL driver refuses (%s)", dburl.OneLine(err.Error())))
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
		cfg.Timeout = dburl.ConnectTimeout
	}
	// The driver's own log (to stderr by default) would break the one-line messages; what it
	// logs, the failed statement also returns.
	cfg.Logger = &mysql.NopLogger{}
	if _, err := mysql.NewConnector(cfg); err != nil { // the driver's checks of the whole configuration
		return bad(fmt.Sprintf("has settings the MySQL driver refuses (%s)", dburl.OneLine(err.Error())))
	}
	return &URL{raw: s, shown: shown, Config: cfg}, nil
}

// URL is a parsed MariaDB/MySQL URL.
type URL struct {
	raw, shown string
	// Config is the driver configuration.
	Config *mysql.Config
}

// Dialect implements dburl.URL.
func (*URL) Dialect() outbox.Dialect { return outbox.DialectMySQL }

// SQL implements dburl.URL.
func (*URL) SQL() dialect.Dialect { return dialect.Registered(outbox.DialectMySQL.String()) }

// Raw implements dburl.URL.
func (u *URL) Raw() string { return u.raw }

// Shown implements dburl.URL.
func (u *URL) Shown() string { return u.shown }

// HostPort implements dburl.URL.
func (u *URL) HostPort() string { return u.Config.Addr }

// File implements dburl.URL: "" (a server).
func (*URL) File() string { return "" }

// Where implements dburl.URL.
func (u *URL) Where() string {
	return fmt.Sprintf("MariaDB/MySQL at %s/%s", u.Config.Addr, u.Config.DBName)
}

// DropCommand implements dburl.URL: the mysql command-line client, which asks for the
// password (--password) rather than showing it.
func (u *URL) DropCommand(tables []string) string {
	return u.ClientCommand("DROP TABLE " + strings.Join(tables, ", "))
}

// ClientCommand is the mysql command-line client's invocation that runs stmt on u's
// database; it asks for the password (--password) rather than showing it.
func (u *URL) ClientCommand(stmt string) string {
	host, port, _ := net.SplitHostPort(u.Config.Addr)
	args := []string{"mysql", "--host=" + dburl.ShellQuote(host), "--port=" + port, "--user=" + dburl.ShellQuote(u.Config.User)}
	if u.Config.Passwd != "" {
		args = append(args, "--password")
	}
	return strings.Join(append(args, dburl.ShellQuote(u.Config.DBName), "-e", dburl.ShellQuote(stmt)), " ")
}

// Open implements dburl.URL.
func (u *URL) Open(ctx context.Context, _ dburl.OpenOptions) (dburl.DB, error) {
	conn, err := mysql.NewConnector(u.Config)
	if err != nil {
		return nil, u.connectError(err)
	}
	db := sql.OpenDB(conn)
	pctx, cancel := context.WithTimeout(ctx, 2*dburl.ConnectTimeout)
	defer cancel()
	if err := db.PingContext(pctx); err != nil {
		_ = db.Close()
		return nil, u.connectError(err)
	}
	return &DB{SQLDB: dburl.SQLDB{DB: db}}, nil
}

// connectError turns a connection failure into a one-line message with the fix.
func (u *URL) connectError(err error) error {
	where := u.Config.Addr
	var myErr *mysql.MySQLError
	if !errors.As(err, &myErr) {
		return dburl.Unreachable("MariaDB/MySQL", where, err.Error(), u.shown, err)
	}
	if why, ok := refusals[myErr.Number]; ok {
		return why(u, where, myErr)
	}
	return fmt.Errorf("MariaDB/MySQL at %s refused the connection (%s, error %d): check the user, password and database name in --db %s", where, myErr.Message, myErr.Number, u.shown)
}

// refusals are the messages of the refusals that name a fix, by error number.
var refusals = map[uint16]func(u *URL, where string, e *mysql.MySQLError) error{
	erAccessDenied:   loginRefused,
	erAccessDeniedNP: loginRefused,
	erDBAccessDenied: func(u *URL, where string, e *mysql.MySQLError) error {
		return fmt.Errorf("MariaDB/MySQL at %s refused database %q to the user (%s, error %d): grant the user access to it, or name another database in --db %s", where, u.Config.DBName, e.Message, e.Number, u.shown)
	},
	erBadDB: func(u *URL, where string, _ *mysql.MySQLError) error {
		return fmt.Errorf("database %q does not exist on MariaDB/MySQL at %s: create it with `CREATE DATABASE %s`, or name another one in --db %s", u.Config.DBName, where, Ident(u.Config.DBName), u.shown)
	},
}

func loginRefused(u *URL, where string, e *mysql.MySQLError) error {
	return fmt.Errorf("MariaDB/MySQL at %s refused the login (%s, error %d): check the user and password in --db %s", where, e.Message, e.Number, u.shown)
}

// Ident is name as a MySQL identifier in a message's statement: bare when it is letters,
// digits, '_' and '$' and not a number, else between backticks (one inside doubled).
func Ident(name string) string {
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
