package mysql

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"
	"github.com/google/uuid"

	"github.com/watermill-outbox/outbox/internal/dialect"
)

// The tests run against the MariaDB/MySQL server of OUTBOX_MYSQL_DSN (default: root on
// 127.0.0.1:3306, database test). Unreachable: the tests skip, or fail when CI=true.

var (
	testDB    *sql.DB
	testDBErr error
)

func TestMain(m *testing.M) {
	dsn := os.Getenv("OUTBOX_MYSQL_DSN")
	if dsn == "" {
		dsn = "root@tcp(127.0.0.1:3306)/test"
	}
	db, err := sql.Open("mysql", dsn)
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err = db.PingContext(ctx)
		cancel()
	}
	if err != nil {
		if os.Getenv("CI") == "true" {
			fmt.Fprintf(os.Stderr, "MariaDB/MySQL unreachable at %q with CI=true: %v\n", dsn, err)
			os.Exit(1)
		}
		testDBErr = err
	} else {
		db.SetMaxOpenConns(40)
		db.SetMaxIdleConns(40)
		testDB = db
	}
	os.Exit(m.Run())
}

// needDB returns the test database. Unreachable, it fails the test when CI=true (TestMain has
// already exited then) and skips it otherwise.
func needDB(t testing.TB) *sql.DB {
	t.Helper()
	if testDB == nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("MariaDB/MySQL unreachable and CI=true: %v", testDBErr)
		}
		t.Skipf("MariaDB/MySQL unreachable (set OUTBOX_MYSQL_DSN): %v", testDBErr)
	}
	return testDB
}

// sqlEx is a dialect.Executor over a *sql.DB, *sql.Conn or *sql.Tx.
func sqlEx(h dialect.SQLHandle) dialect.Executor {
	_, tx := h.(*sql.Tx)
	return dialect.StdSQL{D: h, Tx: tx}
}

var nameRe = regexp.MustCompile(`[^a-z0-9]+`)

// tableOpt changes a test table's config.
type tableOpt func(*dialect.Table)

func withExtra(cols ...dialect.Column) tableOpt {
	return func(t *dialect.Table) { t.Extra = append(t.Extra, cols...) }
}

func withScope(cols ...string) tableOpt { return func(t *dialect.Table) { t.Scope = cols } }

func withBytea() tableOpt { return func(t *dialect.Table) { t.Payload = dialect.PayloadBytea } }

// newTableConfig returns a table config with a unique name for t (dropped at the end).
func newTableConfig(t testing.TB, opts ...tableOpt) *dialect.Table {
	t.Helper()
	var b [3]byte
	_, _ = rand.Read(b[:])
	base := nameRe.ReplaceAllString(strings.ToLower(t.Name()), "_")
	if len(base) > 28 {
		base = base[:28]
	}
	name := "obx_" + base + "_" + hex.EncodeToString(b[:])
	tb := &dialect.Table{Parts: []string{name}, IndexBase: name, LockSeed: int64(len(name))*7919 + int64(b[0])<<8 + int64(b[1])}
	for _, o := range opts {
		o(tb)
	}
	if db := testDB; db != nil {
		t.Cleanup(func() {
			n := namesOf(tb)
			_, _ = db.Exec("DROP TABLE IF EXISTS " + n.table)
			_, _ = db.Exec("DROP TABLE IF EXISTS " + n.keys)
		})
	}
	return tb
}

// newTable returns a migrated table.
func newTable(t testing.TB, opts ...tableOpt) *dialect.Table {
	t.Helper()
	db := needDB(t)
	tb := newTableConfig(t, opts...)
	if err := New().Migrate(context.Background(), sqlEx(db), tb); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	return tb
}

func ptr[T any](v T) *T { return &v }

// ev returns an insert row with a fresh UUIDv7 id.
func ev(topic, payload, okey, ikey string) dialect.InsertRow {
	r := dialect.InsertRow{ID: uuid.Must(uuid.NewV7()).String(), Topic: topic, Payload: []byte(payload), Headers: "{}"}
	if okey != "" {
		r.OrderingKey = &okey
	}
	if ikey != "" {
		r.IdempotencyKey = &ikey
	}
	return r
}

// mustInsert writes rows through the pool (a transaction of Insert's own) and fails the test on error.
func mustInsert(t testing.TB, tb *dialect.Table, rows ...dialect.InsertRow) []dialect.Stored {
	t.Helper()
	out, err := New().Insert(context.Background(), sqlEx(needDB(t)), &dialect.InsertParams{Table: tb, Rows: rows})
	if err != nil {
		t.Fatalf("Insert: %v", err)
	}
	return out
}

// exec runs a statement on the test database and fails the test on error.
func exec(t testing.TB, q string, args ...any) int64 {
	t.Helper()
	res, err := needDB(t).Exec(q, args...)
	if err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	n, _ := res.RowsAffected()
	return n
}

// queryInt64s returns the first column of q's rows.
func queryInt64s(t testing.TB, q string, args ...any) []int64 {
	t.Helper()
	rs, err := needDB(t).Query(q, args...)
	if err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	defer rs.Close()
	var out []int64
	for rs.Next() {
		var v int64
		if err := rs.Scan(&v); err != nil {
			t.Fatal(err)
		}
		out = append(out, v)
	}
	if err := rs.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func relayConfig(batch, run int) dialect.RelayConfig {
	return dialect.RelayConfig{BatchSize: batch, MaxRunPerKey: run, KeyScan: 100, LeaseDuration: time.Minute,
		MaxAttempts: 3, RetryBase: time.Second, RetryMax: 10 * time.Second}
}

var all = dialect.TopicSelection{Include: dialect.Topic{All: true}}

// claim runs one claim with the usual parameters (Limit = BatchSize, Oldest = BatchSize).
func claim(t testing.TB, r dialect.Relay, cfg dialect.RelayConfig, token string) *dialect.ClaimResult {
	t.Helper()
	res, err := r.Claim(context.Background(), sqlEx(needDB(t)), &dialect.ClaimParams{Token: token, Limit: cfg.BatchSize, Oldest: cfg.BatchSize})
	if err != nil {
		t.Fatalf("Claim: %v", err)
	}
	return res
}

func seqsOf(evs []dialect.Claimed) []int64 {
	out := make([]int64, len(evs))
	for i, e := range evs {
		out[i] = e.Sequence
	}
	return out
}
