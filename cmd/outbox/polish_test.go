package main

import (
	"context"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/watermill-outbox/outbox/internal/brokertest"
	"github.com/watermill-outbox/outbox/internal/pgtest"
)

// wantStderr checks that r failed with exit status code and printed exactly msg on stderr.
func wantStderr(t *testing.T, r result, code int, msg string) {
	t.Helper()
	if r.code != code || r.stderr != msg+"\n" {
		t.Fatalf("exit %d, stderr %q\nwant exit %d, stderr %q", r.code, r.stderr, code, msg+"\n")
	}
}

// TestTopicFlagSpellings: --topic and --topics both work on relay and on dead list/retry/purge;
// each command's --help documents one spelling only.
func TestTopicFlagSpellings(t *testing.T) {
	for _, args := range [][]string{
		{"dead", "list", "--db", "x.db", "--topics", "a*b"},
		{"dead", "retry", "--db", "x.db", "--topics", "a*b"},
		{"dead", "purge", "--db", "x.db", "--topic", "ok", "--topics", "a*b"},
	} {
		wantStderr(t, cli(t, nil, args...), 2, `outbox: --topic "a*b" is not a topic pattern: use an exact topic, a prefix ending in '*' ("orders.*") or '*' for all`)
	}
	for _, flag := range []string{"--topic", "--topics"} {
		wantStderr(t, cli(t, nil, "relay", "--db", "x.db", "--to", "http://127.0.0.1/", flag, "a*b"), 2,
			`outbox: topic pattern "a*b": use an exact topic, a prefix ending in '*' ("orders.*") or '*' for all`)
	}
	// The hidden spelling has no environment variable: OUTBOX_TOPICS is relay --topics' own.
	wantStderr(t, cli(t, []string{"OUTBOX_TOPICS=a*b"}, "dead", "list", "--db", "x.db"), 1,
		`outbox: SQLite file "x.db" does not exist, so it has no outbox table: create it with `+"`outbox migrate --db x.db`")
	// A flag given on the command line wins over the other spelling's environment variable.
	wantStderr(t, cli(t, []string{"OUTBOX_TOPIC=a*b"}, "dead", "list", "--db", "x.db", "--topics", "ok"), 1,
		`outbox: SQLite file "x.db" does not exist, so it has no outbox table: create it with `+"`outbox migrate --db x.db`")

	documented := regexp.MustCompile(`(?m)^\s+--topic `)
	documentedS := regexp.MustCompile(`(?m)^\s+--topics `)
	for _, sub := range []string{"list", "retry", "purge"} {
		help := mustRun(t, nil, "dead", sub, "--help")
		if !documented.MatchString(help) || documentedS.MatchString(help) {
			t.Fatalf("dead %s --help should document --topic and not --topics:\n%s", sub, help)
		}
	}
	help := mustRun(t, nil, "relay", "--help")
	if !documentedS.MatchString(help) || documented.MatchString(help) {
		t.Fatalf("relay --help should document --topics and not --topic:\n%s", help)
	}
}

// TestNegativeDurations: a negative age names its flag.
func TestNegativeDurations(t *testing.T) {
	wantStderr(t, cli(t, nil, "cleanup", "--db", "x.db", "--published-older-than", "-1h"), 2,
		"outbox: --published-older-than -1h0m0s is negative: give a duration such as 168h, or 0s for every published event")
	wantStderr(t, cli(t, nil, "cleanup", "--db", "x.db", "--published-older-than", "1h", "--dead-older-than", "-30m"), 2,
		"outbox: --dead-older-than -30m0s is negative: give a duration such as 720h, or 0s for every dead letter")
	wantStderr(t, cli(t, nil, "dead", "list", "--db", "x.db", "--older-than", "-1h"), 2,
		"outbox: --older-than -1h0m0s is negative: give a duration such as 24h, or 0 for any age")
}

