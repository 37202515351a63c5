package main

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/watermill-outbox/outbox/doctor"
	"github.com/watermill-outbox/outbox/internal/brokertest"
	"github.com/watermill-outbox/outbox/internal/mariadbtest"
	"github.com/watermill-outbox/outbox/internal/privatepg"
	"github.com/watermill-outbox/outbox/internal/privatepgbouncer"
)

// doctorJSON runs `outbox doctor --json` with args and returns the verdict of each check by
// name, the checks, and the run.
func doctorJSON(t *testing.T, args ...string) (map[string]doctor.Verdict, []doctor.Check, result) {
	t.Helper()
	r := cli(t, nil, append([]string{"doctor", "--json"}, args...)...)
	var checks []doctor.Check
	if err := json.Unmarshal([]byte(r.stdout), &checks); err != nil {
		t.Fatalf("doctor --json (exit %d): %v\nstdout: %s\nstderr: %s", r.code, err, r.stdout, r.stderr)
	}
	got := map[string]doctor.Verdict{}
	for _, c := range checks {
		if _, dup := got[c.Name]; dup {
			t.Fatalf("check %q listed twice: %+v", c.Name, checks)
		}
		got[c.Name] = c.Verdict
		if (c.Verdict == doctor.Warn || c.Verdict == doctor.Fail) && c.Fix == "" {
			t.Errorf("check %q is %s without a fix: %+v", c.Name, c.Verdict, c)
		}
		if c.Verdict == doctor.OK && c.Fix != "" {
			t.Errorf("check %q is ok with a fix: %+v", c.Name, c)
		}
		if c.Detail == "" {
			t.Errorf("check %q has no detail", c.Name)
		}
	}
	return got, checks, r
}

// wantDoctor runs doctor and checks the exact verdict of every check and the exit status (1
// when a check fails, else 0).
func wantDoctor(t *testing.T, want map[string]doctor.Verdict, args ...string) []doctor.Check {
	t.Helper()
	got, checks, r := doctorJSON(t, args...)
	if !maps.Equal(got, want) {
		var b strings.Builder
		for _, c := range checks {
			fmt.Fprintf(&b, "\n  %s %s: %s", c.Name, c.Verdict, c.Detail)
		}
		t.Fatalf("verdicts:\n got %v\nwant %v%s", got, want, b.String())
	}
	code := 0
	for _, v := range want {
		if v == doctor.Fail {
			code = 1
		}
	}
	if r.code != code {
		t.Fatalf("exit status %d, want %d; stderr: %s", r.code, code, r.stderr)
	}
	return checks
}

// with returns base with the changes applied.
func with(base map[string]doctor.Verdict, changes map[string]doctor.Verdict) map[string]doctor.Verdict {
	out := maps.Clone(base)
	maps.Copy(out, changes)
	return out
}

// detailOf returns the detail of check name.
func detailOf(checks []doctor.Check, name string) string {
	for _, c := range checks {
		if c.Name == name {
			return c.Detail
		}
	}
	return ""
}

// pgHealthy are the verdicts on a healthy PostgreSQL (direct connections, JIT off for the role).
var pgHealthy = map[string]doctor.Verdict{
	"server-version": doctor.OK, "schema": doctor.OK, "pooler": doctor.OK, "wake-probe": doctor.OK,
	"listen-notify": doctor.OK, "wal-level": doctor.OK, "replication-slot": doctor.Skipped,
	"idle-in-transaction": doctor.OK, "oldest-xmin": doctor.OK, "autovacuum": doctor.OK,
	"dead-tuples": doctor.OK, "jit": doctor.OK,
}

