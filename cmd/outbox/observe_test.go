package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
)

// TestRelayObservability runs the relay with --http-addr against a webhook that refuses one
// event: /metrics counts 3 delivered, 1 failed and 1 dead-lettered, /healthz and /readyz answer
// 200, the log has exactly one WARN line (the retry) and one ERROR line (the dead letter), no
// router "Handler returned error" line, and a stop line with the summary; outbox_build_info
// names the binary's version, commit and Go version. Each failure line gives the event id once
// and the table as given; the INFO lines are the relay's own (the Router's are DEBUG).
func TestRelayObservability(t *testing.T) {
	b := postgresBackend()
	db, table := b.fresh(t)
	mustRun(t, nil, "migrate", "--db", db, "--table", table)
	b.publish(t, db, table, []testEvent{{"ok", "k1", 0}, {"ok", "k1", 1}, {"ok", "k2", 2}, {"bad", "kb", 99}})
	var requests atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		requests.Add(1)
		if regexp.MustCompile(`"n": *99\b`).Match(body) {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	p := start(t, nil, "relay", "--db", db, "--table", table, "--to", srv.URL+"/hook", "--allow-prefix", "127.0.0.0/8",
		"--poll-interval", "50ms", "--max-attempts", "2", "--retry-base", "20ms", "--http-addr", "127.0.0.1:0", "--backlog-interval", "100ms")
	base := httpBase(t, p)
	get := func(path string) (int, string) { return httpGet(t, base+path) }
	metric := metricOf
	var body, last string
	defer func() {
		if t.Failed() {
			t.Logf("last /metrics:\n%s\nlog:\n%s", last, p.errb.String())
		}
	}()
	p.runUntil(t, "3 delivered, 1 dead-lettered, backlog sampled", func() bool {
		_, body = get("/metrics")
		last = body
		if metric(body, `outbox_delivered_total{topic="ok"}`) != 3 || metric(body, `outbox_dead_lettered_total{topic="bad"}`) != 1 ||
			metric(body, `outbox_dead_lettered_events`) != 1 || metric(body, `outbox_pending_events`) != 0 {
			return false
		}
		if code, rb := get("/readyz"); code != 200 || rb != "ready\n" {
			t.Fatalf("/readyz = %d %q", code, rb)
		}
		if code, hb := get("/healthz"); code != 200 || hb != "ok\n" {
			t.Fatalf("/healthz = %d %q", code, hb)
		}
		return true
	})
	for series, want := range map[string]float64{`outbox_failed_total{topic="bad"}`: 1, `outbox_unavailable_total{topic="bad"}`: -1, `outbox_mark_failures_total`: 0,
		`outbox_destination_call_duration_seconds_count{destination="webhook",outcome="ok"}`:          3,
		`outbox_build_info{commit="unknown",goversion="` + runtime.Version() + `",version="(devel)"}`: 1, `outbox_destination_call_duration_seconds_count{destination="webhook",outcome="error"}`: 2} {
		if got := metric(body, series); got != want {
			t.Errorf("%s = %v, want %v", series, got, want)
		}
	}
	if n := requests.Load(); n != 5 {
		t.Errorf("webhook got %d requests, want 5 (3 + 2 attempts)", n)
	}

	log := p.errb.String()
	count := func(re string) int { return len(regexp.MustCompile(`(?m)`+re).FindAllString(log, -1)) }
	if n := count(`^.* level=WARN .*$`); n != 1 || count(`^.* level=WARN msg="outbox: delivery failed, will retry" .*topic=bad`) != 1 {
		t.Errorf("%d WARN lines, want exactly the one retry:\n%s", n, log)
	}
	if n := count(`^.* level=ERROR .*$`); n != 1 || count(`^.* level=ERROR msg="outbox: dead-lettered" .*topic=bad`) != 1 {
		t.Errorf("%d ERROR lines, want exactly the one dead letter:\n%s", n, log)
	}
	if strings.Contains(log, "Handler returned error") {
		t.Errorf("the router's duplicate line is logged:\n%s", log)
	}
	// Each failure line names the event once (its event_id field) and the table as given,
	// with no quotes of SQL's inside the log's.
	for _, l := range regexp.MustCompile(`(?m)^.* level=(WARN|ERROR) .*$`).FindAllString(log, -1) {
		id := regexp.MustCompile(`event_id=(\S+)`).FindStringSubmatch(l)
		if id == nil || strings.Count(l, id[1]) != 1 || !strings.Contains(l, " table="+table+" ") {
			t.Errorf("failure line: want the event id once and table=%s:\n%s", table, l)
		}
	}
	// Only the relay's own lines at INFO: the Router's start and stop lines are DEBUG.
	for _, l := range regexp.MustCompile(`(?m)^.* level=INFO .*$`).FindAllString(log, -1) {
		if !strings.Contains(l, `msg="outbox relay `) {
			t.Errorf("INFO line not the relay's own:\n%s", l)
		}
	}
	if count(`^time=\S+ level=INFO msg="outbox relay stopped" dead_lettered=1 delivered=3 failed=1 pending_at_stop=0 uptime=\d`) != 1 {
		t.Errorf("no stop summary line:\n%s", log)
	}
}