// TestKafkaConnectError: the demo says the same about an unreachable Kafka as about Redis:
// host:port list and the --to URL, no Go slice. (The relay starts with a broker down and treats
// it as an outage: TestRelayStartsWithBrokerDown.)
func TestKafkaConnectError(t *testing.T) {
	addr := brokertest.ClosedPort(t)
	to := "kafka://" + addr
	re := regexp.MustCompile(`^outbox: cannot connect to Kafka at ` + regexp.QuoteMeta(addr) + ` \([^\[\]]+\): check that the brokers run and that --to ` + regexp.QuoteMeta(to) + ` is right\n$`)
	r := cli(t, []string{"TMPDIR=" + t.TempDir()}, "demo", "--quiet", "--to", to)
	if r.code != 1 || !re.MatchString(r.stderr) {
		t.Fatalf("exit %d, stderr %q; want exit 1 matching %s", r.code, r.stderr, re)
	}
	if r.stdout != "" {
		t.Fatalf("stdout %q, want nothing", r.stdout)
	}
	// The Redis message, for comparison.
	wantFailure(t, cli(t, []string{"TMPDIR=" + t.TempDir()}, "demo", "--quiet", "--to", "redis://"+addr), 1,
		"cannot connect to Redis at "+addr+" (", "check that it runs and that --to redis://"+addr+" is right")
}

// TestPlurals: counts of one take the singular.
func TestPlurals(t *testing.T) {
	for _, tc := range []struct {
		n         int64
		one, many string
		want      string
	}{{0, "event", "events", "0 events"}, {1, "event", "events", "1 event"}, {2, "event", "events", "2 events"}} {
		if got := plural(tc.n, tc.one, tc.many); got != tc.want {
			t.Errorf("plural(%d) = %q, want %q", tc.n, got, tc.want)
		}
	}
	if got, want := signaturesLine(5, 0, 1), "signatures          5 verified, 0 rejected; 1 request refused on purpose (500) and retried"; got != want {
		t.Errorf("signaturesLine = %q, want %q", got, want)
	}
	if got, want := signaturesLine(5, 1, 2), "signatures          5 verified, 1 rejected; 2 requests refused on purpose (500) and retried"; got != want {
		t.Errorf("signaturesLine = %q, want %q", got, want)
	}
}

// TestBacklogNote: the demo's note on the relay's backlog follows the measured latency and the
// time the relay needed after the last commit, not the two rates.
func TestBacklogNote(t *testing.T) {
	const want = "note                the relay ran behind the writers (p50 1.3s; last delivery 1.6s after the last commit), so latency includes its backlog: try --rate"
	// The run reported by a user: writers 1442/s, relay 1282/s, p50 1.3 s.
	reported := demoReport{WriteRate: 1442, Throughput: 1282, P50: 1300 * time.Millisecond, Drain: 1600 * time.Millisecond}
	if got := backlogNote(0, reported); got != want {
		t.Fatalf("note %q, want %q", got, want)
	}
	for _, tc := range []struct {
		name string
		rate float64
		r    demoReport
		want bool
	}{
		{"paced", 100, reported, false},
		{"no backlog", 0, demoReport{WriteRate: 3000, Throughput: 600, P50: 20 * time.Millisecond, Drain: 300 * time.Millisecond}, false},
		{"latency only", 0, demoReport{P50: 101 * time.Millisecond}, true},
		{"drain only", 0, demoReport{P50: 10 * time.Millisecond, Drain: 1001 * time.Millisecond}, true},
		{"at the limits", 0, demoReport{P50: 100 * time.Millisecond, Drain: time.Second}, false},
	} {
		if got := backlogNote(tc.rate, tc.r) != ""; got != tc.want {
			t.Errorf("%s: note %v, want %v", tc.name, got, tc.want)
		}
	}
}

// demoHeader matches the demo's header line.
var demoHeader = regexp.MustCompile(`^outbox demo: (\d+) writers?, (\d+) transactions? (?:at [0-9.]+/s \(--rate\)|unpaced \(--rate 0\)) over (\d+) keys?, (.+) → (.+)$`)

// quietDemoLines checks a demo run (checkDemo), that it wrote nothing to stderr and that its
// first line is the header with these writer, transaction and key counts; it returns the
// lines of stdout.
func quietDemoLines(t *testing.T, r result, writers, transactions, keys string) []string {
	t.Helper()
	checkDemo(t, r)
	if r.stderr != "" {
		t.Fatalf("stderr %q, want nothing", r.stderr)
	}
	lines := strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n")
	if m := demoHeader.FindStringSubmatch(lines[0]); m == nil || m[1] != writers || m[2] != transactions || m[3] != keys {
		t.Fatalf("first line %q is not the header", lines[0])
	}
	return lines
}

