package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestUnknownCommand: an unknown command, at the top or under dead, prints cobra's message
// and suggestions on several lines as cobra does and exits 2; an argument to a command that
// takes flags only is a usage error too; dead alone still prints its help.
func TestUnknownCommand(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"stauts"}, "outbox: unknown command \"stauts\" for \"outbox\"\n\nDid you mean this?\n\tstatus\n\nRun 'outbox --help' for usage.\n"},
		{[]string{"bogus"}, "outbox: unknown command \"bogus\" for \"outbox\"\nRun 'outbox --help' for usage.\n"},
		{[]string{"dead", "lsit"}, "outbox: unknown command \"lsit\" for \"outbox dead\"\n\nDid you mean this?\n\tlist\n\nRun 'outbox dead --help' for usage.\n"},
		{[]string{"dead", "bogus"}, "outbox: unknown command \"bogus\" for \"outbox dead\"\nRun 'outbox dead --help' for usage.\n"},
		// Flags after the mistyped name, as typed in practice.
		{[]string{"stauts", "--db", "x.db", "--json"}, "outbox: unknown command \"stauts\" for \"outbox\"\n\nDid you mean this?\n\tstatus\n\nRun 'outbox --help' for usage.\n"},
		{[]string{"dead", "lsit", "--db", "x.db"}, "outbox: unknown command \"lsit\" for \"outbox dead\"\n\nDid you mean this?\n\tlist\n\nRun 'outbox dead --help' for usage.\n"},
		{[]string{"status", "x.db"}, "outbox: unexpected argument \"x.db\": outbox status takes flags only, e.g. --db URL (see outbox status --help)\n"},
		{[]string{"dead", "list", "extra"}, "outbox: unexpected argument \"extra\": outbox dead list takes flags only, e.g. --db URL (see outbox dead list --help)\n"},
	} {
		r := cli(t, nil, tc.args...)
		if r.code != 2 || r.stderr != tc.want || r.stdout != "" {
			t.Errorf("outbox %s: exit %d, stdout %q, stderr %q\nwant exit 2, stderr %q", strings.Join(tc.args, " "), r.code, r.stdout, r.stderr, tc.want)
		}
	}
	// A group given a flag and no command: the flag is unknown to it.
	wantStderr(t, cli(t, nil, "dead", "--db", "x.db"), 2, "outbox: unknown flag: --db (see outbox dead --help)")
	wantStderr(t, cli(t, nil, "--db", "x.db"), 2, "outbox: unknown flag: --db (see outbox --help)")
	help := mustRun(t, nil, "dead")
	if !strings.HasPrefix(help, "dead acts on dead-lettered events") || !strings.Contains(help, "\nUsage:\n  outbox dead [command]\n\nAvailable Commands:\n") {
		t.Fatalf("outbox dead printed:\n%s", help)
	}
	if root := mustRun(t, nil); !strings.Contains(root, "\nUsage:\n  outbox [command]\n\nAvailable Commands:\n") {
		t.Fatalf("outbox printed:\n%s", root)
	}
}

// TestFlagValueMessages: values that do not parse, or that the relay's settings refuse, name
// the flag (never a Go field), the expected form and an example; exit status 2.
func TestFlagValueMessages(t *testing.T) {
	relay := []string{"relay", "--db", "x.db", "--to", "http://127.0.0.1/"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{append(relay, "--batch-size", "20000"), "outbox: --batch-size: 20000 outside 1..10000"},
		{append(relay, "--lease", "2s", "--delivery-timeout", "5s"), "outbox: --delivery-timeout: 5s must be below --lease (2s)"},
		{append(relay, "--retry-base", "10s", "--retry-max", "5s"), "outbox: --retry-max: must not be below --retry-base"},
		{append(relay, "--lease", "500ms"), "outbox: --lease: must be at least 1s"},
		{append(relay, "--batch-size", "abc"), `outbox: --batch-size "abc" is not a whole number: give e.g. --batch-size 100 (see outbox relay --help)`},
		{append(relay, "--poll-interval", "5"), `outbox: --poll-interval "5" is not a Go duration (a number and a unit: 500ms, 90s, 15m, 168h): give e.g. --poll-interval 5s (see outbox relay --help)`},
		{[]string{"dead", "list", "--db", "x.db", "--json=maybe"}, `outbox: --json "maybe" is not true or false: give e.g. --json=true (see outbox dead list --help)`},
		{[]string{"demo", "--rate", "fast"}, `outbox: --rate "fast" is not a number: give e.g. --rate 250 (see outbox demo --help)`},
	} {
		wantStderr(t, cli(t, nil, tc.args...), 2, tc.want)
	}
}

