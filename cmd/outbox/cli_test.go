package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	wmkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/internal/brokertest"
	"github.com/watermill-outbox/outbox/internal/mariadbtest"
	"github.com/watermill-outbox/outbox/internal/pgtest"
	"github.com/watermill-outbox/outbox/internal/privatepgbouncer"
	"github.com/watermill-outbox/outbox/webhook"
)

// syncBuffer is a bytes.Buffer safe for a writer and a reader in different goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// testEvent is an event a test writes with the library.
type testEvent struct {
	topic, key string
	n          int
}

// backend is a database the command tests run against.
type backend struct {
	name string
	// fresh returns a --db URL and a fresh outbox table name (dropped when the test ends).
	fresh func(t *testing.T) (db, table string)
	// publish writes events in one transaction through outbox.NewPublisher and returns their ids.
	publish func(t *testing.T, db, table string, evs []testEvent) []string
}

func postgresBackend() backend {
	return backend{
		name: "postgres",
		fresh: func(t *testing.T) (string, string) {
			pgtest.Require(t)
			return pgtest.DSN(), pgtest.Table(t)
		},
		publish: func(t *testing.T, _ string, table string, evs []testEvent) []string {
			pool := pgtest.Require(t)
			var ids []string
			err := pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error {
				pub, err := outbox.NewPublisher(tx, outbox.PublisherConfig{Schema: outbox.SchemaConfig{Table: table}}, nil)
				if err != nil {
					return err
				}
				ids, err = publishAll(pub, evs)
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			return ids
		},
	}
}

func sqliteBackend() backend {
	return backend{
		name: "sqlite",
		fresh: func(t *testing.T) (string, string) {
			return "sqlite://" + filepath.Join(t.TempDir(), "outbox.db"), "outbox_" + strings.ToLower(sanitizeName(t.Name()))
		},
		publish: func(t *testing.T, db, table string, evs []testEvent) []string {
			u, err := parseDBURL(db)
			if err != nil {
				t.Fatal(err)
			}
			sdb, err := sql.Open("sqlite", sqliteDSN(u.File()))
			if err != nil {
				t.Fatal(err)
			}
			defer sdb.Close()
			return publishSQL(t, sdb, outbox.DialectSQLite, table, evs)
		},
	}
}

// mariadbBackend is the shared MariaDB test database (internal/mariadbtest) behind a mysql://
// URL; its tables are dropped with their key-lock tables when the test ends.
func mariadbBackend() backend {
	return backend{
		name: "mariadb",
		fresh: func(t *testing.T) (string, string) {
			return mariadbURL(t), mariadbtest.Table(t)
		},
		publish: func(t *testing.T, _ string, table string, evs []testEvent) []string {
			return publishSQL(t, mariadbtest.Require(t), outbox.DialectMySQL, table, evs)
		},
	}
}

// mariadbURL is the --db URL of the shared MariaDB test database (mariadbtest.DSN in URL
// form); it calls mariadbtest.Require first.
func mariadbURL(t *testing.T) string {
	t.Helper()
	mariadbtest.Require(t)
	cfg, err := mysql.ParseDSN(mariadbtest.DSN())
	if err != nil {
		t.Fatal(err)
	}
	u := url.URL{Scheme: "mysql", User: url.User(cfg.User), Host: cfg.Addr, Path: "/" + cfg.DBName}
	if cfg.Passwd != "" {
		u.User = url.UserPassword(cfg.User, cfg.Passwd)
	}
	return u.String()
}

// publishSQL writes evs in one transaction of db through outbox.NewPublisher and returns their
// ids.
func publishSQL(t *testing.T, db *sql.DB, dialect outbox.Dialect, table string, evs []testEvent) []string {
	t.Helper()
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	pub, err := outbox.NewPublisher(tx, outbox.PublisherConfig{Schema: outbox.SchemaConfig{Table: table, Dialect: dialect}}, nil)
	if err != nil {
		_ = tx.Rollback()
		t.Fatal(err)
	}
	ids, err := publishAll(pub, evs)
	if err != nil {
		_ = tx.Rollback()
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	return ids
}

func sanitizeName(s string) string {
	return regexp.MustCompile(`[^A-Za-z0-9]+`).ReplaceAllString(s, "_")
}

// publishAll publishes evs in order, payload {"key":…,"n":…}, and returns their ids.
func publishAll(pub *outbox.Publisher, evs []testEvent) ([]string, error) {
	var ids []string
	for _, e := range evs {
		msg := outbox.NewMessage([]byte(fmt.Sprintf(`{"key":%q,"n":%d}`, e.key, e.n)))
		outbox.SetOrderingKey(msg, e.key)
		if err := pub.Publish(e.topic, msg); err != nil {
			return nil, err
		}
		ids = append(ids, msg.UUID)
	}
	return ids, nil
}

// backends are the databases the tests cover.
func backends() []backend {
	return []backend{postgresBackend(), sqliteBackend(), mariadbBackend()}
}

// receiver is an httptest webhook receiver on 127.0.0.1 that verifies each request's
// signature and records the event ids in arrival order.
type receiver struct {
	*httptest.Server
	secret string
	status int

	mu       sync.Mutex
	ids      []string
	order    map[string][]int // n per key, in arrival order (first arrivals only)
	seen     map[string]bool
	at       map[string]time.Time // first arrival per event id
	badSig   int
	requests int
}

// newReceiver answers every request with status after checking its signature.
func newReceiver(t testing.TB, status int) *receiver {
	r := &receiver{secret: "test-secret-" + randomHex(8), status: status, order: map[string][]int{}, seen: map[string]bool{}, at: map[string]time.Time{}}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		r.mu.Lock()
		defer r.mu.Unlock()
		r.requests++
		if webhook.Verify([]byte(r.secret), body, req.Header.Get(webhook.DefaultSignatureHeader)) != nil {
			r.badSig++
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		if r.status/100 != 2 {
			w.WriteHeader(r.status)
			_, _ = io.WriteString(w, "receiver says no")
			return
		}
		id := req.Header.Get(webhook.HeaderEventID)
		if !r.seen[id] {
			r.seen[id] = true
			r.at[id] = time.Now()
			r.ids = append(r.ids, id)
			var p struct {
				Key string `json:"key"`
				N   int    `json:"n"`
			}
			_ = json.Unmarshal(body, &p)
			r.order[p.Key] = append(r.order[p.Key], p.N)
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(r.Close)
	return r
}

// arrived returns when id first arrived, and whether it has.
func (r *receiver) arrived(id string) (time.Time, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	at, ok := r.at[id]
	return at, ok
}

func (r *receiver) received() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.ids)
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

// TestUsageErrors: bad URLs and flags fail with exit status 2 and one line naming the fix,
// without touching any database.
func TestUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		name  string
		args  []string
		parts []string
	}{
		{"unsupported scheme", []string{"status", "--db", "sqlserver://sa:secret@127.0.0.1/x"}, []string{`"sqlserver://sa:xxxxx@127.0.0.1/x" is not supported`, "postgres://", "mysql://", "mariadb://", "sqlite://PATH", ".db"}},
		{"no db", []string{"status"}, []string{"--db", "OUTBOX_DB", "postgres://", "mysql://"}},
		{"mysql URL without database", []string{"status", "--db", "mysql://root:secret@127.0.0.1:3306"}, []string{`"mysql://root:xxxxx@127.0.0.1:3306" names no database`, "mysql://user:password@host:3306/dbname"}},
		{"password hidden", []string{"status", "--db", "postgres://u:secret@127.0.0.1:5432/db?sslmode=bogus"}, []string{"xxxxx", "postgres://"}},
		{"bad --to", []string{"relay", "--db", "x.db", "--to", "ftp://127.0.0.1/"}, []string{"ftp://127.0.0.1/", "kafka://", "amqp://", "redis://", "http(s)://"}},
		{"bad batch size", []string{"relay", "--db", "x.db", "--to", "http://127.0.0.1/", "--batch-size", "0"}, []string{"--batch-size"}},
		{"lease below delivery timeout", []string{"relay", "--db", "x.db", "--to", "http://127.0.0.1/", "--lease", "2s", "--delivery-timeout", "5s"}, []string{"--delivery-timeout"}},
		{"bad topic pattern", []string{"relay", "--db", "x.db", "--to", "http://127.0.0.1/", "--topics", "a*b"}, []string{`"a*b"`, "prefix ending in '*'"}},
		{"unknown flag", []string{"status", "--bogus"}, []string{"--bogus", "outbox status --help"}},
		{"bad duration", []string{"cleanup", "--db", "x.db", "--published-older-than", "7days"}, []string{"7days"}},
		{"cleanup without age", []string{"cleanup", "--db", "x.db"}, []string{"--published-older-than is required"}},
		{"retry without filter", []string{"dead", "retry", "--db", "x.db"}, []string{"--topic", "--id"}},
		{"bad id", []string{"dead", "purge", "--db", "x.db", "--id", "nope"}, []string{`--id "nope" is not a UUID`}},
		{"bad env", nil, []string{"OUTBOX_BATCH_SIZE"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var env []string
			args := tc.args
			if tc.name == "bad env" {
				env = []string{"OUTBOX_BATCH_SIZE=many"}
				args = []string{"relay", "--db", "x.db", "--to", "http://127.0.0.1/"}
			}
			wantFailure(t, cli(t, env, args...), 2, tc.parts...)
		})
	}
}

// TestDatabaseErrors: an unreachable server, a missing table and a missing SQLite file each
// fail with exit status 1 and one line naming the fix; a missing SQLite file is not created.
func TestDatabaseErrors(t *testing.T) {
	t.Run("unreachable", func(t *testing.T) {
		addr := brokertest.ClosedPort(t)
		for _, args := range [][]string{
			{"status", "--db", "postgres://postgres@" + addr + "/test"},
			{"migrate", "--db", "postgresql://postgres@" + addr + "/test"},
			{"relay", "--db", "postgres://postgres@" + addr + "/test", "--to", "http://127.0.0.1/"},
			{"dead", "list", "--db", "postgres://postgres@" + addr + "/test"},
		} {
			wantFailure(t, cli(t, nil, args...), 1, "cannot connect to PostgreSQL at "+addr, "check that the server runs")
		}
		for _, args := range [][]string{
			{"status", "--db", "mysql://root@" + addr + "/test"},
			{"migrate", "--db", "mariadb://root:secret@" + addr + "/test"},
			{"relay", "--db", "mysql://root@" + addr + "/test", "--to", "http://127.0.0.1/"},
			{"dead", "list", "--db", "mysql://root@" + addr + "/test"},
			{"demo", "--db", "mysql://root@" + addr + "/test"},
			{"bench", "--db", "mysql://root@" + addr + "/test"},
		} {
			r := cli(t, nil, args...)
			wantFailure(t, r, 1, "cannot connect to MariaDB/MySQL at "+addr, "connection refused", "check that the server runs", "names the right host, port and database")
			if strings.Contains(r.stderr, "secret") {
				t.Fatalf("the password is shown: %s", r.stderr)
			}
		}
	})
	t.Run("missing sqlite file", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "missing.db")
		for _, args := range [][]string{
			{"status", "--db", path},
			{"dead", "list", "--db", "sqlite://" + path},
			{"relay", "--db", "file:" + path, "--to", "http://127.0.0.1/"},
			{"cleanup", "--db", "sqlite:" + path, "--published-older-than", "1h"},
		} {
			wantFailure(t, cli(t, nil, args...), 1, "does not exist", "outbox migrate --db")
		}
		if _, err := os.Stat(path); !os.IsNotExist(err) {
			t.Fatalf("the SQLite file was created: %v", err)
		}
	})
	for _, b := range backends() {
		t.Run("missing table/"+b.name, func(t *testing.T) {
			db, table := b.fresh(t)
			if b.name == "sqlite" {
				mustRun(t, nil, "migrate", "--db", db, "--table", "other")
			}
			for _, args := range [][]string{
				{"status", "--db", db, "--table", table},
				{"dead", "purge", "--db", db, "--table", table, "--topic", "*"},
				{"relay", "--db", db, "--table", table, "--to", "http://127.0.0.1/"},
			} {
				wantFailure(t, cli(t, nil, args...), 1, fmt.Sprintf("outbox table %q not found", table), "outbox migrate --db", "--table "+table)
			}
		})
	}
}

