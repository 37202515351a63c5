package main

import (
	"database/sql"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/watermill-outbox/outbox/internal/pgtest"
)

// deadLetterAll marks every event of the SQLite outbox table dead-lettered (attempts 1,
// last error "500"), as a relay with --max-attempts 1 and a receiver answering 500 would.
func deadLetterAll(t *testing.T, db, table string) {
	t.Helper()
	u, err := parseDBURL(db)
	if err != nil {
		t.Fatal(err)
	}
	sdb, err := sql.Open("sqlite", sqliteDSN(u.File()))
	if err != nil {
		t.Fatal(err)
	}
	defer sdb.Close()
	if _, err := sdb.Exec(`UPDATE "`+table+`" SET attempts = 1, last_error = 'receiver answered 500', dead_lettered_at = ?`, time.Now().Add(-time.Minute).UnixMicro()); err != nil {
		t.Fatal(err)
	}
}

// TestPurgeByIDNotWidenedByEnv: the defect this guards against: the on-call engineer runs `dead purge --id X` in the
// relay's environment (a container exec, the relay's systemd EnvironmentFile), where
// OUTBOX_TOPICS is relay --topics' documented variable. dead purge reads it through its hidden
// --topics spelling and ORs it with --id: it purges every dead letter of the relay's topics.
func TestPurgeByIDNotWidenedByEnv(t *testing.T) {
	b := sqliteBackend()
	db, table := b.fresh(t)
	mustRun(t, nil, "migrate", "--db", db, "--table", table)
	ids := b.publish(t, db, table, []testEvent{{"orders.a", "k1", 1}, {"orders.b", "k2", 1}, {"pay.x", "k3", 1}})
	deadLetterAll(t, db, table)

	r := cli(t, []string{"OUTBOX_TOPICS=orders.*"}, "dead", "purge", "--db", db, "--table", table, "--id", ids[2], "--yes")
	left := deadList(t, db, table)
	if r.code != 0 || r.stdout != "purged 1 dead-lettered event\n" || len(left) != 2 {
		t.Fatalf("dead purge --id %s with OUTBOX_TOPICS=orders.* in the environment: exit %d, said %q; dead letters left %d, want 2 (only the one id purged)",
			ids[2], r.code, r.stdout, len(left))
	}
}

// TestRetryByIDNotWidenedByEnv: the defect this guards against: the same with the documented OUTBOX_TOPIC: a selection given
// on the command line (--id) does not win over the environment's --topic, the two are ORed.
func TestRetryByIDNotWidenedByEnv(t *testing.T) {
	b := sqliteBackend()
	db, table := b.fresh(t)
	mustRun(t, nil, "migrate", "--db", db, "--table", table)
	ids := b.publish(t, db, table, []testEvent{{"orders.a", "k1", 1}, {"orders.b", "k2", 1}, {"pay.x", "k3", 1}})
	deadLetterAll(t, db, table)

	r := cli(t, []string{"OUTBOX_TOPIC=*"}, "dead", "retry", "--db", db, "--table", table, "--id", ids[0])
	if r.code != 0 || r.stdout != "retried 1 dead-lettered event\n" {
		t.Fatalf("dead retry --id with OUTBOX_TOPIC=* in the environment: exit %d, said %q, want only the one id retried", r.code, r.stdout)
	}
}

// TestQueryPasswordHidden: the defect this guards against: a PostgreSQL URL with its password as a query parameter (pgx
// accepts ?password=) is printed whole in errors and in the migrate hint.
func TestQueryPasswordHidden(t *testing.T) {
	const pw = "hunter2-s3cret"
	r := cli(t, nil, "status", "--db", "postgres://app@127.0.0.1:1/app?sslmode=disable&password="+pw)
	if r.code == 0 || strings.Contains(r.stderr, pw) {
		t.Errorf("connection error shows the password: exit %d: %s", r.code, r.stderr)
	}
	pgtest.Require(t)
	sep := "?"
	if strings.Contains(pgtest.DSN(), "?") {
		sep = "&"
	}
	r = cli(t, nil, "status", "--db", pgtest.DSN()+sep+"password="+pw, "--table", "review_cli_no_such_table")
	if r.code == 0 || strings.Contains(r.stderr, pw) {
		t.Errorf("table-not-found error shows the password: exit %d: %s", r.code, r.stderr)
	}
}

