package main

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestReplayCommand: with a relay running throughout, replay counts the events published in
// the window (topic-filtered), sends nothing without --yes (exit 2, naming the count), prints
// the count with --dry-run, and with --yes writes copies that the relay delivers once more, in
// each key's order, under new ids. Bad flags are usage errors before any connection.
func TestReplayCommand(t *testing.T) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			db, table := b.fresh(t)
			mustRun(t, nil, "migrate", "--db", db, "--table", table)
			ids := b.publish(t, db, table, []testEvent{
				{"r.a", "k1", 1}, {"r.a", "k1", 2}, {"r.a", "k2", 1}, {"r.b", "k1", 3}, {"x", "", 1},
			})
			rcv := newReceiver(t, http.StatusOK)
			p := start(t, nil, "relay", "--db", db, "--table", table, "--to", rcv.URL, "--secret", rcv.secret,
				"--allow-prefix", "127.0.0.1", "--poll-interval", "50ms")
			received := func() ([]string, map[string][]int) {
				rcv.mu.Lock()
				defer rcv.mu.Unlock()
				order := map[string][]int{}
				for k, v := range rcv.order {
					order[k] = slices.Clone(v)
				}
				return slices.Clone(rcv.ids), order
			}
			waitFor(t, 30*time.Second, "all delivered", func() bool {
				got, _ := received()
				return len(got) == len(ids) && status(t, db, table).Pending == 0 // delivered and marked
			})

			args := []string{"replay", "--db", db, "--table", table, "--since", "1h", "--topic", "r.*"}
			out := mustRun(t, nil, append(args, "--dry-run")...)
			if !strings.HasPrefix(out, "would replay 4 events published from ") || !strings.HasSuffix(out, " (dry run: nothing sent)\n") {
				t.Fatalf("replay --dry-run said %q", out)
			}
			r := cli(t, nil, args...)
			if r.code != 2 || !strings.HasPrefix(r.stderr, "outbox: replay would replay 4 events published from ") ||
				!strings.HasSuffix(r.stderr, "; nothing was sent: pass --yes to replay, or --dry-run to only count\n") {
				t.Fatalf("replay without --yes: exit %d, stderr %q", r.code, r.stderr)
			}
			for _, c := range []struct {
				args []string
				msg  string
			}{
				{[]string{"--since", "yesterday"}, `--since "yesterday" is neither an RFC 3339 time`},
				{[]string{"--since", "1h", "--until", "2h"}, "--until "},
				{[]string{"--since", "1h", "--topic", "a*b"}, `--topic "a*b" is not a topic pattern`},
				{[]string{"--since", "1h", "--key", strings.Repeat("k", 256)}, "--key: ordering key of 256 bytes: give 1..255"},
				{[]string{"--since", "1h", "--batch-size", "0"}, "--batch-size 0: give 1..1000"},
				{[]string{"--since", "1h", "--yes", "--dry-run"}, "--yes and --dry-run do not go together"},
			} {
				r := cli(t, nil, append([]string{"replay", "--db", "postgres://127.0.0.1:1/none", "--table", table}, c.args...)...)
				if r.code != 2 || !strings.Contains(r.stderr, c.msg) {
					t.Errorf("replay %v: exit %d, stderr %q; want exit 2 and %q", c.args, r.code, r.stderr, c.msg)
				}
			}
			out = mustRun(t, nil, append(args, "--yes")...)
			if !strings.HasPrefix(out, "replayed 4 events published from ") || !strings.Contains(out, " (replay id ") {
				t.Fatalf("replay --yes said %q", out)
			}
			p.runUntil(t, "the copies delivered", func() bool {
				got, _ := received()
				return len(got) == len(ids)+4
			})
			got, order := received()
			for _, id := range got[len(ids):] {
				if slices.Contains(ids, id) {
					t.Fatalf("a copy arrived under an original's id %s", id)
				}
			}
			if fmt.Sprint(order["k1"]) != "[1 2 3 1 2 3]" || fmt.Sprint(order["k2"]) != "[1 1]" {
				t.Fatalf("order per key %v", order)
			}
		})
	}
}