// TestRelay: migrate, status on the empty table, events written with the library, a relay
// (excluding one topic through the environment) to a signature-checking receiver until status
// shows only the excluded topic pending, SIGTERM (exit 0), a second relay for the rest, and
// cleanup of exactly the published events (counted first: nothing without --yes, the counts
// printed with --dry-run).
func TestRelay(t *testing.T) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) { relayScenario(t, b) })
	}
}

// wakeupLines is the log line in which a relay on each backend says how it finds new events.
var wakeupLines = map[string]string{
	"postgres": `msg="outbox relay claims as soon as any writer commits: it probes the table's sequence every --wake-probe (every wake-probe-idle after a second without writes; no signal from writers needed, works through PgBouncer), and polls every --poll-interval" poll-interval=50ms wake-probe=5ms wake-probe-idle=50ms wakeup=probe`,
	"sqlite":   `msg="outbox relay wakes on each commit to the SQLite file, and polls every --poll-interval" poll-interval=50ms wakeup=sqlite-wal`,
	"mariadb":  `msg="outbox relay polls every --poll-interval: MariaDB/MySQL has no LISTEN/NOTIFY to wake it (lower --poll-interval for lower latency)" poll-interval=50ms wakeup=none`,
}

// dsnBackend is the PostgreSQL backend reached through the --db URL that dsn returns (events
// are written directly).
func dsnBackend(name string, dsn func(t *testing.T) string) backend {
	b := postgresBackend()
	b.name = name
	b.fresh = func(t *testing.T) (string, string) {
		pgtest.Require(t)
		return dsn(t), pgtest.Table(t)
	}
	return b
}