// TestWebhookDeliveryTimeout: the defect this guards against: relay --help says --delivery-timeout 0 means min(30s,
// lease/2) and the start line says delivery-timeout=30s, but the webhook gets Timeout 0 and
// so its own 10s default: a receiver answering in 12s never gets an event delivered.
func TestWebhookDeliveryTimeout(t *testing.T) {
	b := sqliteBackend()
	db, table := b.fresh(t)
	mustRun(t, nil, "migrate", "--db", db, "--table", table)
	b.publish(t, db, table, []testEvent{{"orders.a", "k1", 1}})
	var answered atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-time.After(12 * time.Second):
		case <-r.Context().Done():
			return
		}
		answered.Add(1)
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	p := start(t, nil, "relay", "--db", db, "--table", table, "--to", srv.URL, "--allow-prefix", "127.0.0.1", "--poll-interval", "50ms")
	deadline := time.Now().Add(25 * time.Second)
	for time.Now().Before(deadline) && status(t, db, table).Pending != 0 {
		time.Sleep(200 * time.Millisecond)
	}
	code := p.stop(t)
	if !strings.Contains(p.errb.String(), "delivery-timeout=30s") {
		t.Fatalf("start line does not say delivery-timeout=30s: %s", p.errb.String())
	}
	if s := status(t, db, table); s.Pending != 0 || strings.Contains(p.errb.String(), "delivery failed") {
		t.Fatalf("a 12s delivery under delivery-timeout=30s failed (exit %d, pending %d):\n%s", code, s.Pending, p.errb.String())
	}
}

// TestRelayTopicsEnvWins: the defect this guards against: OUTBOX_TOPICS is relay --topics' documented
// variable, OUTBOX_TOPIC the dead commands' (left in the shell after dead-letter work). With
// both set the relay relays OUTBOX_TOPIC's topics (its hidden --topic spelling is visited
// first) instead of the ones its own documented variable names.
func TestRelayTopicsEnvWins(t *testing.T) {
	b := sqliteBackend()
	db, table := b.fresh(t)
	mustRun(t, nil, "migrate", "--db", db, "--table", table)
	rcv := newReceiver(t, http.StatusNoContent)
	p := start(t, []string{"OUTBOX_TOPICS=orders.*", "OUTBOX_TOPIC=pay.x"}, "relay", "--db", db, "--table", table,
		"--to", rcv.URL, "--secret", rcv.secret, "--allow-prefix", "127.0.0.1")
	waitFor(t, 20*time.Second, "start line", func() bool { return strings.Contains(p.errb.String(), "outbox relay starting") })
	p.stop(t)
	if !strings.Contains(p.errb.String(), "topics=[orders.*]") {
		t.Fatalf("relay with OUTBOX_TOPICS=orders.* (and a stray OUTBOX_TOPIC=pay.x) does not relay orders.*:\n%s", p.errb.String())
	}
}

// TestInboxTableNotFromOutboxEnv: the defect this guards against: OUTBOX_TABLE is the outbox table of migrate, relay,
// status, dead and cleanup; the inbox commands read the same variable as their *inbox* table.
// In the relay's environment `outbox inbox migrate` then says the inbox table is ready while
// it created none, and adds an index to the outbox table (SQLite: on the literal string
// "processed_at").
func TestInboxTableNotFromOutboxEnv(t *testing.T) {
	b := sqliteBackend()
	db, table := b.fresh(t)
	mustRun(t, nil, "migrate", "--db", db, "--table", table)
	r := cli(t, []string{"OUTBOX_TABLE=" + table}, "inbox", "migrate", "--db", db)
	u, _ := parseDBURL(db)
	sdb, err := sql.Open("sqlite", sqliteDSN(u.File()))
	if err != nil {
		t.Fatal(err)
	}
	defer sdb.Close()
	var idx []string
	rows, err := sdb.Query(`SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = ? AND name LIKE '%processed%'`, table)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var n string
		_ = rows.Scan(&n)
		idx = append(idx, n)
	}
	rows.Close()
	if len(idx) > 0 || (r.code == 0 && strings.Contains(r.stdout, table)) {
		t.Fatalf("inbox migrate with OUTBOX_TABLE=%s: exit %d, said %q; inbox indexes added to the outbox table: %v", table, r.code, r.stdout, idx)
	}
}

