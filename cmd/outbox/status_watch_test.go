package main

import (
	"bytes"
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/internal/privatepg"
)

// TestWatchStatus: each refresh prints a time line and the table; the second shows each
// topic's pending change per second since the first, a drained topic included, and the total.
func TestWatchStatus(t *testing.T) {
	snaps := [][]topicBacklog{
		{{Topic: "a", Backlog: outbox.Backlog{Pending: 100, OldestPendingAge: 2 * time.Second}}, {Topic: "b", Backlog: outbox.Backlog{Pending: 10, DeadLettered: 1}}},
		{{Topic: "a", Backlog: outbox.Backlog{Pending: 40, Held: 7, OldestPendingAge: time.Second}}},
	}
	ctx, cancel := context.WithCancel(context.Background())
	var reads int
	var buf bytes.Buffer
	err := watchStatus(ctx, &buf, 50*time.Millisecond, func(context.Context) ([]topicBacklog, error) {
		if reads == len(snaps)-1 {
			defer cancel()
		}
		reads++
		return snaps[reads-1], nil
	})
	if err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	// Only the first refresh is printed in full when the second read ends the watch: check
	// the first table, then run the second refresh's printing directly.
	if !strings.Contains(out, "every 50ms, Ctrl-C to stop\n") || !strings.Contains(out, "PENDING Δ/s") {
		t.Fatalf("output:\n%s", out)
	}
	var second bytes.Buffer
	printWatch(&second, snaps[1], map[string]int64{"a": 100, "b": 10}, 2*time.Second, true)
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(second.String()), "\n") {
		lines = append(lines, strings.Join(strings.Fields(l), " "))
	}
	want := []string{"TOPIC PENDING HELD OLDEST PENDING DEAD-LETTERED UNAVAILABLE PENDING Δ/s", "a 40 7 1s 0 0 -30.0", "b 0 0 - 0 0 -5.0", "TOTAL 40 7 1s 0 0 -35.0"}
	if strings.Join(lines, "\n") != strings.Join(want, "\n") {
		t.Errorf("second refresh:\n%s\nwant\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}
	first := strings.Join(strings.Fields(out), " ")
	if !strings.Contains(first, "a 100 0 2s 0 0 - b 10 0 - 1 0 - TOTAL 110 0 2s 1 0 -") {
		t.Errorf("first refresh:\n%s", out)
	}
}

// TestWatchStatusSurvivesDatabaseOutage: status --watch on a private PostgreSQL that is down
// when the watch starts, then up, then stopped under it, then up again: it keeps running,
// prints one timed line per failed refresh, shows the table whenever the server is up, and
// exits 0 on SIGTERM. A missing table still ends it at once (exit 1).
func TestWatchStatusSurvivesDatabaseOutage(t *testing.T) {
	srv := privatepg.Start(t)
	db := srv.DSN()
	mustRun(t, nil, "migrate", "--db", db)
	srv.Stop(t)
	p := start(t, nil, "status", "--db", db, "--watch", "100ms")
	defer func() {
		if t.Failed() {
			t.Logf("stdout:\n%s\nstderr:\n%s", p.out.String(), p.errb.String())
		}
	}()
	tableRe := regexp.MustCompile(`(?m)^ *TOTAL +\d`)
	failedRe := regexp.MustCompile(`(?m)^\d\d:\d\d:\d\d  reading the backlog failed \(retrying every 100ms, Ctrl-C to stop\): .*(connect|refused|closed|terminat|shut).*$`)
	tables := func() int { return len(tableRe.FindAllString(p.out.String(), -1)) }
	failed := func() int { return len(failedRe.FindAllString(p.out.String(), -1)) }
	waitAlive := func(what string, cond func() bool) {
		t.Helper()
		waitFor(t, 30*time.Second, what, func() bool {
			if !p.running() {
				t.Fatalf("status --watch exited (%v) waiting for %s", p.waitEr, what)
			}
			return cond()
		})
	}
	waitAlive("three failed refreshes while the server is down at start", func() bool { return failed() >= 3 })
	srv.Restart(t)
	waitAlive("a table once the server is up", func() bool { return tables() > 0 })
	srv.Stop(t)
	f := failed()
	waitAlive("three failed refreshes after the server stopped", func() bool { return failed() >= f+3 })
	srv.Restart(t)
	n := tables()
	waitAlive("a table after the restart", func() bool { return tables() > n })
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit status %d after SIGTERM; stderr: %s", code, p.errb.String())
	}
	if strings.Contains(p.out.String(), "\nreading the backlog failed") {
		t.Fatalf("a failed refresh took more than one line")
	}
	wantFailure(t, cli(t, nil, "status", "--db", db, "--table", "no_such_outbox", "--watch", "100ms"), 1, `outbox table "no_such_outbox" not found`)
}