// TestRelayExecModeDSN runs TestRelay's scenario (migrate, status, relay, cleanup) with pgx's
// default_query_exec_mode set in the --db URL, directly and through PgBouncer in transaction
// mode.
func TestRelayExecModeDSN(t *testing.T) {
	for _, b := range []backend{
		dsnBackend("exec", func(t *testing.T) string { return pgtest.DSN() + "&default_query_exec_mode=exec" }),
		dsnBackend("simple_protocol", func(t *testing.T) string { return pgtest.DSN() + "&default_query_exec_mode=simple_protocol" }),
		dsnBackend("pgbouncer/exec", func(t *testing.T) string {
			return privatepgbouncer.Start(t, pgtest.DSN()).DSN("default_query_exec_mode=exec")
		}),
	} {
		t.Run(b.name, func(t *testing.T) { relayScenario(t, b) })
	}
}

// relayScenario is TestRelay's body for one backend.
func relayScenario(t *testing.T, b backend) {
	db, table := b.fresh(t)
	out := mustRun(t, nil, "migrate", "--db", db, "--table", table)
	if !strings.Contains(out, fmt.Sprintf("outbox table %q is ready", table)) {
		t.Fatalf("migrate said %q", out)
	}
	mustRun(t, nil, "migrate", "--db", db, "--table", table) // idempotent
	if s := status(t, db, table); s.Pending != 0 || s.DeadLettered != 0 || len(s.Topics) != 0 {
		t.Fatalf("fresh table: %+v", s)
	}

	var evs []testEvent
	for i := range 40 {
		evs = append(evs, testEvent{topic: "orders.created", key: fmt.Sprintf("k%d", i%5), n: i})
	}
	for i := range 7 {
		evs = append(evs, testEvent{topic: "audit.log", key: "audit", n: i})
	}
	ids := b.publish(t, db, table, evs)
	orderIDs, auditIDs := ids[:40], ids[40:]
	s := status(t, db, table)
	if s.Pending != 47 || s.DeadLettered != 0 {
		t.Fatalf("after publishing: %+v", s)
	}
	if got := topicCounts(s); !maps2Equal(got, map[string][2]int64{"orders.created": {40, 0}, "audit.log": {7, 0}}) {
		t.Fatalf("per topic: %v", got)
	}

	rcv := newReceiver(t, http.StatusOK)
	relayArgs := []string{"relay", "--db", db, "--table", table, "--to", rcv.URL + "/hook", "--allow-prefix", "127.0.0.0/8",
		"--poll-interval", "50ms", "--batch-size", "7", "--concurrency", "3"}
	env := []string{"OUTBOX_SECRET=" + rcv.secret, "OUTBOX_EXCLUDE=audit.*", "OUTBOX_BATCH_SIZE=nonsense-but-overridden-by-the-flag"}
	p := start(t, env, relayArgs...)
	p.runUntil(t, "orders delivered", func() bool {
		c := topicCounts(status(t, db, table))
		return c["orders.created"] == [2]int64{} && c["audit.log"] == [2]int64{7, 0}
	})
	if !strings.Contains(p.errb.String(), "outbox relay stopped") {
		t.Fatalf("relay log lacks the stop line: %s", p.errb.String())
	}
	want, ok := wakeupLines[b.name]
	if !ok {
		want = wakeupLines["postgres"] // the dsnBackends
	}
	if !strings.Contains(p.errb.String(), want) {
		t.Fatalf("relay log lacks the wakeup line %s:\n%s", want, p.errb.String())
	}
	if got := rcv.received(); !slices.Equal(sorted(got), sorted(orderIDs)) {
		t.Fatalf("received %d ids, want the %d order events", len(got), len(orderIDs))
	}
	rcv.mu.Lock()
	for k, ns := range rcv.order {
		if !slices.IsSorted(ns) {
			t.Errorf("key %s arrived out of order: %v", k, ns)
		}
	}
	if rcv.badSig != 0 {
		t.Errorf("%d requests with a bad signature", rcv.badSig)
	}
	rcv.mu.Unlock()

	// The rest, configured through the environment only (flag-less db and destination).
	p = start(t, []string{"OUTBOX_DB=" + db, "OUTBOX_TABLE=" + table, "OUTBOX_TO=" + rcv.URL + "/hook", "OUTBOX_SECRET=" + rcv.secret,
		"OUTBOX_ALLOW_PREFIX=127.0.0.0/8", "OUTBOX_POLL_INTERVAL=50ms", "OUTBOX_TOPICS=audit.*"}, "relay")
	p.runUntil(t, "all delivered", func() bool {
		return status(t, db, table).Pending == 0
	})
	if got := rcv.received(); !slices.Equal(sorted(got), sorted(ids)) {
		t.Fatalf("received %d ids, want all %d", len(got), len(ids))
	}
	rcv.mu.Lock()
	if !slices.Equal(rcv.order["audit"], []int{0, 1, 2, 3, 4, 5, 6}) {
		t.Errorf("audit order %v", rcv.order["audit"])
	}
	rcv.mu.Unlock()
	_ = auditIDs

	cleanup := []string{"cleanup", "--db", db, "--table", table, "--published-older-than", "0s", "--dead-older-than", "0s"}
	wantStderr(t, cli(t, nil, cleanup...), 2, "outbox: cleanup would delete 47 published events older than 0s and delete 0 dead-lettered events older than 0s; "+
		"nothing was deleted: pass --yes to delete, or --dry-run to only count")
	if out := mustRun(t, nil, append(cleanup, "--dry-run")...); out != "would delete 47 published events older than 0s (dry run: nothing deleted)\n"+
		"would delete 0 dead-lettered events older than 0s (dry run: nothing deleted)\n" {
		t.Fatalf("cleanup --dry-run said %q", out)
	}
	out = mustRun(t, nil, append(cleanup, "--yes")...)
	if want := "deleted 47 published events older than 0s\ndeleted 0 dead-lettered events older than 0s\n"; out != want {
		t.Fatalf("cleanup said %q, want %q", out, want)
	}
	if s := status(t, db, table); s.Pending != 0 || s.DeadLettered != 0 {
		t.Fatalf("after cleanup: %+v", s)
	}
}