// TestBenchStopDropsTables: the defect this guards against: bench promises tables "created, then dropped"; a SIGTERM
// (or Ctrl-C) kills it without dropping them (no signal handling), leaving outbox_bench_*
// tables, with their events, in the database.
func TestBenchStopDropsTables(t *testing.T) {
	pool := pgtest.Require(t)
	p := start(t, nil, "bench", "--db", pgtest.DSN(), "--only", "latency", "--duration", "20s", "--rate", "50", "--held-snapshot=false")
	var base string
	waitFor(t, 30*time.Second, "bench start line", func() bool {
		s := p.out.String()
		if i := strings.Index(s, "tables "); i >= 0 {
			if j := strings.Index(s[i:], "_*"); j > 0 {
				base = s[i+len("tables ") : i+j]
				return true
			}
		}
		return false
	})
	waitFor(t, 30*time.Second, "bench's tables created", func() bool {
		var n int
		_ = pool.QueryRow(t.Context(), "SELECT count(*) FROM pg_tables WHERE tablename LIKE $1", base+"%").Scan(&n)
		return n > 0
	})
	p.stop(t)
	var left []string
	rows, err := pool.Query(t.Context(), "SELECT tablename FROM pg_tables WHERE tablename LIKE $1", base+"%")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var n string
		_ = rows.Scan(&n)
		left = append(left, n)
	}
	rows.Close()
	for _, n := range left {
		_, _ = pool.Exec(t.Context(), `DROP TABLE IF EXISTS "`+n+`"`)
	}
	if len(left) > 0 {
		t.Fatalf("bench stopped with SIGTERM left its tables: %v", left)
	}
}

// TestRelayStopDuringStartExitsZero: the defect this guards against: relay --help says it stops gracefully on SIGTERM
// and then exits 0; a SIGTERM while it is still connecting to its destination (a rolling
// deploy stopping a starting pod) exits 1 blaming the destination ("i/o timeout").
func TestRelayStopDuringStartExitsZero(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0") // accepts, never answers: a Redis that hangs
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	b := sqliteBackend()
	db, table := b.fresh(t)
	mustRun(t, nil, "migrate", "--db", db, "--table", table)
	p := start(t, nil, "relay", "--db", db, "--table", table, "--to", "redis://"+ln.Addr().String())
	time.Sleep(1500 * time.Millisecond)
	if code := p.stop(t); code != 0 {
		t.Fatalf("relay stopped with SIGTERM during start: exit %d, stderr %q", code, p.errb.String())
	}
}

// TestRelayNameWithSeveralTopics: relay --relay-name with several --topics patterns runs one
// Subscriber per pattern, each under a name of its own (name/0, name/1 …): with one name, the
// second Subscriber's start took back the first's live leases ("took back the unexpired leases
// of an earlier relay of this name"), and their events were delivered again.
func TestRelayNameWithSeveralTopics(t *testing.T) {
	b := sqliteBackend()
	db, table := b.fresh(t)
	mustRun(t, nil, "migrate", "--db", db, "--table", table)
	var evs []testEvent
	for i := range 50 {
		evs = append(evs, testEvent{"a.x", "k", i}, testEvent{"b.x", "k", i})
	}
	ids := b.publish(t, db, table, evs)
	rcv := newReceiver(t, http.StatusNoContent)
	p := start(t, nil, "relay", "--db", db, "--table", table, "--to", rcv.URL, "--secret", rcv.secret, "--allow-prefix", "127.0.0.1",
		"--relay-name", "r", "--topics", "a.*", "--topics", "b.*", "--debug")
	waitFor(t, 30*time.Second, "every event delivered", func() bool { return len(rcv.received()) == len(ids) })
	p.stop(t)
	logs := p.errb.String()
	if strings.Contains(logs, "took back the unexpired leases") || !strings.Contains(logs, "relay=r/0") || !strings.Contains(logs, "relay=r/1") {
		t.Fatalf("relay --relay-name r with two --topics: want subscriptions r/0 and r/1 and no lease taken back; logs:\n%s", logs)
	}
}