// TestDoctorPostgres: on a private PostgreSQL (cluster-wide settings and sessions of its own),
// every check passes on a healthy set-up, and each problem made on purpose fails (or warns
// about) exactly its check; each subtest restores what it changed.
func TestDoctorPostgres(t *testing.T) {
	srv := privatepg.Start(t)
	dsn := srv.DSN()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	sql := func(q string) {
		t.Helper()
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	// PostgreSQL 15 turns JIT on by default: the healthy set-up turns it off for the role.
	sql("ALTER ROLE postgres SET jit = off")
	const table = "doctor_outbox"
	mustRun(t, nil, "migrate", "--db", dsn, "--table", table)
	db := []string{"--db", dsn, "--table", table}

	t.Run("healthy", func(t *testing.T) {
		wantDoctor(t, pgHealthy, db...)
		// The table form: one line per check, the summary, exit 0.
		out := mustRun(t, nil, append([]string{"doctor"}, db...)...)
		for _, want := range []string{"ok       schema ", "skipped  replication-slot ", "11 ok, 0 warn, 0 fail, 1 skipped"} {
			if !strings.Contains(out, want) {
				t.Errorf("doctor output lacks %q:\n%s", want, out)
			}
		}
	})

	t.Run("idle transaction", func(t *testing.T) {
		conn, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Release()
		if _, err := conn.Exec(ctx, "BEGIN ISOLATION LEVEL REPEATABLE READ"); err != nil {
			t.Fatal(err)
		}
		defer func() { _, _ = conn.Exec(ctx, "ROLLBACK") }()
		var pid int
		if err := conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 10*time.Second, "the transaction idle for 1.2s", func() bool {
			var n int
			err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND state = 'idle in transaction'
				AND backend_xmin IS NOT NULL AND now() - state_change > interval '1.2 s'`, pid).Scan(&n)
			return err == nil && n == 1
		})
		checks := wantDoctor(t, with(pgHealthy, map[string]doctor.Verdict{"idle-in-transaction": doctor.Fail, "oldest-xmin": doctor.Fail}),
			append(db, "--old-tx-warn", "500ms", "--old-tx-fail", "1s")...)
		for _, name := range []string{"idle-in-transaction", "oldest-xmin"} {
			if d := detailOf(checks, name); !strings.Contains(d, fmt.Sprintf("pid %d ", pid)) {
				t.Errorf("%s does not name pid %d: %s", name, pid, d)
			}
		}
		// Between the thresholds: a warning, exit 0.
		wantDoctor(t, with(pgHealthy, map[string]doctor.Verdict{"idle-in-transaction": doctor.Warn, "oldest-xmin": doctor.Warn}),
			append(db, "--old-tx-warn", "500ms", "--old-tx-fail", "1h")...)
	})

	t.Run("autovacuum off", func(t *testing.T) {
		sql(`ALTER TABLE doctor_outbox SET (autovacuum_enabled = false)`)
		defer sql(`ALTER TABLE doctor_outbox RESET (autovacuum_enabled)`)
		wantDoctor(t, with(pgHealthy, map[string]doctor.Verdict{"autovacuum": doctor.Fail}), db...)
	})

	t.Run("jit on", func(t *testing.T) {
		sql("ALTER ROLE postgres SET jit = on")
		defer sql("ALTER ROLE postgres SET jit = off")
		checks := wantDoctor(t, with(pgHealthy, map[string]doctor.Verdict{"jit": doctor.Warn}), db...)
		for _, c := range checks {
			if c.Name == "jit" && !strings.Contains(c.Fix, `ALTER ROLE "postgres" SET jit = off`) {
				t.Errorf("jit fix: %q", c.Fix)
			}
		}
	})

	t.Run("missing index", func(t *testing.T) {
		sql(`DROP INDEX doctor_outbox_key_idx`)
		defer mustRun(t, nil, "migrate", "--db", dsn, "--table", table)
		checks := wantDoctor(t, with(pgHealthy, map[string]doctor.Verdict{"schema": doctor.Fail}), db...)
		if d := detailOf(checks, "schema"); !strings.Contains(d, "doctor_outbox_key_idx") {
			t.Errorf("schema detail does not name the index: %s", d)
		}
	})

	t.Run("missing table", func(t *testing.T) {
		wantDoctor(t, with(pgHealthy, map[string]doctor.Verdict{"schema": doctor.Fail, "wake-probe": doctor.Skipped, "autovacuum": doctor.Skipped, "dead-tuples": doctor.Skipped}),
			"--db", dsn, "--table", "doctor_no_such_table")
	})

	t.Run("pgbouncer", func(t *testing.T) {
		b := privatepgbouncer.Start(t, dsn)
		// LISTEN through a transaction pooler: the relays' wakeup/pgnotify would never be woken.
		wantDoctor(t, with(pgHealthy, map[string]doctor.Verdict{"pooler": doctor.Warn, "listen-notify": doctor.Fail}),
			"--db", b.DSN("default_query_exec_mode=exec"), "--table", table, "--wakeup", "listen")
		// The same for relays that use the wake probe: warnings only.
		wantDoctor(t, with(pgHealthy, map[string]doctor.Verdict{"pooler": doctor.Warn, "listen-notify": doctor.Warn}),
			"--db", b.DSN("default_query_exec_mode=exec"), "--table", table)
		// pgx's default exec mode prepares statements that clash on shared server sessions.
		checks := wantDoctor(t, with(pgHealthy, map[string]doctor.Verdict{"pooler": doctor.Fail, "listen-notify": doctor.Warn}),
			"--db", b.DSN(""), "--table", table)
		if d := detailOf(checks, "pooler"); !strings.Contains(d, "cache_statement") {
			t.Errorf("pooler detail: %s", d)
		}
	})

	t.Run("replication slot", func(t *testing.T) {
		wantDoctor(t, with(pgHealthy, map[string]doctor.Verdict{"wal-level": doctor.Fail, "replication-slot": doctor.Fail}),
			append(db, "--slot", "doctor_no_such_slot")...)
	})
}

// TestDoctorSQLite: the checks that apply to SQLite pass on a migrated file; the others are
// skipped.
func TestDoctorSQLite(t *testing.T) {
	b := sqliteBackend()
	db, table := b.fresh(t)
	mustRun(t, nil, "migrate", "--db", db, "--table", table)
	wantDoctor(t, map[string]doctor.Verdict{
		"server-version": doctor.OK, "schema": doctor.OK, "pooler": doctor.Skipped, "wake-probe": doctor.Skipped,
		"listen-notify": doctor.Skipped, "wal-watch": doctor.OK, "wal-level": doctor.Skipped, "replication-slot": doctor.Skipped,
		"idle-in-transaction": doctor.Skipped, "oldest-xmin": doctor.Skipped, "autovacuum": doctor.Skipped,
		"dead-tuples": doctor.Skipped, "jit": doctor.Skipped,
	}, "--db", db, "--table", table)
}

// TestDoctorMariaDB: the checks that apply to MariaDB pass on a migrated table (the shared
// server: the transaction thresholds are set high so that other tests' transactions do not
// count), a dropped index fails the schema check, and a transaction left idle fails both
// transaction checks.
func TestDoctorMariaDB(t *testing.T) {
	b := mariadbBackend()
	db, table := b.fresh(t)
	mustRun(t, nil, "migrate", "--db", db, "--table", table)
	healthy := map[string]doctor.Verdict{
		"server-version": doctor.OK, "schema": doctor.OK, "pooler": doctor.Skipped, "wake-probe": doctor.Skipped,
		"listen-notify": doctor.Skipped, "wal-level": doctor.Skipped, "replication-slot": doctor.Skipped,
		"idle-in-transaction": doctor.OK, "oldest-xmin": doctor.OK, "autovacuum": doctor.Skipped,
		"dead-tuples": doctor.Skipped, "jit": doctor.Skipped,
	}
	args := []string{"--db", db, "--table", table, "--old-tx-warn", "1h", "--old-tx-fail", "2h"}
	wantDoctor(t, healthy, args...)
	if _, err := mariadbtest.Raw(t).Exec(fmt.Sprintf("DROP INDEX `%s_dead_idx` ON `%s`", table, table)); err != nil {
		t.Fatal(err)
	}
	wantDoctor(t, with(healthy, map[string]doctor.Verdict{"schema": doctor.Fail}), args...)

	// A transaction of this test left idle: both transaction checks fail (other tests'
	// transactions on the shared server can only add to that).
	ctx := context.Background()
	conn, err := mariadbtest.Raw(t).Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "START TRANSACTION WITH CONSISTENT SNAPSHOT"); err != nil {
		t.Fatal(err)
	}
	// A read in it, so that InnoDB lists the transaction whatever the server's version.
	var rows int
	if err := conn.QueryRowContext(ctx, fmt.Sprintf("SELECT COUNT(*) FROM `%s`", table)).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	defer func() { _, _ = conn.ExecContext(ctx, "ROLLBACK") }()
	var id int64
	if err := conn.QueryRowContext(ctx, "SELECT CONNECTION_ID()").Scan(&id); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the transaction idle for 2s", func() bool {
		var n int
		err := mariadbtest.Raw(t).QueryRow(`SELECT COUNT(*) FROM information_schema.PROCESSLIST p
			WHERE p.ID = ? AND p.COMMAND = 'Sleep' AND p.TIME >= 2`, id).Scan(&n)
		return err == nil && n == 1
	})
	wantDoctor(t, with(healthy, map[string]doctor.Verdict{"schema": doctor.Fail, "idle-in-transaction": doctor.Fail, "oldest-xmin": doctor.Fail}),
		"--db", db, "--table", table, "--old-tx-warn", "500ms", "--old-tx-fail", "1s")
}

// sqliteHealthy are the database verdicts of a migrated SQLite file (the destination tests'
// database).
var sqliteHealthy = map[string]doctor.Verdict{
	"server-version": doctor.OK, "schema": doctor.OK, "pooler": doctor.Skipped, "wake-probe": doctor.Skipped,
	"listen-notify": doctor.Skipped, "wal-watch": doctor.OK, "wal-level": doctor.Skipped, "replication-slot": doctor.Skipped,
	"idle-in-transaction": doctor.Skipped, "oldest-xmin": doctor.Skipped, "autovacuum": doctor.Skipped,
	"dead-tuples": doctor.Skipped, "jit": doctor.Skipped,
}

// TestDoctorDestinations: with --to, each destination's check passes on a good set-up and
// fails on the problem made on purpose: a missing RabbitMQ queue (named, or a pending topic's
// through the default exchange), Redis evicting keys, Kafka down, a webhook the address guard
// refuses.
func TestDoctorDestinations(t *testing.T) {
	b := sqliteBackend()
	db, table := b.fresh(t)
	mustRun(t, nil, "migrate", "--db", db, "--table", table)
	base := []string{"--db", db, "--table", table}
	run := func(t *testing.T, dest map[string]doctor.Verdict, args ...string) []doctor.Check {
		t.Helper()
		want := maps.Clone(sqliteHealthy)
		maps.Copy(want, dest)
		return wantDoctor(t, want, append(append([]string{}, base...), args...)...)
	}

	t.Run("rabbitmq", func(t *testing.T) {
		url := brokertest.RequireRabbitMQ(t)
		suffix := strings.ToLower(sanitizeName(t.Name())) + fmt.Sprint(time.Now().UnixNano())
		present, missing := "doctor_present_"+suffix, "doctor_missing_"+suffix
		declareQueue(t, url, present)
		run(t, map[string]doctor.Verdict{"rabbitmq": doctor.OK, "rabbitmq-queues": doctor.OK}, "--to", url, "--amqp-queue", present)
		checks := run(t, map[string]doctor.Verdict{"rabbitmq": doctor.OK, "rabbitmq-queues": doctor.Fail}, "--to", url, "--amqp-queue", present+","+missing)
		if d := detailOf(checks, "rabbitmq-queues"); !strings.Contains(d, missing) || strings.Contains(d, present) {
			t.Errorf("rabbitmq-queues detail: %s", d)
		}
		// Through the default exchange, each pending topic must name a queue.
		run(t, map[string]doctor.Verdict{"rabbitmq": doctor.OK, "rabbitmq-queues": doctor.Skipped}, "--to", url)
		topic := "doctor_topic_" + suffix
		b.publish(t, db, table, []testEvent{{topic: topic, key: "k"}})
		run(t, map[string]doctor.Verdict{"rabbitmq": doctor.OK, "rabbitmq-queues": doctor.Fail}, "--to", url)
		declareQueue(t, url, topic)
		run(t, map[string]doctor.Verdict{"rabbitmq": doctor.OK, "rabbitmq-queues": doctor.OK}, "--to", url)
		// A missing exchange.
		run(t, map[string]doctor.Verdict{"rabbitmq": doctor.Fail, "rabbitmq-queues": doctor.Skipped}, "--to", url, "--amqp-exchange", "doctor_no_exchange_"+suffix)
	})

	t.Run("redis", func(t *testing.T) {
		good, startGood := brokertest.PrivateRedis(t)
		startGood()
		run(t, map[string]doctor.Verdict{"redis-eviction": doctor.OK}, "--to", "redis://"+good)
		run(t, map[string]doctor.Verdict{"redis-eviction": doctor.OK}, "--to", "asynq+redis://"+good)
		lru, startLRU := brokertest.PrivateRedis(t, "--maxmemory", "100mb", "--maxmemory-policy", "allkeys-lru")
		startLRU()
		checks := run(t, map[string]doctor.Verdict{"redis-eviction": doctor.Fail}, "--to", "redis://"+lru)
		if d := detailOf(checks, "redis-eviction"); !strings.Contains(d, "allkeys-lru") {
			t.Errorf("redis-eviction detail: %s", d)
		}
		run(t, map[string]doctor.Verdict{"redis-eviction": doctor.Fail}, "--to", "asynq+redis://"+lru)
	})

	t.Run("kafka", func(t *testing.T) {
		c := brokertest.Kafka(t)
		run(t, map[string]doctor.Verdict{"kafka": doctor.OK}, "--to", "kafka://"+strings.Join(c.ListenAddrs(), ","))
		run(t, map[string]doctor.Verdict{"kafka": doctor.Fail}, "--to", "kafka://"+brokertest.ClosedPort(t))
	})

	t.Run("webhook", func(t *testing.T) {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) }))
		defer srv.Close()
		run(t, map[string]doctor.Verdict{"webhook-guard": doctor.Fail}, "--to", srv.URL+"/hook")
		run(t, map[string]doctor.Verdict{"webhook-guard": doctor.OK}, "--to", srv.URL+"/hook", "--allow-prefix", "127.0.0.0/8")
		run(t, map[string]doctor.Verdict{"webhook-guard": doctor.Warn}, "--to", "http://"+brokertest.ClosedPort(t)+"/hook", "--allow-prefix", "127.0.0.0/8")
	})
}

// TestDoctorUsage: a missing --db or a bad flag value is a usage error (exit 2) before any
// connection.
func TestDoctorUsage(t *testing.T) {
	wantFailure(t, cli(t, nil, "doctor"), 2, "--db is required", "OUTBOX_DB")
	wantFailure(t, cli(t, nil, "doctor", "--db", "x.db", "--wakeup", "notify"), 2, `--wakeup "notify"`, `"probe"`, `"listen"`)
	wantFailure(t, cli(t, nil, "doctor", "--db", "x.db", "--old-tx-warn", "1h", "--old-tx-fail", "1m"), 2, "--old-tx-fail must not be below --old-tx-warn")
	wantFailure(t, cli(t, nil, "doctor", "--db", "x.db", "--to", "ftp://127.0.0.1/"), 2, "ftp://127.0.0.1/")
	wantFailure(t, cli(t, []string{"OUTBOX_WAKEUP=notify"}, "doctor", "--db", "x.db"), 2, `environment variable OUTBOX_WAKEUP="notify" (it sets --wakeup)`)
}