// TestEnvValueMessages: an environment variable that does not parse is named with the form it
// needs, the flag it sets and an example; exit status 2. Several bad variables are all named.
func TestEnvValueMessages(t *testing.T) {
	relay := []string{"relay", "--db", "x.db", "--to", "http://127.0.0.1/"}
	for _, tc := range []struct {
		env  []string
		args []string
		want string
	}{
		{[]string{"OUTBOX_BATCH_SIZE=abc"}, relay, `outbox: environment variable OUTBOX_BATCH_SIZE="abc" is not a whole number (it sets --batch-size): give e.g. OUTBOX_BATCH_SIZE=100`},
		{[]string{"OUTBOX_DELIVERY_TIMEOUT=10"}, relay, `outbox: environment variable OUTBOX_DELIVERY_TIMEOUT="10" is not a Go duration (a number and a unit: 500ms, 90s, 15m, 168h) (it sets --delivery-timeout): give e.g. OUTBOX_DELIVERY_TIMEOUT=30s`},
		{[]string{"OUTBOX_JSON=maybe", "OUTBOX_LIMIT=all"}, []string{"dead", "list", "--db", "x.db"},
			`outbox: environment variable OUTBOX_JSON="maybe" is not true or false (it sets --json): give e.g. OUTBOX_JSON=true ; ` +
				`environment variable OUTBOX_LIMIT="all" is not a whole number (it sets --limit): give e.g. OUTBOX_LIMIT=100`},
		// A value that parses but is refused names the variable, not only the flag it sets.
		{[]string{"OUTBOX_BATCH_SIZE=20000"}, relay, `outbox: environment variable OUTBOX_BATCH_SIZE="20000" (it sets --batch-size): 20000 outside 1..10000`},
		{[]string{"OUTBOX_MAX_ATTEMPTS=0"}, relay, `outbox: environment variable OUTBOX_MAX_ATTEMPTS="0" (it sets --max-attempts) must be positive`},
		{[]string{"OUTBOX_RETRY_BASE=10s", "OUTBOX_RETRY_MAX=5s"}, relay, `outbox: environment variable OUTBOX_RETRY_MAX="5s" (it sets --retry-max): must not be below --retry-base`},
		{[]string{"OUTBOX_OLDER_THAN=-1h"}, []string{"dead", "list", "--db", "x.db"},
			`outbox: environment variable OUTBOX_OLDER_THAN="-1h" (it sets --older-than) -1h0m0s is negative: give a duration such as 24h, or 0 for any age`},
		{[]string{"OUTBOX_LIMIT=0"}, []string{"dead", "list", "--db", "x.db"}, `outbox: environment variable OUTBOX_LIMIT="0" (it sets --limit) 0: give 1..10000`},
		{[]string{"OUTBOX_PUBLISHED_OLDER_THAN=-1h"}, []string{"cleanup", "--db", "x.db"},
			`outbox: environment variable OUTBOX_PUBLISHED_OLDER_THAN="-1h" (it sets --published-older-than) -1h0m0s is negative: give a duration such as 168h, or 0s for every published event`},
		{[]string{"OUTBOX_OLDER_THAN=-1h"}, []string{"inbox", "cleanup", "--db", "x.db"},
			`outbox: environment variable OUTBOX_OLDER_THAN="-1h" (it sets --older-than) -1h0m0s is negative: give a duration such as 168h, or 0s for every record`},
		{[]string{"OUTBOX_INBOX_TABLE=a.b.c.d"}, []string{"inbox", "status", "--db", "x.db"},
			`outbox: environment variable OUTBOX_INBOX_TABLE="a.b.c.d" (it sets --table) "a.b.c.d": outbox: invalid configuration: inbox.SchemaConfig.Table: "a.b.c.d": at most schema.table`},
		{[]string{"OUTBOX_ONLY=foo"}, []string{"bench", "--db", "x.db"}, `outbox: environment variable OUTBOX_ONLY="foo" (it sets --only): unknown measurement "foo" (write, drain, latency)`},
		// The same values on the command line name the flag.
		{nil, append(relay, "--max-attempts", "0"), "outbox: --max-attempts must be positive"},
		{[]string{"OUTBOX_MAX_ATTEMPTS=3"}, append(relay, "--batch-size", "20000"), "outbox: --batch-size: 20000 outside 1..10000"},
	} {
		wantStderr(t, cli(t, tc.env, tc.args...), 2, tc.want)
	}
}