func maps2Equal(a, b map[string][2]int64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// deadList runs `outbox dead list --json` with extra filter args and returns the ids.
func deadList(t *testing.T, db, table string, args ...string) []string {
	t.Helper()
	out := mustRun(t, nil, append([]string{"dead", "list", "--db", db, "--table", table, "--json"}, args...)...)
	var dls []deadJSON
	if err := json.Unmarshal([]byte(out), &dls); err != nil {
		t.Fatalf("dead list --json: %v: %s", err, out)
	}
	var ids []string
	for _, d := range dls {
		if d.Attempts != 1 || !strings.Contains(d.LastError, "500") {
			t.Errorf("dead letter %s: attempts %d, last error %q", d.ID, d.Attempts, d.LastError)
		}
		ids = append(ids, d.ID)
	}
	return sorted(ids)
}

// TestDeadLetters: events dead-lettered by a relay whose receiver answers 500 with
// --max-attempts 1; list, retry and purge act exactly on what the filters select; purge
// deletes only with --yes, naming the count without it and printing it with --dry-run.
func TestDeadLetters(t *testing.T) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			db, table := b.fresh(t)
			mustRun(t, nil, "migrate", "--db", db, "--table", table)
			ids := b.publish(t, db, table, []testEvent{
				{"pay.a", "a1", 1}, {"pay.a", "a2", 1}, {"pay.a", "a3", 1},
				{"pay.b", "b1", 1}, {"pay.b", "b2", 1},
				{"ship.c", "", 1},
			})
			payA, payB, ship := ids[0:3], ids[3:5], ids[5]

			rcv := newReceiver(t, http.StatusInternalServerError)
			p := start(t, nil, "relay", "--db", db, "--table", table, "--to", rcv.URL, "--secret", rcv.secret,
				"--allow-prefix", "127.0.0.1", "--max-attempts", "1", "--poll-interval", "50ms")
			p.runUntil(t, "all dead-lettered", func() bool {
				return status(t, db, table).DeadLettered == 6
			})

			all := sorted(ids)
			check := func(what string, got, want []string) {
				t.Helper()
				if !slices.Equal(got, sorted(want)) {
					t.Fatalf("%s: got %v, want %v", what, got, sorted(want))
				}
			}
			check("list", deadList(t, db, table), all)
			check("list --topic pay.*", deadList(t, db, table, "--topic", "pay.*"), append(slices.Clone(payA), payB...))
			check("list --id", deadList(t, db, table, "--id", ship), []string{ship})
			check("list --topic pay.b --id", deadList(t, db, table, "--topic", "pay.b", "--id", ship), append(slices.Clone(payB), ship))
			check("list --older-than 1h", deadList(t, db, table, "--older-than", "1h"), nil)
			check("list --topic nothing", deadList(t, db, table, "--topic", "nothing"), nil)

			out := mustRun(t, nil, "dead", "list", "--db", db, "--table", table, "--limit", "2")
			if lines := strings.Split(strings.TrimSpace(out), "\n"); len(lines) != 3 || !strings.HasPrefix(lines[0], "ID") {
				t.Fatalf("dead list --limit 2 printed %q", out)
			}

			check("list --topics pay.*", deadList(t, db, table, "--topics", "pay.*"), append(slices.Clone(payA), payB...))
			check("list --topic pay.b --topics ship.c", deadList(t, db, table, "--topic", "pay.b", "--topics", "ship.c"), append(slices.Clone(payB), ship))
			r := cli(t, nil, "dead", "list", "--db", db, "--table", table, "--limit", "1")
			if want := "outbox: showing the oldest dead letter; there are more (raise --limit or narrow --topic/--older-than)\n"; r.code != 0 || r.stderr != want {
				t.Fatalf("dead list --limit 1: exit %d, stderr %q, want %q", r.code, r.stderr, want)
			}
			if out := mustRun(t, nil, "dead", "list", "--db", db, "--table", table, "--topic", "nothing"); out != "no dead letters\n" {
				t.Fatalf("dead list --topic nothing said %q", out)
			}

			if out := mustRun(t, nil, "dead", "retry", "--db", db, "--table", table, "--id", payB[0]); out != "retried 1 dead-lettered event\n" {
				t.Fatalf("retry --id said %q", out)
			}
			if out := mustRun(t, nil, "dead", "retry", "--db", db, "--table", table, "--topics", "pay.b"); out != "retried 1 dead-lettered event\n" {
				t.Fatalf("retry --topics said %q", out)
			}
			if s := status(t, db, table); s.Pending != 2 || s.DeadLettered != 4 {
				t.Fatalf("after retry: %+v", s)
			}
			check("list after retry", deadList(t, db, table), append(slices.Clone(payA), ship))

			if out := mustRun(t, nil, "dead", "purge", "--db", db, "--table", table, "--id", ship, "--yes"); out != "purged 1 dead-lettered event\n" {
				t.Fatalf("purge --id said %q", out)
			}
			if out := mustRun(t, nil, "dead", "purge", "--db", db, "--table", table, "--topic", "pay.a", "--older-than", "1h", "--yes"); out != "purged 0 dead-lettered events\n" {
				t.Fatalf("purge --older-than said %q", out)
			}
			check("list after purge", deadList(t, db, table), payA)
			// Without --yes nothing is deleted: the count is named; --dry-run only prints it.
			purgeAll := []string{"dead", "purge", "--db", db, "--table", table, "--topic", "*"}
			wantStderr(t, cli(t, nil, purgeAll...), 2, "outbox: dead purge would purge 3 dead-lettered events; nothing was deleted: pass --yes to delete, or --dry-run to only count")
			wantStderr(t, cli(t, []string{"OUTBOX_YES=true"}, purgeAll...), 2, "outbox: dead purge would purge 3 dead-lettered events; nothing was deleted: pass --yes to delete, or --dry-run to only count")
			if out := mustRun(t, nil, append(purgeAll, "--dry-run")...); out != "would purge 3 dead-lettered events (dry run: nothing deleted)\n" {
				t.Fatalf("purge --dry-run said %q", out)
			}
			wantStderr(t, cli(t, nil, append(purgeAll, "--dry-run", "--yes")...), 2, "outbox: --yes and --dry-run do not go together: --dry-run only counts, --yes deletes")
			check("list after purge without --yes", deadList(t, db, table), payA)
			if out := mustRun(t, nil, append(purgeAll, "--yes")...); out != "purged 3 dead-lettered events\n" {
				t.Fatalf("purge --topic * said %q", out)
			}
			if s := status(t, db, table); s.Pending != 2 || s.DeadLettered != 0 {
				t.Fatalf("after purge: %+v", s)
			}
			if got := topicCounts(status(t, db, table)); !maps2Equal(got, map[string][2]int64{"pay.b": {2, 0}}) {
				t.Fatalf("per topic after purge: %v", got)
			}
		})
	}
}

