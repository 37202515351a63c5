package main

import (
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"
)

// TestRelaySQLiteWakesOnCommit: `outbox relay` on an SQLite file polls once an hour, yet
// delivers events that another process commits within seconds: it watches the file's
// write-ahead log (wakeup/sqlitewal).
func TestRelaySQLiteWakesOnCommit(t *testing.T) {
	b := sqliteBackend()
	db, table := b.fresh(t)
	mustRun(t, nil, "migrate", "--db", db, "--table", table)
	rcv := newReceiver(t, http.StatusOK)
	p := start(t, []string{"OUTBOX_SECRET=" + rcv.secret}, "relay", "--db", db, "--table", table, "--to", rcv.URL+"/hook",
		"--allow-prefix", "127.0.0.0/8", "--poll-interval", "1h")
	var want []string
	for round := range 3 {
		var evs []testEvent
		for i := range 5 {
			evs = append(evs, testEvent{topic: "orders.created", key: "k", n: round*5 + i})
		}
		want = append(want, b.publish(t, db, table, evs)...)
		// The first round may be found by the relay's first poll; the later ones only by a wake-up.
		waitFor(t, 20*time.Second, fmt.Sprintf("round %d delivered", round), func() bool {
			if !p.running() {
				t.Fatalf("relay exited: %s", p.errb.String())
			}
			return len(rcv.received()) == len(want)
		})
	}
	if code := p.stop(t); code != 0 {
		t.Fatalf("relay exit status %d; stderr: %s", code, p.errb.String())
	}
	if got := rcv.received(); !slices.Equal(got, want) {
		t.Fatalf("received %v, want %v", got, want)
	}
	rcv.mu.Lock()
	defer rcv.mu.Unlock()
	if got := rcv.order["k"]; !slices.Equal(got, []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14}) {
		t.Fatalf("key order %v", got)
	}
}
