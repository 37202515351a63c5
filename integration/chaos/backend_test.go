package chaos

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/internal/mariadbtest"
	_ "github.com/watermill-outbox/outbox/mysql"
)

// backend is the database a cell's outbox table lives in: what the relays get as --db, the
// handle the cell migrates, seeds and publishes through, and the cell's own reads of the table.
type backend interface {
	// url is the relays' --db value.
	url() string
	// handle is the *pgxpool.Pool or *sql.DB given to outbox.Migrate and outbox.NewPublisher.
	handle() any
	// schema names the table of cell (dropped when t ends where the database is shared).
	schema(t *testing.T, cell string) outbox.SchemaConfig
	// stored reads every event of table in sequence order.
	stored(ctx context.Context, table string) ([]stored, error)
	// settleState counts the events of table and those held behind a dead letter of their
	// key, and lists the dead-lettered ids.
	settleState(ctx context.Context, table string) (total, held int, dead []string, err error)
	// unpublished counts the events of table neither published nor dead-lettered.
	unpublished(ctx context.Context, table string) (int, error)
	// heldBy lists the ids of the pending events of table leased by the relay named relay
	// (its fencing tokens start with relay#).
	heldBy(ctx context.Context, table, relay string) ([]string, error)
	// begin opens a transaction for a Publisher.
	begin(ctx context.Context) (tx any, commit, rollback func(context.Context) error, err error)
}

// restarter is a backend whose server the cell may restart (a private one, never the shared).
type restarter interface {
	// restart restarts the server (mode: PostgreSQL's pg_ctl -m fast|immediate, MariaDB's
	// term|kill signal) and returns the moment it first accepted a connection again.
	restart(mode string) (time.Time, error)
}

// pgBackend is the suite's private PostgreSQL cluster.
type pgBackend struct {
	pg   *pgCluster
	pool *pgxpool.Pool
}

func (b *pgBackend) url() string { return b.pg.DSN() }
func (b *pgBackend) handle() any { return b.pool }

func (b *pgBackend) schema(_ *testing.T, cell string) outbox.SchemaConfig {
	return outbox.SchemaConfig{Table: "chaos_" + strings.ReplaceAll(cell, "-", "_")}
}

func (b *pgBackend) stored(ctx context.Context, table string) ([]stored, error) {
	rows, err := b.pool.Query(ctx, fmt.Sprintf(
		`SELECT id::text, coalesce(ordering_key, ''), sequence, published_at IS NOT NULL, dead_lettered_at IS NOT NULL, attempts FROM %q ORDER BY sequence`, table))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	return scanStored(rows)
}

func (b *pgBackend) settleState(ctx context.Context, table string) (total, held int, dead []string, err error) {
	err = b.pool.QueryRow(ctx, fmt.Sprintf(`SELECT count(*), count(*) FILTER (WHERE published_at IS NULL AND dead_lettered_at IS NULL AND EXISTS (
			SELECT 1 FROM %[1]q d WHERE d.ordering_key = o.ordering_key AND d.sequence < o.sequence AND d.dead_lettered_at IS NOT NULL))
		FROM %[1]q o`, table)).Scan(&total, &held)
	if err == nil {
		err = b.pool.QueryRow(ctx, fmt.Sprintf(`SELECT coalesce(array_agg(id::text), '{}') FROM %q WHERE dead_lettered_at IS NOT NULL`, table)).Scan(&dead)
	}
	return total, held, dead, err
}