// summary matches the demo's final line.
var summary = regexp.MustCompile(`(?m)^delivered=(\d+) committed=(\d+) duplicates=(\d+) reordered=(\d+) rolled_back_delivered=(\d+)$`)

// checkDemo checks the demo's exit status and final line: every committed event delivered,
// none reordered, none of a rolled-back transaction.
func checkDemo(t *testing.T, r result) {
	t.Helper()
	if r.code != 0 {
		t.Fatalf("demo exit %d\nstdout: %s\nstderr: %s", r.code, r.stdout, r.stderr)
	}
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	m := summary.FindStringSubmatch(lines[len(lines)-1])
	if m == nil {
		t.Fatalf("last line %q is not the summary", lines[len(lines)-1])
	}
	n := func(i int) int { v, _ := strconv.Atoi(m[i]); return v }
	if n(2) == 0 || n(1) != n(2) || n(4) != 0 || n(5) != 0 {
		t.Fatalf("demo summary %q", m[0])
	}
	t.Logf("%s", r.stdout)
}

// TestDemoSQLite: the zero-set-up demo on its embedded SQLite default.
func TestDemoSQLite(t *testing.T) {
	checkDemo(t, cli(t, []string{"TMPDIR=" + t.TempDir()}, "demo", "--transactions", "400", "--quiet"))
}

