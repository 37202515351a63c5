// Package pgurl is PostgreSQL behind a postgres:// or postgresql:// URL (package dburl): the
// URL, the connection and its messages, and the SQL of cmd/outbox's own tables. It registers
// itself on import.
package pgurl

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/internal/dialect"
	"github.com/watermill-outbox/outbox/internal/dialect/dburl"
	"github.com/watermill-outbox/outbox/internal/dialect/postgres"
)

func init() { dburl.Register(postgres.Dialect{}.Name(), parser{}) }

type parser struct{}

// Parse implements dburl.Parser: postgres:// and postgresql:// (scheme in any case), parsed by
// pgxpool, with a connect timeout of dburl.ConnectTimeout unless the URL sets one.
func (parser) Parse(s, forms string) (dburl.URL, bool, error) {
	lower := strings.ToLower(s)
	if !strings.HasPrefix(lower, "postgres://") && !strings.HasPrefix(lower, "postgresql://") {
		return nil, false, nil
	}
	i := strings.Index(s, "://")
	s = lower[:i] + s[i:] // pgx accepts the scheme in lower case only
	shown := s
	if u, err := url.Parse(s); err == nil {
		shown = redactURL(u)
	} else {
		return nil, true, fmt.Errorf("database URL %q is not a valid URL (%s): use %s", dburl.RedactDSN(s), dburl.URLErrText(err), forms)
	}
	cfg, err := pgxpool.ParseConfig(s)
	if err != nil {
		return nil, true, fmt.Errorf("database URL %q is not a valid PostgreSQL URL (%s): use %s", shown, dburl.OneLine(errText(err)), forms)
	}
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = dburl.ConnectTimeout
	}
	return &URL{raw: s, shown: shown, Config: cfg}, true, nil
}

// URL is a parsed PostgreSQL URL.
type URL struct {
	raw, shown string
	// Config is the pool configuration.
	Config *pgxpool.Config
}

// Dialect implements dburl.URL.
func (*URL) Dialect() outbox.Dialect { return outbox.DialectPostgreSQL }

// SQL implements dburl.URL.
func (*URL) SQL() dialect.Dialect { return postgres.Dialect{} }

// Raw implements dburl.URL.
func (u *URL) Raw() string { return u.raw }

// Shown implements dburl.URL.
func (u *URL) Shown() string { return u.shown }

// File implements dburl.URL: "" (a server).
func (*URL) File() string { return "" }

// HostPort implements dburl.URL.
func (u *URL) HostPort() string {
	c := u.Config.ConnConfig
	return net.JoinHostPort(c.Host, strconv.Itoa(int(c.Port)))
}

// Where implements dburl.URL.
func (u *URL) Where() string {
	return fmt.Sprintf("PostgreSQL at %s/%s", u.HostPort(), u.Config.ConnConfig.Database)
}

// DropCommand implements dburl.URL: psql.
func (u *URL) DropCommand(tables []string) string {
	return fmt.Sprintf("psql %s -c %s", dburl.ShellQuote(u.shown), dburl.ShellQuote("DROP TABLE "+strings.Join(tables, ", ")))
}

// Open implements dburl.URL.
func (u *URL) Open(ctx context.Context, o dburl.OpenOptions) (dburl.DB, error) {
	cfg := u.Config
	if o.ApplicationName != "" {
		cfg = u.Config.Copy()
		cfg.ConnConfig.RuntimeParams["application_name"] = o.ApplicationName
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, u.connectError(err)
	}
	pctx, cancel := context.WithTimeout(ctx, 2*dburl.ConnectTimeout)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		return nil, u.connectError(err)
	}
	return &DB{url: u, Pool: pool}, nil
}

// connectError turns a connection failure into a one-line message with the fix.
func (u *URL) connectError(err error) error {
	where := u.HostPort()
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return &dburl.ConnectFailure{Err: fmt.Errorf("PostgreSQL at %s refused the connection (%s, SQLSTATE %s): check the user, password and database name in --db %s", where, pgErr.Message, pgErr.Code, u.shown)}
	}
	return dburl.Unreachable("PostgreSQL", where, errText(err), u.shown, err)
}

// redactURL is u as url.URL.Redacted shows it, with a password query parameter (pgx reads
// ?password=) hidden too.
func redactURL(u *url.URL) string {
	q := u.Query()
	if !q.Has("password") {
		return u.Redacted()
	}
	q.Set("password", "xxxxx")
	c := *u
	c.RawQuery = q.Encode()
	return c.Redacted()
}

