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