// TestDemoOutput: the header is printed once, on stdout, with the writer count; a quiet demo
// writes nothing to stderr; under --keep the report ends (before the summary) with what was
// kept and a command that drops it, which works.
func TestDemoOutput(t *testing.T) {
	t.Run("sqlite temp file", func(t *testing.T) {
		tmp := t.TempDir()
		r := cli(t, []string{"TMPDIR=" + tmp}, "demo", "--transactions", "60", "--writers", "2", "--keys", "6", "--quiet", "--keep")
		lines := quietDemoLines(t, r, "2", "60", "6")
		if n := strings.Count(r.stdout, "outbox demo:"); n != 1 {
			t.Fatalf("header printed %d times:\n%s", n, r.stdout)
		}
		dirs, _ := filepath.Glob(filepath.Join(tmp, "outbox-demo-*"))
		if len(dirs) != 1 {
			t.Fatalf("temporary directories %v, want one kept", dirs)
		}
		path := filepath.Join(dirs[0], "demo.db")
		want := []string{
			fmt.Sprintf("  kept                SQLite file %s (outbox table watermill_outbox, demo table demo_orders)", path),
			fmt.Sprintf("  inspect             outbox status --db %s", path),
			fmt.Sprintf("  drop                rm -r %s", dirs[0]),
		}
		if got := lines[len(lines)-4 : len(lines)-1]; strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Fatalf("kept lines:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
		if l := lines[len(lines)-5]; !regexp.MustCompile(`^  (throughput|note|rate|relay throughput) `).MatchString(l) {
			t.Fatalf("kept lines do not follow the report:\n%s", r.stdout)
		}
		s := status(t, path, "watermill_outbox")
		if s.Pending != 0 || s.DeadLettered != 0 {
			t.Fatalf("kept outbox: %+v", s)
		}
	})
	t.Run("postgres", func(t *testing.T) {
		pool := pgtest.Require(t)
		r := cli(t, nil, "demo", "--db", pgtest.DSN(), "--transactions", "40", "--writers", "1", "--keys", "1", "--keep")
		lines := quietDemoLines(t, r, "1", "40", "1")
		kept := regexp.MustCompile(`^  kept                tables (outbox_demo_[0-9a-f]{8}) and (demo_orders_[0-9a-f]{8}) in PostgreSQL at `).FindStringSubmatch(lines[len(lines)-4])
		if kept == nil {
			t.Fatalf("no kept line before the summary:\n%s", r.stdout)
		}
		table, business := kept[1], kept[2]
		t.Cleanup(func() {
			_, _ = pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+business+", "+table)
		})
		want := []string{
			fmt.Sprintf("  inspect             outbox status --db %s --table %s", shellQuote(pgtest.DSN()), table),
			fmt.Sprintf("  drop                psql %s -c 'DROP TABLE %s, %s'", shellQuote(pgtest.DSN()), business, table),
		}
		if got := lines[len(lines)-3 : len(lines)-1]; strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Fatalf("kept lines:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
		if s := status(t, pgtest.DSN(), table); s.Pending != 0 {
			t.Fatalf("kept outbox: %+v", s)
		}
		// The drop statement, run as printed, removes both tables.
		ctx := context.Background()
		if _, err := pool.Exec(ctx, "DROP TABLE "+business+", "+table); err != nil {
			t.Fatal(err)
		}
		var n int
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM pg_tables WHERE tablename IN ($1, $2)", table, business).Scan(&n); err != nil || n != 0 {
			t.Fatalf("%d tables left (%v)", n, err)
		}
	})
}

// TestEmptyDeadList: a selection without dead letters says so (the JSON stays an empty array).
func TestEmptyDeadList(t *testing.T) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			db, table := b.fresh(t)
			mustRun(t, nil, "migrate", "--db", db, "--table", table)
			if out := mustRun(t, nil, "dead", "list", "--db", db, "--table", table); out != "no dead letters\n" {
				t.Fatalf("dead list said %q", out)
			}
			if out := mustRun(t, nil, "dead", "list", "--db", db, "--table", table, "--json"); out != "[]\n" {
				t.Fatalf("dead list --json said %q", out)
			}
		})
	}
}