// errText is err's text without pgx's connection-string prefix, which can carry the password.
func errText(err error) string {
	s := err.Error()
	if i := strings.Index(s, "cannot parse `"); i >= 0 {
		if j := strings.Index(s[i+len("cannot parse `"):], "`: "); j >= 0 {
			return s[:i] + "cannot parse the URL: " + s[i+len("cannot parse `")+j+3:]
		}
	}
	return s
}

// DB is an open PostgreSQL database.
type DB struct {
	url *URL
	// Pool is the connection pool.
	Pool *pgxpool.Pool
}

// Handle implements dburl.DB.
func (d *DB) Handle() any { return d.Pool }

// NewHandle implements dburl.DB: a pool of its own.
func (d *DB) NewHandle(ctx context.Context) (any, func(), error) {
	pool, err := pgxpool.NewWithConfig(ctx, d.url.Config.Copy())
	if err != nil {
		return nil, nil, err
	}
	return pool, pool.Close, nil
}

// Close implements dburl.DB.
func (d *DB) Close() { d.Pool.Close() }

// Exec implements dburl.DB.
func (d *DB) Exec(ctx context.Context, query string, args ...any) error {
	_, err := d.Pool.Exec(ctx, query, args...)
	return err
}

// Strings implements dburl.DB.
func (d *DB) Strings(ctx context.Context, query string, args ...any) ([]string, error) {
	rs, err := d.Pool.Query(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rs, pgx.RowTo[string])
}

// Int implements dburl.DB.
func (d *DB) Int(ctx context.Context, query string, args ...any) (int64, error) {
	var n int64
	err := d.Pool.QueryRow(ctx, query, args...).Scan(&n)
	return n, err
}

// InTx implements dburl.DB.
func (d *DB) InTx(ctx context.Context, fn func(tx any, exec dburl.Exec) error) error {
	return pgx.BeginFunc(ctx, d.Pool, func(tx pgx.Tx) error {
		return fn(tx, func(q string, args ...any) error {
			_, err := tx.Exec(ctx, q, args...)
			return err
		})
	})
}

// SchemaExists implements dburl.DB.
func (d *DB) SchemaExists(ctx context.Context, name string) (bool, error) {
	var oid *uint32
	// The outbox quotes the table's parts, so the schema name is case-sensitive: quote it too.
	if err := d.Pool.QueryRow(ctx, "SELECT to_regnamespace($1)::oid", pgx.Identifier{name}.Sanitize()).Scan(&oid); err != nil {
		return false, err
	}
	return oid != nil, nil
}

// CreateSchema implements dburl.DB.
func (*DB) CreateSchema(name string) (word, stmt string) {
	return "schema", "CREATE SCHEMA " + sqlIdent(name)
}

// SchemaGone implements dburl.DB: invalid_schema_name.
func (*DB) SchemaGone(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "3F000"
}

// sqlIdent is name as an SQL identifier: bare when PostgreSQL would not fold or reject it,
// double-quoted otherwise.
func sqlIdent(name string) string {
	bare := name != ""
	for i, r := range name {
		if !(r >= 'a' && r <= 'z' || r == '_' || i > 0 && (r >= '0' && r <= '9' || r == '$')) {
			bare = false
			break
		}
	}
	if bare {
		return name
	}
	return pgx.Identifier{name}.Sanitize()
}

// Ident implements dburl.DB: double quotes.
func (*DB) Ident(name string) string { return dburl.QuoteParts(name, `"`) }

// Params implements dburl.DB: "$1, $2, …".
func (*DB) Params(n int) string {
	ps := make([]string, n)
	for i := range ps {
		ps[i] = "$" + strconv.Itoa(i+1)
	}
	return strings.Join(ps, ", ")
}

// KeyType implements dburl.DB.
func (*DB) KeyType() string { return "TEXT" }

// OutboxTables implements dburl.DB: the table alone.
func (*DB) OutboxTables(table string) []string { return []string{table} }

// MatchTables implements dburl.DB: "schema.table" when the pattern holds a '.', else the table
// name among the tables of the search path.
func (d *DB) MatchTables(ctx context.Context, pattern string) ([]string, error) {
	like := strings.NewReplacer(`\`, `\\`, `%`, `\%`, `_`, `\_`, `*`, `%`, `?`, `_`).Replace(pattern)
	name, where := `c.relname`, `pg_table_is_visible(c.oid)`
	if strings.Contains(pattern, ".") {
		name, where = `n.nspname || '.' || c.relname`, `true`
	}
	q := fmt.Sprintf(`SELECT %[1]s FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
			WHERE c.relkind IN ('r', 'p') AND %[2]s AND %[1]s LIKE $1
			AND EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attname = 'leased_by' AND NOT a.attisdropped) ORDER BY 1`, name, where)
	return d.Strings(ctx, q, like)
}