// TestDemoPostgres: the demo on PostgreSQL.
func TestDemoPostgres(t *testing.T) {
	pgtest.Require(t)
	checkDemo(t, cli(t, nil, "demo", "--db", pgtest.DSN(), "--transactions", "400", "--writers", "3", "--keys", "20"))
}

// TestDemoKafka: the demo into an in-process Kafka (kfake on loopback), read back with the stock
// watermill-kafka subscriber.
func TestDemoKafka(t *testing.T) {
	pgtest.Require(t)
	c := brokertest.Kafka(t)
	checkDemo(t, cli(t, nil, "demo", "--db", pgtest.DSN(), "--to", "kafka://"+strings.Join(c.ListenAddrs(), ","), "--transactions", "200"))
}

// TestDemoFailure: a demo whose relay cannot deliver (the webhook target refuses every request)
// exits non-zero with one line saying what is missing.
func TestDemoFailure(t *testing.T) {
	pgtest.Require(t)
	rcv := newReceiver(t, http.StatusServiceUnavailable)
	r := cli(t, nil, "demo", "--db", pgtest.DSN(), "--to", rcv.URL, "--allow-prefix", "127.0.0.0/8", "--transactions", "20", "--deadline", "1s")
	if r.code != 1 || !strings.Contains(r.stderr, "committed events were not delivered within --deadline 1s") {
		t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
	}
	if !summary.MatchString(r.stdout) {
		t.Fatalf("no summary line in %q", r.stdout)
	}
}

