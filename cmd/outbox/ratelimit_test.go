package main

import (
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"
)

// TestRelayRateLimit: `outbox relay --rate-limit 100 --rate-burst 10` to a webhook delivers 300
// events in key order, no sooner than the limit allows ((300 − 10) / 100 = 2.9 s after the
// first delivery: a token bucket cannot deliver faster, however fast the machine), with no
// attempt counted for the events it held back.
func TestRelayRateLimit(t *testing.T) {
	b := postgresBackend()
	db, table := b.fresh(t)
	mustRun(t, nil, "migrate", "--db", db, "--table", table)
	var evs []testEvent
	for i := range 300 {
		evs = append(evs, testEvent{topic: "orders.created", key: fmt.Sprintf("k%d", i%10), n: i})
	}
	ids := b.publish(t, db, table, evs)
	rcv := newReceiver(t, http.StatusOK)
	p := start(t, []string{"OUTBOX_SECRET=" + rcv.secret}, "relay", "--db", db, "--table", table, "--to", rcv.URL+"/hook",
		"--allow-prefix", "127.0.0.0/8", "--poll-interval", "50ms", "--rate-limit", "100", "--rate-burst", "10", "--topics", "orders.*")
	p.runUntil(t, "all delivered", func() bool { return status(t, db, table).Pending == 0 })
	got := rcv.received()
	if !slices.Equal(sorted(got), sorted(ids)) {
		t.Fatalf("received %d ids, want the %d events", len(got), len(ids))
	}
	rcv.mu.Lock()
	first, last := rcv.at[got[0]], rcv.at[got[len(got)-1]]
	for k, ns := range rcv.order {
		if !slices.IsSorted(ns) {
			t.Errorf("key %s arrived out of order: %v", k, ns)
		}
	}
	requests := rcv.requests
	rcv.mu.Unlock()
	span := last.Sub(first)
	t.Logf("300 events in %s at --rate-limit 100 (%.1f events/s), %d requests", span.Round(time.Millisecond), 299/span.Seconds(), requests)
	if span < 2900*time.Millisecond {
		t.Errorf("300 events delivered within %s, want ≥ 2.9 s at 100 events/s with a burst of 10", span)
	}
	if requests != 300 {
		t.Errorf("%d requests for 300 events, want 300 (held events are not sent)", requests)
	}
	if s := status(t, db, table); s.DeadLettered != 0 {
		t.Errorf("status after the run: %+v", s)
	}
}

// TestRelayRateLimitFlags: bad values and batch destinations are usage errors naming the flag.
func TestRelayRateLimitFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--to", "http://127.0.0.1:9/hook", "--rate-limit", "-1"}, "--rate-limit must be a number of events per second, at least 0"},
		{[]string{"--to", "http://127.0.0.1:9/hook", "--rate-burst", "5"}, "--rate-burst needs --rate-limit"},
		{[]string{"--to", "http://127.0.0.1:9/hook", "--max-in-flight", "-2"}, "--max-in-flight must not be negative"},
		{[]string{"--to", "kafka://127.0.0.1:9", "--rate-limit", "10"}, "apply to http(s) and asynq destinations"},
	} {
		wantFailure(t, cli(t, nil, append([]string{"relay", "--db", "postgres://127.0.0.1:9/x"}, c.args...)...), 2, c.want)
	}
}
