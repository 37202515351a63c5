package main

import (
	"bufio"
	"context"
	"database/sql"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/watermill-outbox/outbox/internal/pgtest"
)

// TestConsoleCommand: `outbox console` serves the pages on the address it prints, is read-only
// without --token (an action answers 403), creates its audit table, and stops on SIGINT with
// status 0.
func TestConsoleCommand(t *testing.T) {
	pool := pgtest.Require(t)
	table := pgtest.Table(t)
	mustRun(t, nil, "migrate", "--db", pgtest.DSN(), "--table", table)
	t.Cleanup(func() {
		pool.Exec(context.Background(), `DROP TABLE IF EXISTS "`+table+`", "`+table+`_console_audit"`)
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, "console", "--db", pgtest.DSN(), "--table", table, "--addr", "127.0.0.1:0")
	cmd.Env = cleanEnv(nil)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("first line: %q, %v", line, err)
	}
	base, ok := strings.CutPrefix(strings.TrimSpace(line), "outbox console on ")
	base, _, _ = strings.Cut(base, " ")
	if !ok || !strings.HasPrefix(base, "http://127.0.0.1:") || !strings.HasSuffix(line, "(read-only)\n") {
		t.Fatalf("first line %q, want the address on 127.0.0.1 and read-only", line)
	}
	base = strings.TrimSuffix(base, "/")
	for _, p := range []string{"/", "/keys", "/dead", "/audit", "/destinations"} {
		resp, err := http.Get(base + p)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "read-only") {
			t.Errorf("GET %s: %d, read-only badge %v", p, resp.StatusCode, strings.Contains(string(body), "read-only"))
		}
	}
	resp, err := http.PostForm(base+"/dead/apply", url.Values{"action": {"purge"}, "topic": {"*"}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("POST to a read-only console: %d, want 403", resp.StatusCode)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM "`+table+`_console_audit"`).Scan(&n); err != nil || n != 0 {
		t.Errorf("audit table: %d rows, %v; want it created and empty", n, err)
	}
	_ = cmd.Process.Signal(syscall.SIGINT)
	if err := cmd.Wait(); err != nil {
		t.Errorf("console after SIGINT: %v, want exit 0", err)
	}
}

// TestConsoleFlags: conflicting or out-of-range flags are usage errors (exit 2) before the
// database is opened.
func TestConsoleFlags(t *testing.T) {
	wantStderr(t, cli(t, nil, "console", "--db", "x.db", "--token", "a", "--basic-auth", "u:p"), 2,
		"outbox: give --token or --basic-auth, not both")
	for _, v := range []string{"0", "-5", "1000001"} {
		wantStderr(t, cli(t, nil, "console", "--db", "x.db", "--overview-limit", v), 2,
			"outbox: --overview-limit must be within 1..1000000 (got "+v+")")
	}
	wantStderr(t, cli(t, nil, "console", "--db", "x.db", "--overview-limit", "many"), 2,
		`outbox: --overview-limit "many" is not a whole number: give e.g. --overview-limit 2000 (see outbox console --help)`)
}

// TestRelayConsole: `outbox relay --http-addr … --console` serves the console beside /metrics
// and /healthz, and its destinations page shows the relay's outage of a webhook that answers
// 503.
func TestRelayConsole(t *testing.T) {
	b := postgresBackend()
	db, table := b.fresh(t)
	mustRun(t, nil, "migrate", "--db", db, "--table", table)
	b.publish(t, db, table, []testEvent{{"mail", "k1", 0}})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	p := start(t, nil, "relay", "--db", db, "--table", table, "--to", srv.URL+"/hook", "--allow-prefix", "127.0.0.0/8",
		"--poll-interval", "50ms", "--http-addr", "127.0.0.1:0", "--console")
	base := httpBase(t, p)
	p.runUntil(t, "the console shows the webhook's outage", func() bool {
		code, body := httpGet(t, base+"/destinations")
		if code != 200 || !strings.Contains(body, `id="outages"`) || !strings.Contains(body, "mail") {
			return false
		}
		if code, body := httpGet(t, base+"/healthz"); code != 200 || body != "ok\n" {
			t.Errorf("/healthz = %d %q", code, body)
		}
		if code, body := httpGet(t, base+"/"); code != 200 || !strings.Contains(body, "read-only") {
			t.Errorf("console overview: %d, read-only %v", code, strings.Contains(body, "read-only"))
		}
		return true
	})
	wantStderr(t, cli(t, nil, "relay", "--db", db, "--table", table, "--to", "http://127.0.0.1:1/", "--allow-prefix", "127.0.0.0/8", "--console"), 2,
		"outbox: --console and --console-token need --http-addr (the address the console is served on)")
}

// TestConsoleCommandSQLite: `outbox console` on a SQLite file serves every page (the blocked
// keys, the overview with its charts and leases) with --overview-limit, and creates its audit
// table in SQLite's SQL.
func TestConsoleCommandSQLite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "outbox.db")
	mustRun(t, nil, "migrate", "--db", path)
	p := start(t, nil, "console", "--db", path, "--addr", "127.0.0.1:0", "--overview-limit", "5")
	var base string
	waitFor(t, 30*time.Second, "the console's address", func() bool {
		if m := regexp.MustCompile(`outbox console on (http://127\.0\.0\.1:\d+)/ \(read-only\)`).FindStringSubmatch(p.out.String()); m != nil {
			base = m[1]
			return true
		}
		if !p.running() {
			t.Fatalf("console exited: %s", p.errb.String())
		}
		return false
	})
	for _, path := range []string{"/", "/keys", "/dead?topic=*&key=k&error=x", "/audit"} {
		if code, body := httpGet(t, base+path); code != http.StatusOK || strings.Contains(body, "not supported") {
			t.Errorf("GET %s: %d\n%s", path, code, body)
		}
	}
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var n int
	if err := db.QueryRow(`SELECT count(*) FROM "watermill_outbox_console_audit"`).Scan(&n); err != nil || n != 0 {
		t.Errorf("audit table: %d rows, %v; want it created and empty", n, err)
	}
}
