// Package mysql is the outbox's SQL for MariaDB 10.6+ and MySQL 8.0+ through database/sql and
// github.com/go-sql-driver/mysql: an implementation of dialect.Dialect.
//
// What differs from PostgreSQL, and how this package makes up for it:
//
//   - No partial indexes. A STORED generated column, outbox_pending (1 pending keyed, 0
//     pending unordered, NULL after), and a plain column kept in step with ordering_key and
//     published_at, outbox_key (the key while unpublished, NULL after; checked by a CHECK
//     constraint), stand in for the partial indexes' predicates, so the relay's scans start
//     at the live rows of an index whose history entries all sit apart under NULL (see
//     Statements for the measured figures).
//   - No transaction-scoped advisory lock (GET_LOCK is per session). Per-key commit order comes
//     from a key-lock table, <table>_keys: Insert X-locks one row per ordering key (and per
//     idempotency key; rows are 65,536 stripes of a key hash, so the table stays small), in sorted
//     key order, with INSERT … ON DUPLICATE KEY UPDATE before the event INSERT, and holds it
//     until the caller's COMMIT or ROLLBACK, so two transactions writing one key draw their
//     sequences and commit one after the other.
//   - No UPDATE … RETURNING (MariaDB has INSERT/DELETE … RETURNING, MySQL 8 neither): claims and
//     marks are short READ COMMITTED transactions that read what they write inside the
//     transaction, and Insert reads its events back by id. RETURNING is not used at all, so
//     one text serves both servers.
//   - DDL commits implicitly: Migrate refuses a transaction handle.
//
// Times are DATETIME(6) in UTC taken from the database clock (UTC_TIMESTAMP(6)); durations
// are sent as microseconds. Values are scanned so that the driver's parseTime and loc settings
// do not matter. The tables are utf8mb4 with a binary NO PAD collation, so topics and keys
// compare byte for byte and case-sensitively, as on PostgreSQL.
//
// The session's sql_mode should be strict (STRICT_TRANS_TABLES or STRICT_ALL_TABLES, the
// default of both servers): in a non-strict mode the server truncates a too-long value with
// a warning instead of refusing it. The outbox validates lengths before any SQL, so only values
// that bypass that validation are concerned.
//
// Handles: the Executor's Handle must be a *sql.DB, *sql.Conn or *sql.Tx of
// github.com/go-sql-driver/mysql. The DSN option interpolateParams=true saves a round trip per
// statement with arguments (the driver otherwise prepares, executes and closes each one).
package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/watermill-outbox/outbox/internal/dialect"
)

// Dialect is the MariaDB/MySQL dialect. The zero value is ready to use; it holds no state and
// is safe for concurrent use.
type Dialect struct {
	// noKeyLocks leaves the per-key locks out of Insert: only for the test that shows what
	// they prevent.
	noKeyLocks bool
}

// New returns the MariaDB/MySQL dialect.
func New() *Dialect { return &Dialect{} }

var _ dialect.Dialect = (*Dialect)(nil)

// Name returns "mysql".
func (*Dialect) Name() string { return "mysql" }

// Capabilities: no NOTIFY; acks may be flushed beside the marks (row locks, several writers);
// continuations (ClaimParams.Cont, see relay.runs); SKIP LOCKED and the database clock; a
// table may be qualified by its database ("db.table"); no fillfactor.
func (*Dialect) Capabilities() dialect.Capabilities {
	return dialect.Capabilities{
		Notify:          false,
		FlushAcks:       true,
		Continuations:   true,
		SkipLocked:      true,
		DatabaseClock:   true,
		SchemaQualified: true,
		FillFactor:      false,
		// ClaimAhead stays off: see dialect.Capabilities.ClaimAhead.
		Title: "MariaDB/MySQL",
		// MariaDB's JSON functions refuse nesting deeper than 31 levels (JSON_VALID is 0 for
		// 32 nested arrays on 10.11); MySQL 8 allows 100. The lower bound holds for both.
		MaxJSONDepth:  31,
		JSONDepthRule: "MariaDB's JSON_VALID",
	}
}

// ErrServerVersion is returned (wrapped) by Migrate for a server older than MariaDB 10.6 or
// MySQL 8.0.23.
var ErrServerVersion = errors.New("mysql: server too old")

// ErrDuplicateEventID is returned (wrapped) by Insert when an event id is already stored under
// another idempotency key (or none): give a re-published message a new id.
var ErrDuplicateEventID = errors.New("mysql: event id already stored")