// TestRequiredFlags: every missing required flag is named at once, with an example and the
// variable that may set it instead (capture reads no environment); one given through the
// environment is not missing.
func TestRequiredFlags(t *testing.T) {
	const (
		dbForms   = "--db: postgres://user:password@host:5432/dbname, mysql://user:password@host:3306/dbname, sqlite://PATH or a path ending in .db"
		pgSQLite  = "--db: postgres://user:password@host:5432/dbname, sqlite://PATH or a path ending in .db"
		destForms = "--to: kafka://host:9092[,host2:9092], amqp://user:password@host:5672/[vhost], redis://host:6379[/db], http(s)://host/path or asynq+redis://[user:password@]host:6379[/db][?queue=NAME&retention=24h&max-retry=N]"
	)
	for _, tc := range []struct {
		env  []string
		args []string
		want string
	}{
		{nil, []string{"relay"}, "outbox: --db and --to are required: pass --db URL --to URL, or set OUTBOX_DB and OUTBOX_TO (" + dbForms + "; " + destForms + ") (see outbox relay --help)"},
		{[]string{"OUTBOX_DB=x.db"}, []string{"relay"}, "outbox: --to is required: pass --to URL, or set OUTBOX_TO (" + destForms + ") (see outbox relay --help)"},
		{nil, []string{"relay", "--db", ""}, "outbox: --db and --to are required: pass --db URL --to URL, or set OUTBOX_DB and OUTBOX_TO (" + dbForms + "; " + destForms + ") (see outbox relay --help)"},
		{nil, []string{"cleanup"}, "outbox: --db and --published-older-than are required: pass --db URL --published-older-than 168h, or set OUTBOX_DB and OUTBOX_PUBLISHED_OLDER_THAN (" + dbForms + ") (see outbox cleanup --help)"},
		{nil, []string{"inbox", "cleanup"}, "outbox: --db and --older-than are required: pass --db URL --older-than 168h, or set OUTBOX_DB and OUTBOX_OLDER_THAN (" + pgSQLite + ") (see outbox inbox cleanup --help)"},
		{nil, []string{"capture", "install"}, "outbox: --db and --table are required: pass --db URL --table orders (" + pgSQLite + ") (see outbox capture install --help)"},
		{nil, []string{"dead", "purge", "--topic", "*", "--yes"}, "outbox: --db is required: pass --db URL, or set OUTBOX_DB (" + dbForms + ") (see outbox dead purge --help)"},
		{nil, []string{"bench"}, "outbox: --db is required: pass --db URL, or set OUTBOX_DB (" + dbForms + ") (see outbox bench --help)"},
	} {
		wantStderr(t, cli(t, tc.env, tc.args...), 2, tc.want)
	}
}

// TestEmptyTopicLists: a topic or id list given empty or with a blank entry, on the command
// line or through the environment, is a usage error: it never means "all", as leaving the flag
// out does.
func TestEmptyTopicLists(t *testing.T) {
	relay := []string{"relay", "--db", "x.db", "--to", "http://127.0.0.1:9/"}
	const form = ` (an exact topic, a prefix ending in '*' such as "orders.*", or '*' for all), or leave the flag out`
	for _, tc := range []struct {
		env  []string
		args []string
		want string
	}{
		{nil, append(relay, "--topics", ""), "outbox: --topics is empty: give a topic pattern" + form},
		{nil, append(relay, "--topic", ""), "outbox: --topic is empty: give a topic pattern" + form},
		{nil, append(relay, "--topics", "orders.*,,pay"), "outbox: --topics has a blank entry: give a topic pattern" + form},
		{nil, append(relay, "--exclude", " "), "outbox: --exclude has a blank entry: give a topic pattern" + form},
		{[]string{"OUTBOX_TOPICS="}, relay, `outbox: environment variable OUTBOX_TOPICS="" (it sets --topics) is empty: give a topic pattern` + form},
		{[]string{"OUTBOX_TOPICS= "}, relay, `outbox: environment variable OUTBOX_TOPICS=" " (it sets --topics) has a blank entry: give a topic pattern` + form},
		{nil, []string{"dead", "list", "--db", "x.db", "--topic", ""}, "outbox: --topic is empty: give a topic pattern" + form},
		{[]string{"OUTBOX_TOPIC="}, []string{"dead", "list", "--db", "x.db"}, `outbox: environment variable OUTBOX_TOPIC="" (it sets --topic) is empty: give a topic pattern` + form},
		{nil, []string{"dead", "list", "--db", "x.db", "--id", ""}, "outbox: --id is empty: give an event id (UUID) as `outbox dead list` shows it, or leave the flag out"},
		{nil, []string{"dead", "purge", "--db", "x.db", "--topic", "", "--yes"}, "outbox: --topic is empty: give a topic pattern" + form},
	} {
		wantStderr(t, cli(t, tc.env, tc.args...), 2, tc.want)
	}
}