// TestStatusTotal: the TOTAL row is the sum of the topics' counts and the oldest of their ages,
// in the table and in JSON.
func TestStatusTotal(t *testing.T) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			db, table := b.fresh(t)
			mustRun(t, nil, "migrate", "--db", db, "--table", table)
			b.publish(t, db, table, []testEvent{{"t.a", "k1", 1}, {"t.a", "k2", 1}})
			b.publish(t, db, table, []testEvent{{"t.b", "k3", 1}})
			s := status(t, db, table)
			var pending, dead int64
			var oldest float64
			for _, tp := range s.Topics {
				pending, dead, oldest = pending+tp.Pending, dead+tp.DeadLettered, max(oldest, tp.OldestPendingAgeSeconds)
			}
			if s.Pending != 3 || pending != 3 || s.DeadLettered != dead || s.OldestPendingAgeSeconds != oldest || oldest <= 0 {
				t.Fatalf("status --json %+v: topics sum to pending %d, dead %d, oldest %v", s, pending, dead, oldest)
			}
			out := mustRun(t, nil, "status", "--db", db, "--table", table)
			rows := map[string][]string{}
			for _, l := range strings.Split(strings.TrimSpace(out), "\n")[1:] {
				f := strings.Fields(l)
				rows[f[0]] = f[1:]
			}
			ageA, ageB := rows["t.a"][1], rows["t.b"][1]
			maxAge := ageA
			if da, db := mustDuration(t, ageA), mustDuration(t, ageB); db > da {
				maxAge = ageB
			}
			if got := rows["TOTAL"]; len(got) != 3 || got[0] != "3" || got[1] != maxAge || got[2] != "0" {
				t.Fatalf("TOTAL row %v, want [3 %s 0]:\n%s", got, maxAge, out)
			}
		})
	}
}

func mustDuration(t *testing.T, s string) time.Duration {
	t.Helper()
	d, err := time.ParseDuration(s)
	if err != nil {
		t.Fatalf("age %q: %v", s, err)
	}
	return d
}

// TestMissingSchema: migrate into a schema that does not exist says to create it, in one line
// with one "outbox:" prefix; status then suggests creating the schema before migrating, and no
// longer once the schema exists.
func TestMissingSchema(t *testing.T) {
	pool := pgtest.Require(t)
	ctx := context.Background()
	schema := "nosuch_" + randomHex(4)
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+schema+" CASCADE") })
	db, table := pgtest.DSN(), schema+".tbl"
	where := "PostgreSQL at 127.0.0.1:5432/test"
	if u, err := parseDBURL(db); err == nil {
		d := &database{url: u}
		where = d.where()
	}
	migrate := fmt.Sprintf("`outbox migrate --db %s --table %s`", shellQuote(db), table)
	wantStderr(t, cli(t, nil, "migrate", "--db", db, "--table", table), 1,
		fmt.Sprintf("outbox: cannot create outbox table %q in %s: schema %q does not exist; create it first with `CREATE SCHEMA %s`, then run %s again", table, where, schema, schema, migrate))
	for _, args := range [][]string{
		{"status", "--db", db, "--table", table},
		{"dead", "list", "--db", db, "--table", table},
	} {
		wantStderr(t, cli(t, nil, args...), 1,
			fmt.Sprintf("outbox: outbox table %q not found in %s, nor its schema %q: create the schema first with `CREATE SCHEMA %s`, then the table with %s", table, where, schema, schema, migrate))
	}
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	wantStderr(t, cli(t, nil, "status", "--db", db, "--table", table), 1,
		fmt.Sprintf("outbox: outbox table %q not found in %s: create it with %s", table, where, migrate))
	if out := mustRun(t, nil, "migrate", "--db", db, "--table", table); out != fmt.Sprintf("outbox table %q is ready in %s\n", table, where) {
		t.Fatalf("migrate said %q", out)
	}
	if s := status(t, db, table); s.Pending != 0 {
		t.Fatalf("status %+v", s)
	}
}
