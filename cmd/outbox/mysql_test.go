package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/watermill-outbox/outbox/internal/dialect/dburl"
	"github.com/watermill-outbox/outbox/internal/dialect/mysql/mysqlurl"
	"github.com/watermill-outbox/outbox/internal/mariadbtest"
)

// mariadbTableCount is how many tables of the shared MariaDB database are named table or
// table_keys.
func mariadbTableCount(t *testing.T, table string) int {
	t.Helper()
	var n int
	err := mariadbtest.Require(t).QueryRowContext(context.Background(),
		"SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME IN (?, ?)", table, table+"_keys").Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// dropMariaDBTables drops the outbox tables named in the shared MariaDB database, with their
// key-lock tables.
func dropMariaDBTables(t *testing.T, tables ...string) {
	for _, tb := range tables {
		if _, err := mariadbtest.Require(t).ExecContext(context.Background(), fmt.Sprintf("DROP TABLE IF EXISTS `%s`, `%s_keys`", tb, tb)); err != nil {
			t.Errorf("dropping %s: %v", tb, err)
		}
	}
}

// TestParseMySQLURL: the mysql:// and mariadb:// forms become the driver configuration (TCP,
// port 3306 by default, parseTime and interpolateParams on, a 5 s connect timeout, the query
// passed to the driver and winning over those defaults); malformed ones are usage errors that
// name the form and never show the password.
func TestParseMySQLURL(t *testing.T) {
	type want struct {
		addr, user, passwd, db, shown string
		timeout                       time.Duration
		parseTime, interpolate        bool
		tls, loc                      string
		params                        map[string]string
	}
	for _, tc := range []struct {
		in string
		want
	}{
		{"mysql://u:p@db.internal:3307/app?tls=skip-verify&timeout=10s&sql_mode=ANSI",
			want{addr: "db.internal:3307", user: "u", passwd: "p", db: "app", shown: "mysql://u:xxxxx@db.internal:3307/app?tls=skip-verify&timeout=10s&sql_mode=ANSI",
				timeout: 10 * time.Second, parseTime: true, interpolate: true, tls: "skip-verify", loc: "UTC", params: map[string]string{"sql_mode": "ANSI"}}},
		{"MARIADB://root@127.0.0.1/test",
			want{addr: "127.0.0.1:3306", user: "root", db: "test", shown: "mariadb://root@127.0.0.1/test", timeout: 5 * time.Second, parseTime: true, interpolate: true, loc: "UTC"}},
		{"mysql://root@[::1]/test",
			want{addr: "[::1]:3306", user: "root", db: "test", shown: "mysql://root@[::1]/test", timeout: 5 * time.Second, parseTime: true, interpolate: true, loc: "UTC"}},
		{"mysql://root@h:3306/test?parseTime=false&interpolateParams=false&loc=Europe/Berlin",
			want{addr: "h:3306", user: "root", db: "test", shown: "mysql://root@h:3306/test?parseTime=false&interpolateParams=false&loc=Europe/Berlin", timeout: 5 * time.Second, loc: "Europe/Berlin"}},
		{"mysql://app%2Buser:p%40ss%2Fw%3Ard@h/orders",
			want{addr: "h:3306", user: "app+user", passwd: "p@ss/w:rd", db: "orders", shown: "mysql://app+user:xxxxx@h/orders", timeout: 5 * time.Second, parseTime: true, interpolate: true, loc: "UTC"}},
	} {
		u, err := parseDBURL(tc.in)
		if err != nil {
			t.Errorf("%s: %v", tc.in, err)
			continue
		}
		my, ok := u.(*mysqlurl.URL)
		if !ok {
			t.Errorf("%s: parsed as %T", tc.in, u)
			continue
		}
		c := my.Config
		got := want{addr: c.Addr, user: c.User, passwd: c.Passwd, db: c.DBName, shown: u.Shown(), timeout: c.Timeout, parseTime: c.ParseTime,
			interpolate: c.InterpolateParams, tls: c.TLSConfig, loc: c.Loc.String(), params: c.Params}
		if c.Net != "tcp" || fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("%s:\n got %+v (net %s)\nwant %+v", tc.in, got, c.Net, tc.want)
		}
		if _, ok := c.Logger.(*mysql.NopLogger); !ok {
			t.Errorf("%s: the driver logs to %T, want nothing (one-line messages)", tc.in, c.Logger)
		}
		if w := (&database{url: u}).where(); w != "MariaDB/MySQL at "+tc.addr+"/"+tc.db {
			t.Errorf("%s: where %q", tc.in, w)
		}
	}

	for _, tc := range []struct{ in, why string }{
		{"mysql://root:s3cret@127.0.0.1:3306", "names no database"},
		{"mysql://root:s3cret@127.0.0.1:3306/", "names no database"},
		{"mysql://root:s3cret@:3306/test", "names no host"},
		{"mysql://127.0.0.1/test", "names no user"},
		{"mysql://:s3cret@127.0.0.1/test", "names no user"},
		{"mysql:root:s3cret@127.0.0.1/test", `"mysql:root:xxxxx@127.0.0.1/test" is not supported`},
		{"mysql://root:s3cret@127.0.0.1:notaport/test", "is not a valid URL"},
		{"mysql://root:s3cret@127.0.0.1/test/more", `has a path "/test/more" that is not one database name`},
		{"mysql://root:s3cret@127.0.0.1/test?parseTime=maybe", "has a parameter the MySQL driver refuses (invalid bool value: maybe)"},
		{"mysql://root:s3cret@127.0.0.1/test?tls=bogus", "has a parameter the MySQL driver refuses"},
		{"mysql://root:s3cret@127.0.0.1/test?a=%zz", "has a query that does not parse"},
		{"mysql://root:s3cret@127.0.0.1/test?collation=big5_chinese_ci", "has settings the MySQL driver refuses (invalid DSN: interpolateParams can not be used with unsafe collations)"},
	} {
		_, err := parseDBURL(tc.in)
		var ue *usageError
		if !errors.As(err, &ue) {
			t.Errorf("%s: error %v, want a usage error", tc.in, err)
			continue
		}
		msg := err.Error()
		if !strings.Contains(msg, tc.why) || !strings.Contains(msg, "mysql://user:password@host:3306/dbname (or mariadb://…) for MariaDB/MySQL") || strings.Contains(msg, "s3cret") {
			t.Errorf("%s: message %q, want %q and the form, without the password", tc.in, msg, tc.why)
		}
	}
}

