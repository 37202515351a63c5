package main

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/watermill-outbox/outbox/internal/pgtest"
)

// TestStatusShowsUnavailable: events last released because their destination was unavailable
// are counted per topic in status --json and named in one line after the table.
func TestStatusShowsUnavailable(t *testing.T) {
	pool := pgtest.Require(t)
	b := postgresBackend()
	db, table := b.fresh(t)
	mustRun(t, nil, "migrate", "--db", db, "--table", table)
	b.publish(t, db, table, []testEvent{{"t.a", "k1", 1}, {"t.a", "k2", 1}, {"t.b", "k3", 1}})
	if _, err := pool.Exec(context.Background(), fmt.Sprintf(`UPDATE %q SET last_error = 'unavailable: redis: dial tcp 127.0.0.1:6399: connect: connection refused' WHERE topic = 't.a'`, table)); err != nil {
		t.Fatal(err)
	}
	s := status(t, db, table)
	if s.Unavailable != 2 || len(s.Topics) != 2 || s.Topics[0].Unavailable != 2 || s.Topics[1].Unavailable != 0 {
		t.Fatalf("status --json %+v: want 2 unavailable, all on t.a", s)
	}
	out := mustRun(t, nil, "status", "--db", db, "--table", table)
	want := "destination unavailable: 2 pending events of t.a were last released because their destination was down (no attempt counted; the relay probes it and resumes on its own)\n"
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