// ErrNoNotify is returned by Insert for InsertParams.Notify: MySQL has no LISTEN/NOTIFY
// (Capabilities.Notify is false).
var ErrNoNotify = errors.New("mysql: no NOTIFY: use an in-process or broker wakeup")

// ErrHandle is returned (wrapped) when the Executor's handle is not one this dialect can open
// a transaction or a dedicated connection on.
var ErrHandle = errors.New("mysql: unsupported database handle")

// ident quotes one identifier with backticks (a backtick inside is doubled).
func ident(name string) string { return "`" + strings.ReplaceAll(name, "`", "``") + "`" }

// Quote returns the table name quoted, `db`.`table` when qualified.
func (*Dialect) Quote(t *dialect.Table) string { return quoteParts(t.Parts) }

func quoteParts(parts []string) string {
	q := make([]string, len(parts))
	for i, p := range parts {
		q[i] = ident(p)
	}
	return strings.Join(q, ".")
}

// names holds the quoted names of one table's objects.
type names struct {
	table    string // `db`.`t`
	keys     string // `db`.`t_keys`: the per-ordering-key lock rows
	pending  string // index on (outbox_pending, sequence)
	keyIdx   string // index on (outbox_key, sequence)
	schema   string // the database part, unquoted ("" = the connection's database)
	name     string // the table part, unquoted
	keysName string // the key-lock table part, unquoted
}

func namesOf(t *dialect.Table) names {
	n := names{table: quoteParts(t.Parts), name: t.Name(), keysName: t.IndexBase + "_keys"}
	kp := []string{n.keysName}
	if len(t.Parts) == 2 {
		n.schema = t.Parts[0]
		kp = []string{t.Parts[0], n.keysName}
	}
	n.keys = quoteParts(kp)
	n.pending = ident(t.IndexBase + "_pending_idx")
	n.keyIdx = ident(t.IndexBase + "_key_idx")
	return n
}

// querier runs statements on one handle: an Executor, or a transaction this package opened.
type querier interface {
	query(ctx context.Context, q string, args ...any) (dialect.Rows, error)
	exec(ctx context.Context, q string, args ...any) (int64, error)
}

type exQuerier struct{ ex dialect.Executor }

func (e exQuerier) query(ctx context.Context, q string, args ...any) (dialect.Rows, error) {
	return e.ex.Query(ctx, q, args...)
}

func (e exQuerier) exec(ctx context.Context, q string, args ...any) (int64, error) {
	return e.ex.Exec(ctx, q, args...)
}

// sqlQuerier runs statements on a *sql.DB, *sql.Tx or *sql.Conn.
func sqlQuerier(h dialect.SQLHandle) querier { return exQuerier{dialect.StdSQL{D: h}} }

// inTx runs fn in a transaction: the caller's when ex is one, else a new one at isolation
// level iso on the handle (a *sql.DB or *sql.Conn), committed when fn returns nil and rolled
// back otherwise. A transaction of its own that InnoDB chose as a deadlock victim (1213) is
// run again, up to deadlockRetries times: fn must start from scratch each time. Deadlocks
// happen between a claim and a mark: a claim locks a row through the pending index (the
// secondary record first, then the primary key), a mark updates a row it locked by primary
// key, which moves its pending-index entry (the primary key first, then the secondary
// record). SKIP LOCKED skips rows, not that inversion: TestConcurrentClaimersKeepKeyOrder (4
// relays, 10 hot keys, 10 % failures) saw 2 deadlocks in 3,150 claims, and MariaDB 10.11
// reported them to the claim.
func inTx(ctx context.Context, ex dialect.Executor, iso sql.IsolationLevel, fn func(q querier) error) error {
	if ex.InTx() {
		return fn(exQuerier{ex})
	}
	for attempt := 1; ; attempt++ {
		err := inOwnTx(ctx, ex, iso, fn)
		if err == nil || attempt > deadlockRetries || !isDeadlock(err) || ctx.Err() != nil {
			return err
		}
		deadlocks.Add(1)
		time.Sleep(time.Duration(attempt) * time.Millisecond)
	}
}

// deadlockRetries is how many times inTx runs a deadlocked transaction of its own again.
const deadlockRetries = 5

// deadlocks counts the transactions inTx ran again after a deadlock (observed by tests).
var deadlocks atomic.Int64

// MissingTable implements dialect.Dialect: error 1146, ER_NO_SUCH_TABLE.
func (*Dialect) MissingTable(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && me.Number == 1146
}