// TestMySQLConnectErrors: a refused login, an unknown database and a qualified --table in a
// database that does not exist each fail with one line that names the fix (exit status 1),
// without the password; inbox and capture refuse MariaDB/MySQL as a usage error (exit status 2)
// before connecting.
func TestMySQLConnectErrors(t *testing.T) {
	base := mariadbURL(t)
	cfg, _ := mysql.ParseDSN(mariadbtest.DSN())
	addr := cfg.Addr

	r := cli(t, nil, "status", "--db", "mysql://nosuchuser_"+randomHex(4)+":s3cret@"+addr+"/"+cfg.DBName)
	// MariaDB answers 1698 for a user it does not know, MySQL 1045.
	wantFailure(t, r, 1, "MariaDB/MySQL at "+addr+" refused the login (Access denied for user", "check the user and password in --db mysql://nosuchuser_", ":xxxxx@")
	if strings.Contains(r.stderr, "s3cret") {
		t.Fatalf("the password is shown: %s", r.stderr)
	}

	wrong := "wrong-" + randomHex(4)
	r = cli(t, nil, "dead", "list", "--db", "mysql://"+cfg.User+":"+wrong+"@"+addr+"/"+cfg.DBName)
	wantFailure(t, r, 1, "MariaDB/MySQL at "+addr+" refused the login (Access denied for user", "error 1045", "check the user and password in --db mysql://"+cfg.User+":xxxxx@")
	if strings.Contains(r.stderr, wrong) {
		t.Fatalf("the password is shown: %s", r.stderr)
	}

	missing := "nosuchdb_" + randomHex(4)
	u := strings.TrimSuffix(base, "/"+cfg.DBName) + "/" + missing
	wantStderr(t, cli(t, nil, "migrate", "--db", u), 1,
		fmt.Sprintf("outbox: database %q does not exist on MariaDB/MySQL at %s: create it with `CREATE DATABASE %s`, or name another one in --db %s", missing, addr, missing, u))

	table := missing + ".outbox"
	where := "MariaDB/MySQL at " + addr + "/" + cfg.DBName
	migrate := fmt.Sprintf("`outbox migrate --db %s --table %s`", base, table)
	wantStderr(t, cli(t, nil, "migrate", "--db", base, "--table", table), 1,
		fmt.Sprintf("outbox: cannot create outbox table %q in %s: database %q does not exist; create it first with `CREATE DATABASE %s`, then run %s again", table, where, missing, missing, migrate))
	wantStderr(t, cli(t, nil, "dead", "list", "--db", base, "--table", table), 1,
		fmt.Sprintf("outbox: outbox table %q not found in %s, nor its database %q: create the database first with `CREATE DATABASE %s`, then the table with %s", table, where, missing, missing, migrate))

	for _, args := range [][]string{
		{"inbox", "migrate", "--db", "mysql://root:s3cret@127.0.0.1:1/test"},
		{"capture", "install", "--db", "mysql://root:s3cret@127.0.0.1:1/test", "--table", "orders"},
		{"capture", "sql", "--db", "mariadb://root:s3cret@127.0.0.1:1/test", "--table", "orders"},
	} {
		r := cli(t, nil, args...)
		wantFailure(t, r, 2, "outbox "+args[0]+" supports PostgreSQL and SQLite only", "not MariaDB/MySQL", "give a postgres:// URL or an SQLite file")
		if strings.Contains(r.stderr, "s3cret") || strings.Contains(r.stderr, "connect") {
			t.Fatalf("%v: %s", args, r.stderr)
		}
	}
}