// TestDeadListHelp: dead list --help explains the command like retry and purge do, and its
// usage line lists --limit and --json.
func TestDeadListHelp(t *testing.T) {
	help := mustRun(t, nil, "dead", "list", "--help")
	for _, want := range []string{
		"list shows dead-lettered events, oldest dead letter first: event id, topic, ordering key,\n",
		"It shows at most --limit events and says on stderr when there are more.",
		"\nUsage:\n  outbox dead list --db URL [--topic PATTERN]… [--id UUID]… [--older-than DURATION] [--limit N] [--json] [flags]\n",
	} {
		if !strings.Contains(help, want) {
			t.Fatalf("dead list --help lacks %q:\n%s", want, help)
		}
	}
}

// TestRelayShortSecret: a webhook secret the webhook package refuses is a usage error naming
// --secret and the rule, not a hint about --allow-prefix.
func TestRelayShortSecret(t *testing.T) {
	path := filepath.Join(t.TempDir(), "outbox.db")
	mustRun(t, nil, "migrate", "--db", path)
	wantFailure(t, cli(t, nil, "relay", "--db", path, "--to", "http://127.0.0.1:9/hook", "--secret", "short", "--allow-prefix", "127.0.0.0/8"),
		2, "--secret", "5 bytes; at least 16 are required")
}

// startLine matches the fields of the relay's start line.
var startLine = regexp.MustCompile(`level=INFO msg="outbox relay starting" (.*)\n`)

// TestRelayStartLine: the relay's start line shows every setting in effect under its flag's
// name — given, from the environment or by default, --dest-topic included — with the database
// as given (one pair of quotes around a path with a space, none nested), the secret only as
// set, the derived delivery timeout, the binary's version and commit, and the wake probe off
// (PostgreSQL only; this is SQLite).
func TestRelayStartLine(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "my dir")
	path := filepath.Join(dir, "outbox.db")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	mustRun(t, nil, "migrate", "--db", path)
	p := start(t, []string{"OUTBOX_SECRET=s3cret-of-16-bytes-or-more", "OUTBOX_CONCURRENCY=3"}, "relay", "--db", path, "--to", "http://127.0.0.1:9/hook",
		"--allow-prefix", "127.0.0.0/8", "--topics", "orders.*", "--dest-topic", "all-orders", "--lease", "10s", "--poll-interval", "50ms")
	var m []string
	waitFor(t, 30*time.Second, "the start line", func() bool {
		m = startLine.FindStringSubmatch(p.errb.String())
		return m != nil || !p.running()
	})
	if code := p.stop(t); m == nil || code != 0 {
		t.Fatalf("relay exit %d; stderr:\n%s", code, p.errb.String())
	}
	want := fmt.Sprintf(`allow-prefix=[127.0.0.0/8] amqp-exchange="" backlog-interval=15s batch-size=100 commit=unknown concurrency=3 console=false console-token=unset db=%q debug=false delivery-timeout=5s `+
		`dest-topic=all-orders exclude=[] http-addr="" lease=10s mark-interval=100ms max-attempts=5 max-delivery-starts=5 max-in-flight=0 metrics-topic=[] `+
		`poll-interval=50ms rate-burst=0 rate-limit=0 relay-name="" retry-base=1s retry-max=5m0s `+
		`secret=set table=watermill_outbox to=http://127.0.0.1:9/hook topics=[orders.*] trace=false traces=off `+
		`unavailable-backoff=200ms unavailable-backoff-max=30s unavailable-dead-letter-after=0s version=(devel) wake-probe=0s webhook-permanent-status=[]`, path)
	if m[1] != want {
		t.Fatalf("start line fields\n%s\nwant\n%s", m[1], want)
	}
}