func (b *pgBackend) unpublished(ctx context.Context, table string) (n int, err error) {
	err = b.pool.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM %q WHERE published_at IS NULL AND dead_lettered_at IS NULL`, table)).Scan(&n)
	return n, err
}

func (b *pgBackend) heldBy(ctx context.Context, table, relay string) ([]string, error) {
	rows, err := b.pool.Query(ctx, fmt.Sprintf(`SELECT id::text FROM %q WHERE published_at IS NULL AND dead_lettered_at IS NULL AND starts_with(leased_by, $1)`, table), relay+"#")
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

func (b *pgBackend) restart(mode string) (time.Time, error) {
	up, err := b.pg.restart(mode)
	b.pool.Reset()
	return up, err
}

func (b *pgBackend) begin(ctx context.Context) (any, func(context.Context) error, func(context.Context) error, error) {
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		return nil, nil, nil, err
	}
	return tx, tx.Commit, tx.Rollback, nil
}

// mysqlBackend is a MariaDB/MySQL database: the shared test database (internal/mariadbtest),
// where each cell's table has a unique name and is dropped, with its <table>_keys companion,
// when the cell ends; or the suite's private server (server set), which may be restarted.
type mysqlBackend struct {
	db     *sql.DB
	dsn    string // mysql://user@host:port/db
	server *mariaServer
}

// newPrivateMySQLBackend returns a backend on the private server srv (database test).
func newPrivateMySQLBackend(tb testing.TB, srv *mariaServer) *mysqlBackend {
	tb.Helper()
	db, err := sql.Open("mysql", fmt.Sprintf("root@tcp(%s)/test?interpolateParams=true", srv.Addr()))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = db.Close() })
	return &mysqlBackend{db: db, dsn: fmt.Sprintf("mysql://root@%s/test", srv.Addr()), server: srv}
}

func (b *mysqlBackend) restart(mode string) (time.Time, error) {
	if b.server == nil {
		return time.Time{}, fmt.Errorf("the shared MariaDB is never restarted")
	}
	return b.server.restart(mode)
}

// newMySQLBackend returns the shared MariaDB (skipping tb, or failing it when CI=true, when it
// is unreachable).
func newMySQLBackend(tb testing.TB) *mysqlBackend {
	tb.Helper()
	db := mariadbtest.Require(tb)
	cfg, err := mysql.ParseDSN(mariadbtest.DSN())
	if err != nil {
		tb.Fatal(err)
	}
	u := url.URL{Scheme: "mysql", Host: cfg.Addr, Path: "/" + cfg.DBName}
	if cfg.Passwd != "" {
		u.User = url.UserPassword(cfg.User, cfg.Passwd)
	} else {
		u.User = url.User(cfg.User)
	}
	return &mysqlBackend{db: db, dsn: u.String()}
}

func (b *mysqlBackend) url() string { return b.dsn }
func (b *mysqlBackend) handle() any { return b.db }

func (b *mysqlBackend) schema(t *testing.T, cell string) outbox.SchemaConfig {
	if b.server != nil {
		return outbox.SchemaConfig{Table: "chaos_" + strings.ReplaceAll(cell, "-", "_"), Dialect: outbox.DialectMySQL}
	}
	return outbox.SchemaConfig{Table: mariadbtest.Table(t), Dialect: outbox.DialectMySQL}
}

func (b *mysqlBackend) stored(ctx context.Context, table string) ([]stored, error) {
	rows, err := b.db.QueryContext(ctx, fmt.Sprintf(
		"SELECT `id`, coalesce(`ordering_key`, ''), `sequence`, `published_at` IS NOT NULL, `dead_lettered_at` IS NOT NULL, `attempts` FROM `%s` ORDER BY `sequence`", table))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	return scanStored(rows)
}

func (b *mysqlBackend) settleState(ctx context.Context, table string) (total, held int, dead []string, err error) {
	err = b.db.QueryRowContext(ctx, fmt.Sprintf("SELECT count(*), coalesce(sum(o.`published_at` IS NULL AND o.`dead_lettered_at` IS NULL AND EXISTS ("+
		"SELECT 1 FROM `%[1]s` d WHERE d.`ordering_key` = o.`ordering_key` AND d.`sequence` < o.`sequence` AND d.`dead_lettered_at` IS NOT NULL)), 0) "+
		"FROM `%[1]s` o", table)).Scan(&total, &held)
	if err != nil {
		return 0, 0, nil, err
	}
	rows, err := b.db.QueryContext(ctx, fmt.Sprintf("SELECT `id` FROM `%s` WHERE `dead_lettered_at` IS NOT NULL", table))
	if err != nil {
		return 0, 0, nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return 0, 0, nil, err
		}
		dead = append(dead, id)
	}
	return total, held, dead, rows.Err()
}

func (b *mysqlBackend) unpublished(ctx context.Context, table string) (n int, err error) {
	err = b.db.QueryRowContext(ctx, fmt.Sprintf("SELECT count(*) FROM `%s` WHERE `published_at` IS NULL AND `dead_lettered_at` IS NULL", table)).Scan(&n)
	return n, err
}

func (b *mysqlBackend) heldBy(ctx context.Context, table, relay string) ([]string, error) {
	rows, err := b.db.QueryContext(ctx, fmt.Sprintf("SELECT `id` FROM `%s` WHERE `published_at` IS NULL AND `dead_lettered_at` IS NULL AND LEFT(`leased_by`, CHAR_LENGTH(?)) = ?", table), relay+"#", relay+"#")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		ids = append(ids, id)
	}
	return ids, rows.Err()
}

func (b *mysqlBackend) begin(ctx context.Context) (any, func(context.Context) error, func(context.Context) error, error) {
	tx, err := b.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, nil, nil, err
	}
	return tx, func(context.Context) error { return tx.Commit() }, func(context.Context) error { return tx.Rollback() }, nil
}

// isDeadlock reports whether err is the database's deadlock error (MariaDB/MySQL 1213,
// PostgreSQL 40P01), after which the whole transaction is rolled back.
func isDeadlock(err error) bool {
	var my *mysql.MySQLError
	if errors.As(err, &my) {
		return my.Number == 1213
	}
	var pg *pgconn.PgError
	return errors.As(err, &pg) && pg.Code == "40P01"
}

// rowScanner is what scanStored needs of pgx.Rows and *sql.Rows.
type rowScanner interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
}

// scanStored reads rows of (id, key, sequence, published, dead, attempts).
func scanStored(rows rowScanner) ([]stored, error) {
	var out []stored
	for rows.Next() {
		var e stored
		if err := rows.Scan(&e.id, &e.key, &e.seq, &e.published, &e.dead, &e.attempts); err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	return out, rows.Err()
}