// TestDemoRedis: the demo into Redis Streams, read back with the stock watermill-redisstream
// subscriber.
func TestDemoRedis(t *testing.T) {
	pgtest.Require(t)
	addr := brokertest.RequireRedis(t)
	checkDemo(t, cli(t, nil, "demo", "--db", pgtest.DSN(), "--to", "redis://"+addr, "--transactions", "200"))
}

// TestDemoRabbitMQ: the demo into RabbitMQ, read back with the stock watermill-amqp subscriber.
func TestDemoRabbitMQ(t *testing.T) {
	pgtest.Require(t)
	url := brokertest.RequireRabbitMQ(t)
	checkDemo(t, cli(t, nil, "demo", "--db", pgtest.DSN(), "--to", url, "--transactions", "200"))
}

// TestDemoWebhook: the demo into an external webhook (here an httptest receiver on loopback,
// allowed with --allow-prefix), counting what the relay marked published; the receiver checks
// the signature made with --secret.
func TestDemoWebhook(t *testing.T) {
	pgtest.Require(t)
	rcv := newReceiver(t, http.StatusOK)
	checkDemo(t, cli(t, nil, "demo", "--db", pgtest.DSN(), "--to", rcv.URL+"/in", "--secret", rcv.secret, "--allow-prefix", "127.0.0.0/8", "--transactions", "200"))
	rcv.mu.Lock()
	defer rcv.mu.Unlock()
	if rcv.badSig != 0 || len(rcv.ids) == 0 {
		t.Fatalf("receiver: %d bad signatures, %d events", rcv.badSig, len(rcv.ids))
	}
}

