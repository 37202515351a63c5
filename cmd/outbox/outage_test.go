package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-outbox/outbox/internal/brokertest"
	"github.com/watermill-outbox/outbox/internal/pgtest"
)

// TestStatusShowsUnavailable: the pending events of a topic with an event last released
// because its destination was unavailable are counted per topic in status --json and named in
// one line after the table.
func TestStatusShowsUnavailable(t *testing.T) {
	pool := pgtest.Require(t)
	b := postgresBackend()
	db, table := b.fresh(t)
	mustRun(t, nil, "migrate", "--db", db, "--table", table)
	b.publish(t, db, table, []testEvent{{"t.a", "k1", 1}, {"t.a", "k2", 1}, {"t.b", "k3", 1}})
	if _, err := pool.Exec(context.Background(), fmt.Sprintf(`UPDATE %q SET last_error = 'forwarder: publish event x: unavailable: redis: dial tcp 127.0.0.1:6399: connect: connection refused', last_error_class = 'unavailable' WHERE topic = 't.a' AND ordering_key = 'k1'`, table)); err != nil {
		t.Fatal(err)
	}
	s := status(t, db, table)
	if s.Unavailable != 2 || len(s.Topics) != 2 || s.Topics[0].Unavailable != 2 || s.Topics[1].Unavailable != 0 {
		t.Fatalf("status --json %+v: want 2 unavailable, all on t.a", s)
	}
	out := mustRun(t, nil, "status", "--db", db, "--table", table)
	want := "destination unavailable: 2 pending events of t.a are held because their destination was down at the last delivery (no attempt counted; the relay probes it and resumes on its own)\n"
	if !strings.HasSuffix(out, want) {
		t.Fatalf("status output does not end with %q:\n%s", want, out)
	}
}

// TestStatusShowsHeld: events behind a dead-lettered or failed first event of their key are
// counted per topic in status --json (under their own topic) and named in a line after the
// table.
func TestStatusShowsHeld(t *testing.T) {
	pool := pgtest.Require(t)
	b := postgresBackend()
	db, table := b.fresh(t)
	mustRun(t, nil, "migrate", "--db", db, "--table", table)
	// k1: dead head, two held (one on t.b); k2: failed head (attempts 1), one held; k3: no
	// failure; unordered events are never held.
	b.publish(t, db, table, []testEvent{{"t.a", "k1", 1}, {"t.a", "k1", 2}, {"t.b", "k1", 3}, {"t.a", "k2", 4}, {"t.a", "k2", 5},
		{"t.a", "k3", 6}, {"t.a", "k3", 7}, {"t.a", "", 8}})
	for _, q := range []string{
		`UPDATE %q SET dead_lettered_at = now(), attempts = 3 WHERE sequence = (SELECT min(sequence) FROM %[1]q WHERE ordering_key = 'k1')`,
		`UPDATE %q SET attempts = 1, next_attempt_at = now() + interval '1 hour' WHERE sequence = (SELECT min(sequence) FROM %[1]q WHERE ordering_key = 'k2')`,
	} {
		if _, err := pool.Exec(context.Background(), fmt.Sprintf(q, table)); err != nil {
			t.Fatal(err)
		}
	}
	s := status(t, db, table)
	if s.Held != 3 || s.Pending != 7 || len(s.Topics) != 2 || s.Topics[0].Held != 2 || s.Topics[1].Held != 1 {
		t.Fatalf("status --json %+v: want 3 held, 2 on t.a and 1 on t.b, 7 pending", s)
	}
	out := mustRun(t, nil, "status", "--db", db, "--table", table)
	if want := "held: 3 pending events wait behind a failed or dead-lettered first event of their ordering key (see outbox dead list)\n"; !strings.HasSuffix(out, want) {
		t.Fatalf("status output does not end with %q:\n%s", want, out)
	}
}