// isDeadlock reports whether err is InnoDB's deadlock error (1213): the transaction was rolled
// back.
func isDeadlock(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && me.Number == 1213
}

func inOwnTx(ctx context.Context, ex dialect.Executor, iso sql.IsolationLevel, fn func(q querier) error) error {
	var (
		tx  *sql.Tx
		err error
	)
	switch h := ex.Handle().(type) {
	case *sql.DB:
		tx, err = h.BeginTx(ctx, &sql.TxOptions{Isolation: iso})
	case *sql.Conn:
		tx, err = h.BeginTx(ctx, &sql.TxOptions{Isolation: iso})
	case *sql.Tx:
		return fn(sqlQuerier(h))
	default:
		return fmt.Errorf("%w: %T (want *sql.DB, *sql.Conn or *sql.Tx)", ErrHandle, h)
	}
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	if err := fn(sqlQuerier(tx)); err != nil {
		_ = tx.Rollback()
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

// selectTime selects a DATETIME expression as text ("2006-01-02 15:04:05.999999"), which dbTime
// reads as UTC: with the driver's parseTime and a loc other than UTC, the driver would turn the
// stored UTC wall clock into loc's time, and a wall clock in loc's daylight-saving gap (say
// 02:30 on the day clocks go forward) does not exist there: it came back an hour late.
func selectTime(expr string) string { return "CAST(" + expr + " AS CHAR)" }

// dbTime scans a DATETIME column as UTC whatever the driver's parseTime and loc settings:
// text ("2006-01-02 15:04:05.999999") or a time.Time whose wall clock is the stored value.
// NULL leaves the zero time.
type dbTime time.Time

const dbTimeLayout = "2006-01-02 15:04:05.999999"

// Scan implements sql.Scanner.
func (d *dbTime) Scan(src any) error {
	switch v := src.(type) {
	case nil:
		*d = dbTime{}
	case time.Time:
		*d = dbTime(time.Date(v.Year(), v.Month(), v.Day(), v.Hour(), v.Minute(), v.Second(), v.Nanosecond(), time.UTC))
	case []byte:
		return d.parse(string(v))
	case string:
		return d.parse(v)
	default:
		return fmt.Errorf("mysql: time column: unsupported type %T", src)
	}
	return nil
}

func (d *dbTime) parse(s string) error {
	t, err := time.ParseInLocation(dbTimeLayout, s, time.UTC)
	if err != nil {
		return fmt.Errorf("mysql: time column: %w", err)
	}
	*d = dbTime(t)
	return nil
}

// nullTime scans a nullable DATETIME column into a *time.Time (nil for NULL).
type nullTime struct{ t **time.Time }

// Scan implements sql.Scanner.
func (n nullTime) Scan(src any) error {
	if src == nil {
		*n.t = nil
		return nil
	}
	var d dbTime
	if err := d.Scan(src); err != nil {
		return err
	}
	t := time.Time(d)
	*n.t = &t
	return nil
}

// timeText renders t (UTC) as a DATETIME(6) literal parameter: a string, so the driver's loc
// setting never converts it.
func timeText(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05.000000") }

// placeholders returns "?, ?, …" for n values (n ≥ 1).
func placeholders(n int) string {
	return strings.TrimSuffix(strings.Repeat("?, ", n), ", ")
}

// int64Args returns vals as statement arguments.
func int64Args(vals []int64) []any {
	out := make([]any, len(vals))
	for i, v := range vals {
		out[i] = v
	}
	return out
}

// topicSQL renders one topic pattern as a condition on col; parameters are appended to args.
// A prefix compares the column's first characters (binary NO PAD collation: byte-exact), so '_' and '%'
// are ordinary characters.
func topicSQL(tp dialect.Topic, col string, args *[]any) string {
	switch {
	case tp.All:
		return "TRUE"
	case tp.Prefix:
		*args = append(*args, tp.Value, tp.Value)
		return "LEFT(" + col + ", CHAR_LENGTH(?)) = ?"
	default:
		*args = append(*args, tp.Value)
		return col + " = ?"
	}
}

// listSQL renders "col IN (vals)", or FALSE for no values.
func listSQL[T any](col string, vals []T, args *[]any) string {
	if len(vals) == 0 {
		return "FALSE"
	}
	for _, v := range vals {
		*args = append(*args, v)
	}
	return col + " IN (" + placeholders(len(vals)) + ")"
}

// itoa is strconv.FormatInt for SQL text built from trusted integers.
func itoa[T ~int | ~int64](v T) string { return strconv.FormatInt(int64(v), 10) }
