package outbox_test

import (
	"fmt"
	"testing"
	"time"
)

// TestBacklogOverviewHeads: the overview counts as held exactly the events behind a failed
// (attempts > 0) or dead-lettered head, as BacklogByTopic and Backlog do, and not those behind
// a head made due again with no attempt, nor behind a head that merely precedes a failed
// event; capped, it counts the held events among the oldest it read only (every backend).
func TestBacklogOverviewHeads(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		schema := b.table(t)
		// Sequences: a1 b1 c1 d1 e1 u1 a2 b2 … (keys a-e, "" unordered), four rounds.
		b.seed(t, schema, "t", 24, []string{"a", "b", "c", "d", "e", ""})
		nth := func(key string, n int) string {
			return fmt.Sprintf(`sequence = (SELECT s FROM (SELECT sequence AS s FROM %q WHERE ordering_key = '%s' ORDER BY sequence LIMIT 1 OFFSET %d) x)`, schema.Table, key, n)
		}
		for _, q := range []string{
			`UPDATE %[1]q SET attempts = 2, last_error = 'boom', next_attempt_at = %[2]s WHERE ` + nth("a", 0),
			`UPDATE %[1]q SET attempts = 5, last_error = 'boom', dead_lettered_at = %[3]s WHERE ` + nth("b", 0),
			`UPDATE %[1]q SET attempts = 0, next_attempt_at = %[3]s WHERE ` + nth("c", 0),
			`UPDATE %[1]q SET attempts = 1, last_error = 'boom', next_attempt_at = %[2]s WHERE ` + nth("d", 1),
			`UPDATE %[1]q SET attempts = 5, last_error = 'boom', dead_lettered_at = %[3]s WHERE ordering_key = 'e'`,
		} {
			b.exec(t, fmt.Sprintf(q, schema.Table, b.at(time.Hour), b.at(0)))
		}
		sub := b.newSub(t, fastCfg(schema))
		bl, err := sub.Backlog(ctx)
		if err != nil {
			t.Fatal(err)
		}
		byTopic, err := sub.BacklogByTopic(ctx)
		if err != nil {
			t.Fatal(err)
		}
		ov, err := sub.BacklogOverview(ctx, 1000)
		if err != nil {
			t.Fatal(err)
		}
		// Held: a2-a4 behind a's failing head, b2-b4 behind b's dead one.
		if bl.Held != 6 || len(byTopic) != 1 || byTopic[0].Held != 6 || ov.Total.Held != 6 || ov.Total.Pending != 19 || ov.Total.DeadLettered != 5 || ov.Capped() {
			t.Fatalf("held: backlog %+v, by topic %+v, overview %+v; want 6 held, 19 pending, 5 dead", bl, byTopic, ov)
		}
		// The oldest 8 keyed pending events: a1 c1 d1 a2 b2 c2 d2 a3, of which a2, a3 and b2
		// are held; the 4 unordered ones are all read.
		ov, err = sub.BacklogOverview(ctx, 8)
		if err != nil {
			t.Fatal(err)
		}
		if !ov.PendingCapped || ov.DeadCapped || ov.HeldCapped || ov.Total.Pending != 12 || ov.Total.Held != 3 || ov.Total.DeadLettered != 5 {
			t.Fatalf("overview capped at 8: %+v; want 12 pending (capped), 3 held, 5 dead", ov)
		}
	})
}