// TestRateLine: the report's --rate line gives the transactions/s reached beside the rate
// asked, and says when the writers fell short by more than a tenth.
func TestRateLine(t *testing.T) {
	for _, tc := range []struct {
		asked, reached float64
		want           string
	}{
		{2000, 1043.4, "rate                1043 transactions/s reached, 2000 asked (--rate): the writers could not go faster on this database"},
		{100, 99.64, "rate                99.6 transactions/s reached, 100 asked (--rate)"},
		{2.5, 2.3, "rate                2.3 transactions/s reached, 2.5 asked (--rate)"},
	} {
		if got := rateLine(tc.asked, tc.reached); got != tc.want {
			t.Errorf("rateLine(%g, %g) = %q, want %q", tc.asked, tc.reached, got, tc.want)
		}
	}
}

// TestDemoRate: a paced demo reports the rate it reached, after the throughput line. Pacing
// keeps it at or below the rate asked: the n-th start is due (n-1)/rate after the writers
// started, and the rate is counted from then.
func TestDemoRate(t *testing.T) {
	const rate, n = 200, 100
	r := cli(t, []string{"TMPDIR=" + t.TempDir()}, "demo", "--quiet", "--rate", strconv.Itoa(rate), "--transactions", strconv.Itoa(n), "--writers", "2", "--keys", "4")
	lines := quietDemoLines(t, r, "2", strconv.Itoa(n), "4")
	var i int
	for i = range lines {
		if strings.HasPrefix(lines[i], "  throughput ") {
			break
		}
	}
	m := regexp.MustCompile(`^  rate                ([0-9.]+) transactions/s reached, 200 asked \(--rate\)(: the writers could not go faster on this database)?$`).FindStringSubmatch(lines[min(i+1, len(lines)-1)])
	if m == nil {
		t.Fatalf("no rate line after the throughput line:\n%s", r.stdout)
	}
	reached, err := strconv.ParseFloat(m[1], 64)
	if err != nil || reached <= 0 || reached > rate*float64(n)/float64(n-1)+0.5 {
		t.Fatalf("reached %q transactions/s with --rate %d over %d transactions", m[1], rate, n)
	}
	if short := reached < 0.9*rate; short != (m[2] != "") {
		t.Fatalf("rate line %q: the shortfall note does not match the rate reached", lines[i+1])
	}
}

// atoi is s as a number, -1 when it is not one.
func atoi(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		return -1
	}
	return n
}

// TestDemoPacedByDefault: with no --rate the demo paces its writers (250 transactions/s), so
// its latency is a relay keeping up (no "ran behind" note), and it times the relay on its own
// on a backlog written with the relay stopped; --rate 0 runs unpaced. The summary line and its
// checks cover both phases.
func TestDemoPacedByDefault(t *testing.T) {
	r := cli(t, []string{"TMPDIR=" + t.TempDir()}, "demo", "--quiet", "--transactions", "300", "--drain-transactions", "200")
	checkDemo(t, r)
	if !strings.Contains(r.stdout, "outbox demo: 4 writers, 300 transactions at 250/s (--rate) over 50 keys, ") {
		t.Fatalf("header not paced:\n%s", r.stdout)
	}
	if strings.Contains(r.stdout, "ran behind") {
		t.Fatalf("a paced default run reports a backlog:\n%s", r.stdout)
	}
	m := regexp.MustCompile(`(?m)^  relay throughput    (\d+) events/s: a backlog of (\d+) events \(200 transactions written with the relay stopped\) delivered in \S+$`).FindStringSubmatch(r.stdout)
	if m == nil || m[1] == "0" {
		t.Fatalf("no relay throughput line:\n%s", r.stdout)
	}
	// Keys: 50 per phase, each phase over its own (one without a committed event is not counted).
	keys := regexp.MustCompile(`(?m)^  order               0 violations over (\d+) ordering keys$`).FindStringSubmatch(r.stdout)
	if !regexp.MustCompile(`(?m)^  transactions        500 \(`).MatchString(r.stdout) || keys == nil || atoi(keys[1]) <= 50 {
		t.Fatalf("the counts do not cover both phases:\n%s", r.stdout)
	}
	r = cli(t, []string{"TMPDIR=" + t.TempDir()}, "demo", "--quiet", "--transactions", "100", "--rate", "0", "--drain-transactions", "0")
	checkDemo(t, r)
	if !strings.Contains(r.stdout, " 100 transactions unpaced (--rate 0) over ") || strings.Contains(r.stdout, "relay throughput") {
		t.Fatalf("--rate 0 --drain-transactions 0:\n%s", r.stdout)
	}
}