// TestMariaDBQualifiedTable: --table may name the database ("test.t"): migrate, status and
// dead list work on it and show it as given.
func TestMariaDBQualifiedTable(t *testing.T) {
	b := mariadbBackend()
	db, table := b.fresh(t)
	cfg, _ := mysql.ParseDSN(mariadbtest.DSN())
	qualified := cfg.DBName + "." + table
	if out := mustRun(t, nil, "migrate", "--db", db, "--table", qualified); out != fmt.Sprintf("outbox table %q is ready in MariaDB/MySQL at %s/%s\n", qualified, cfg.Addr, cfg.DBName) {
		t.Fatalf("migrate said %q", out)
	}
	if n := mariadbTableCount(t, table); n != 2 {
		t.Fatalf("%d of the outbox table and its key-lock table exist", n)
	}
	b.publish(t, db, table, []testEvent{{"q.a", "k", 1}, {"q.a", "k", 2}, {"q.b", "", 3}})
	if got := topicCounts(status(t, db, qualified)); !maps2Equal(got, map[string][2]int64{"q.a": {2, 0}, "q.b": {1, 0}}) {
		t.Fatalf("status of %s: %v", qualified, got)
	}
	if out := mustRun(t, nil, "dead", "list", "--db", db, "--table", qualified); out != "no dead letters\n" {
		t.Fatalf("dead list said %q", out)
	}
}