// TestRelayKafka: the standalone relay into Kafka (kfake on loopback) with --dest-topic; the
// stock watermill-kafka subscriber reads exactly the events written, each key in order.
func TestRelayKafka(t *testing.T) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			db, table := b.fresh(t)
			const topic = "relay-test"
			c := brokertest.Kafka(t, kfake.SeedTopics(3, topic))
			mustRun(t, nil, "migrate", "--db", db, "--table", table)
			var evs []testEvent
			for i := range 30 {
				evs = append(evs, testEvent{topic: fmt.Sprintf("orders.%d", i%2), key: fmt.Sprintf("k%d", i%4), n: i})
			}
			ids := b.publish(t, db, table, evs)

			p := start(t, nil, "relay", "--db", db, "--table", table, "--to", "kafka://"+strings.Join(c.ListenAddrs(), ","),
				"--dest-topic", topic, "--topics", "orders.*", "--poll-interval", "50ms")
			p.runUntil(t, "all delivered", func() bool {
				return status(t, db, table).Pending == 0
			})

			sc := wmkafka.DefaultSaramaSubscriberConfig()
			sc.Consumer.Offsets.Initial = sarama.OffsetOldest
			sub, err := wmkafka.NewSubscriber(wmkafka.SubscriberConfig{Brokers: c.ListenAddrs(), Unmarshaler: wmkafka.DefaultMarshaler{},
				OverwriteSaramaConfig: sc, ConsumerGroup: "test"}, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer sub.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			msgs, err := sub.Subscribe(ctx, topic)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			order := map[string][]int{}
			for len(got) < len(ids) {
				select {
				case m := <-msgs:
					var pl struct {
						Key string `json:"key"`
						N   int    `json:"n"`
					}
					_ = json.Unmarshal(m.Payload, &pl)
					if !slices.Contains(got, m.UUID) {
						got = append(got, m.UUID)
						order[pl.Key] = append(order[pl.Key], pl.N)
					}
					if m.Metadata.Get(outbox.MetadataOrderingKey) != pl.Key {
						t.Errorf("event %s: ordering key metadata %q, want %q", m.UUID, m.Metadata.Get(outbox.MetadataOrderingKey), pl.Key)
					}
					m.Ack()
				case <-ctx.Done():
					t.Fatalf("read %d of %d events from Kafka", len(got), len(ids))
				}
			}
			if !slices.Equal(sorted(got), sorted(ids)) {
				t.Fatalf("Kafka holds other events than written")
			}
			for k, ns := range order {
				if !slices.IsSorted(ns) {
					t.Errorf("key %s out of order: %v", k, ns)
				}
			}
		})
	}
}

// TestDestinationErrors: an unreachable broker fails the demo with exit status 1 and one line
// naming the address and the fix (the relay waits for it: TestRelayStartsWithBrokerDown).
func TestDestinationErrors(t *testing.T) {
	db := "sqlite://" + filepath.Join(t.TempDir(), "outbox.db")
	mustRun(t, nil, "migrate", "--db", db)
	addr := brokertest.ClosedPort(t)
	for _, tc := range []struct{ to, what string }{
		{"redis://" + addr, "cannot connect to Redis at " + addr},
		{"amqp://guest:guest@" + addr + "/", "cannot connect to RabbitMQ at " + addr},
		{"kafka://" + addr, "cannot connect to Kafka at"},
	} {
		wantFailure(t, cli(t, []string{"TMPDIR=" + t.TempDir()}, "demo", "--quiet", "--to", tc.to), 1, tc.what, addr, "check that")
	}
}