// TestRelayOutageBacklog: a relay to a private Redis that is killed while events wait: status
// --json's unavailable count and the outbox_unavailable_events gauge equal the pending events
// of the paused topics (every one of them is held, not only the one the relay tried), no
// attempt is charged, and both return to 0 once Redis is back and everything is delivered,
// each event exactly once.
func TestRelayOutageBacklog(t *testing.T) {
	pool := pgtest.Require(t)
	b := postgresBackend()
	db, table := b.fresh(t)
	mustRun(t, nil, "migrate", "--db", db, "--table", table)
	addr, startRedis := brokertest.PrivateRedis(t)
	rs := startRedis()
	p := start(t, nil, "relay", "--db", db, "--table", table, "--to", "redis://"+addr, "--poll-interval", "50ms",
		"--unavailable-backoff", "100ms", "--unavailable-backoff-max", "300ms", "--http-addr", "127.0.0.1:0", "--backlog-interval", "100ms")
	base := httpBase(t, p)
	ids := b.publish(t, db, table, []testEvent{{"t.a", "k0", 0}, {"t.a", "k1", 1}, {"t.b", "", 2}})
	waitFor(t, 30*time.Second, "the first events delivered", func() bool { return status(t, db, table).Pending == 0 })

	if err := rs.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_, _ = rs.Process.Wait()
	var evs []testEvent
	for i := range 20 {
		evs = append(evs, testEvent{"t.a", fmt.Sprintf("k%d", i%4), 10 + i})
	}
	for i := range 5 {
		evs = append(evs, testEvent{"t.b", "", 30 + i})
	}
	ids = append(ids, b.publish(t, db, table, evs)...)
	var s statusJSON
	var metrics string
	waitFor(t, 30*time.Second, "status and gauge count the 25 held events", func() bool {
		s = status(t, db, table)
		_, metrics = httpGet(t, base+"/metrics")
		return s.Pending == 25 && s.Unavailable == 25 && len(s.Topics) == 2 && s.Topics[0].Unavailable == 20 && s.Topics[1].Unavailable == 5 &&
			metricOf(metrics, "outbox_unavailable_events") == 25
	})
	if v := metricOf(metrics, `outbox_destination_unavailable{destination="redis `+addr+`"}`); v != 1 {
		t.Errorf("outbox_destination_unavailable %v during the outage, want 1", v)
	}
	var charged int
	if err := pool.QueryRow(context.Background(), fmt.Sprintf(`SELECT count(*) FROM %q WHERE attempts > 0 OR dead_lettered_at IS NOT NULL`, table)).Scan(&charged); err != nil {
		t.Fatal(err)
	}
	if charged != 0 {
		t.Fatalf("%d events charged an attempt during the outage", charged)
	}
	out := mustRun(t, nil, "status", "--db", db, "--table", table)
	if want := "destination unavailable: 25 pending events of t.a, t.b are held"; !strings.Contains(out, want) {
		t.Fatalf("status output lacks %q:\n%s", want, out)
	}

	startRedis()
	p.runUntil(t, "everything delivered and nothing counted unavailable", func() bool {
		s = status(t, db, table)
		_, metrics = httpGet(t, base+"/metrics")
		return s.Pending == 0 && s.Unavailable == 0 && metricOf(metrics, "outbox_unavailable_events") == 0 &&
			metricOf(metrics, "outbox_pending_events") == 0
	})
	// Redis was killed, not flushed: the first 3 events are in its streams only if it saved
	// them; it runs with --save "" and no AOF, so only the 25 written after the restart are.
	got := redisStreamIDs(t, addr, "t.a", "t.b")
	if !slices.Equal(sorted(got), sorted(ids[3:])) {
		t.Fatalf("Redis holds %d entries %v, want the 25 events written during the outage once each", len(got), got)
	}
}

// redisStreamIDs returns the event ids (watermill's message UUID field) of every entry of the
// given streams at addr.
func redisStreamIDs(t *testing.T, addr string, streams ...string) []string {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	var ids []string
	for _, st := range streams {
		entries, err := c.XRange(context.Background(), st, "-", "+").Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			id, _ := e.Values["_watermill_message_uuid"].(string)
			ids = append(ids, id)
		}
	}
	return ids
}

// TestRelayRefusesOutdatedTable: a table made before last_error_class existed is refused at
// start with one line naming the column and `outbox migrate` (the relay would deliver and then
// fail every mark); after migrate the relay starts.
func TestRelayRefusesOutdatedTable(t *testing.T) {
	pool := pgtest.Require(t)
	db, table := pgtest.DSN(), pgtest.Table(t)
	mustRun(t, nil, "migrate", "--db", db, "--table", table)
	if _, err := pool.Exec(context.Background(), fmt.Sprintf(`ALTER TABLE %q DROP COLUMN last_error_class`, table)); err != nil {
		t.Fatal(err)
	}
	addr := brokertest.ClosedPort(t)
	wantFailure(t, cli(t, nil, "relay", "--db", db, "--table", table, "--to", "redis://"+addr), 1, "lacks last_error_class", "upgrade it with `outbox migrate")
	mustRun(t, nil, "migrate", "--db", db, "--table", table)
	if s := status(t, db, table); s.Pending != 0 {
		t.Fatalf("status after migrate: %+v", s)
	}
}