// TestMariaDBMatchTables: a --table pattern on MariaDB/MySQL matches the outbox tables of the
// current database by name, case-sensitively, '_' and '%' literally; other tables (the
// key-lock tables, a plain table) never match.
func TestMariaDBMatchTables(t *testing.T) {
	db := mariadbURL(t)
	prefix := fmt.Sprintf("mt_%d_%s", os.Getpid(), randomHex(4))
	tables := []string{prefix + "_a", prefix + "_b", prefix + "_c1"}
	t.Cleanup(func() { dropMariaDBTables(t, append(slices.Clone(tables), prefix+"_plain")...) })
	for _, tb := range tables {
		mustRun(t, nil, "migrate", "--db", db, "--table", tb)
	}
	if _, err := mariadbtest.Require(t).ExecContext(context.Background(), "CREATE TABLE `"+prefix+"_plain` (id INT PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	u, err := parseDBURL(db)
	if err != nil {
		t.Fatal(err)
	}
	d, err := openDB(t.Context(), u, "x", openOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	cfg, _ := mysql.ParseDSN(mariadbtest.DSN())
	for pattern, want := range map[string][]string{
		prefix + "_*":                  tables,
		prefix + "_?":                  tables[:2],
		prefix + "*1":                  tables[2:],
		strings.ToUpper(prefix) + "_*": nil,
		strings.ReplaceAll(prefix, "_", "%") + "*": nil,
		cfg.DBName + "." + prefix + "_?":           {cfg.DBName + "." + tables[0], cfg.DBName + "." + tables[1]},
		"*." + prefix + "_c*":                      {cfg.DBName + "." + tables[2]},
	} {
		got, err := d.matchTables(t.Context(), pattern)
		if err != nil {
			t.Fatalf("%s: %v", pattern, err)
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s: matched %v, want %v", pattern, got, want)
		}
	}
}

// TestMariaDBEndToEnd: the command on MariaDB from start to end. The demo (--keep) finishes
// like on PostgreSQL and SQLite and prints the mysql command that drops its three tables;
// status, status --watch and dead list then read its outbox table; cleanup deletes exactly
// the events the demo committed; the printed drop statement removes the tables. A demo
// without --keep leaves no table behind.
func TestMariaDBEndToEnd(t *testing.T) {
	db := mariadbURL(t)
	cfg, _ := mysql.ParseDSN(mariadbtest.DSN())
	r := cli(t, nil, "demo", "--db", db, "--transactions", "300", "--writers", "3", "--keys", "12", "--keep", "--quiet")
	lines := quietDemoLines(t, r, "3", "300", "12")
	if !strings.Contains(lines[0], fmt.Sprintf("MariaDB/MySQL at %s/%s → ", cfg.Addr, cfg.DBName)) {
		t.Fatalf("header %q does not name MariaDB", lines[0])
	}
	kept := regexp.MustCompile(`^  kept                tables (outbox_demo_[0-9a-f]{8}) and (demo_orders_[0-9a-f]{8}) in MariaDB/MySQL at `).FindStringSubmatch(lines[len(lines)-4])
	if kept == nil {
		t.Fatalf("no kept line before the summary:\n%s", r.stdout)
	}
	table, business := kept[1], kept[2]
	t.Cleanup(func() { dropMariaDBTables(t, table, business) })
	drop := "DROP TABLE " + business + ", " + table + ", " + table + "_keys"
	host, port, _ := strings.Cut(cfg.Addr, ":")
	want := []string{
		fmt.Sprintf("  inspect             outbox status --db %s --table %s", db, table),
		fmt.Sprintf("  drop                mysql --host=%s --port=%s --user=%s %s -e '%s'", host, port, cfg.User, cfg.DBName, drop),
	}
	if got := lines[len(lines)-3 : len(lines)-1]; strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("kept lines:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	committed, _ := strconv.Atoi(summary.FindStringSubmatch(lines[len(lines)-1])[2])

	if s := status(t, db, table); s.Pending != 0 || s.DeadLettered != 0 || len(s.Topics) != 0 {
		t.Fatalf("status of the demo's outbox: %+v", s)
	}
	p := start(t, nil, "status", "--db", db, "--table", table, "--watch", "100ms")
	emptyTotal := regexp.MustCompile(`(?m)^\s*TOTAL\s+0\s+0\s+-\s+0\s+0\s`)
	waitFor(t, 30*time.Second, "two refreshes of status --watch, each with an empty TOTAL row", func() bool {
		return len(emptyTotal.FindAllString(p.out.String(), -1)) >= 2 || !p.running()
	})
	if code := p.stop(t); code != 0 || !strings.Contains(p.out.String(), "every 100ms, Ctrl-C to stop") {
		t.Fatalf("status --watch: exit %d\nstdout: %s\nstderr: %s", code, p.out.String(), p.errb.String())
	}
	if out := mustRun(t, nil, "dead", "list", "--db", db, "--table", table); out != "no dead letters\n" {
		t.Fatalf("dead list said %q", out)
	}
	if out := mustRun(t, nil, "dead", "purge", "--db", db, "--table", table, "--topic", "*", "--yes"); out != "purged 0 dead-lettered events\n" {
		t.Fatalf("dead purge said %q", out)
	}
	out := mustRun(t, nil, "cleanup", "--db", db, "--table", table, "--published-older-than", "0s", "--yes")
	if want := fmt.Sprintf("deleted %d published events older than 0s\n", committed); out != want {
		t.Fatalf("cleanup said %q, want %q", out, want)
	}
	var rows int
	if err := mariadbtest.Require(t).QueryRowContext(context.Background(), "SELECT COUNT(*) FROM `"+table+"`").Scan(&rows); err != nil || rows != 0 {
		t.Fatalf("%d events left after cleanup (%v)", rows, err)
	}
	if _, err := mariadbtest.Require(t).ExecContext(context.Background(), drop); err != nil {
		t.Fatalf("the printed drop statement: %v", err)
	}
	if n := mariadbTableCount(t, table) + mariadbTableCount(t, business); n != 0 {
		t.Fatalf("%d tables left after the printed drop statement", n)
	}

	// Without --keep the demo drops its tables itself: no outbox_demo_ or demo_orders_ table
	// appears that was not there before (another run's, in the shared database).
	before := demoTables(t)
	checkDemo(t, cli(t, nil, "demo", "--db", db, "--transactions", "200", "--quiet"))
	for _, tb := range demoTables(t) {
		if !slices.Contains(before, tb) {
			t.Errorf("the demo left table %s", tb)
		}
	}
}

// demoTables lists the demo's tables in the shared MariaDB database.
func demoTables(t *testing.T) []string {
	t.Helper()
	names, err := dburl.SQLDB{DB: mariadbtest.Require(t)}.Strings(context.Background(),
		`SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND (TABLE_NAME LIKE 'outbox!_demo!_%' ESCAPE '!' OR TABLE_NAME LIKE 'demo!_orders!_%' ESCAPE '!')`)
	if err != nil {
		t.Fatal(err)
	}
	return names
}
