package postgres

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/watermill-outbox/outbox/internal/dialect"
	"github.com/watermill-outbox/outbox/internal/pgtest"
)

// TestReplayPlans runs the replay's statements as EXPLAIN (ANALYZE, BUFFERS) on a table of
// published events (200,000, or OUTBOX_REPLAY_PLAN_ROWS; one a second, five topics, 100 keys)
// plus 10,000 pending ones, for a window of 10,000 published events: the count and the scan
// read the published_at index (published_idx) over the window only, the read of 1,000 events
// is primary-key lookups; none reads the table sequentially, and each reads at most four
// buffers per event of the window (or per event read). OUTBOX_PLAN_LOG=1 logs each plan.
func TestReplayPlans(t *testing.T) {
	ctx := context.Background()
	db := pgtest.StdDB(t)
	name, tbl := migratedTable(t, db)
	d := Dialect{}
	q := dialect.DoubleQuote(name)
	rows := 200000
	if v, err := strconv.Atoi(os.Getenv("OUTBOX_REPLAY_PLAN_ROWS")); err == nil && v > 20000 {
		rows = v
	}
	const topics = `(ARRAY['orders.created', 'orders.paid', 'billing.invoice', 'mail', 'audit'])[1 + i % 5]`
	for _, st := range []string{
		fmt.Sprintf(`INSERT INTO %s ("id", "topic", "payload", "ordering_key", "created_at", "published_at")
			SELECT gen_random_uuid(), %s, '{}', CASE WHEN i %% 10 <> 0 THEN 'k' || (i %% 100) END,
			now() - (%[3]d - i) * interval '1 second', now() - (%[3]d - i) * interval '1 second' FROM generate_series(1, %[3]d) i`, q, topics, rows),
		fmt.Sprintf(`INSERT INTO %s ("id", "topic", "payload", "ordering_key") SELECT gen_random_uuid(), %s, '{}', 'k' || (i %% 100) FROM generate_series(1, 10000) i`, q, topics),
		`VACUUM ANALYZE ` + q,
	} {
		if _, err := db.ExecContext(ctx, st); err != nil {
			t.Fatal(err)
		}
	}
	var now time.Time
	if err := db.QueryRowContext(ctx, `SELECT now()`).Scan(&now); err != nil {
		t.Fatal(err)
	}
	// The window: 10,000 seconds in the middle of the history.
	mid := now.Add(-time.Duration(rows/2) * time.Second)
	win := dialect.ReplayFilter{Since: mid, Until: mid.Add(10000 * time.Second)}
	var seqs []int64
	rs, err := db.QueryContext(ctx, fmt.Sprintf(`SELECT "sequence" FROM %s WHERE "published_at" >= $1 ORDER BY "published_at" LIMIT 1000`, q), mid)
	if err != nil {
		t.Fatal(err)
	}
	for rs.Next() {
		var s int64
		rs.Scan(&s)
		seqs = append(seqs, s)
	}
	rs.Close()
	const window = 10000
	for _, op := range []struct {
		name  string
		run   func(ex dialect.Executor) error
		reads int // events the statement must read
	}{
		{"count window", func(ex dialect.Executor) error { _, _, err := d.CountReplay(ctx, ex, tbl, win); return err }, window},
		{"count window, one topic and two keys", func(ex dialect.Executor) error {
			f := win
			f.Topics, f.Keys = []dialect.Topic{{Value: "orders.paid"}}, []string{"k1", "k2"}
			_, _, err := d.CountReplay(ctx, ex, tbl, f)
			return err
		}, window},
		{"scan first page", func(ex dialect.Executor) error {
			_, err := d.ScanReplay(ctx, ex, tbl, win, dialect.ReplayMark{}, 10000)
			return err
		}, window},
		{"scan a page from a cursor", func(ex dialect.Executor) error {
			_, err := d.ScanReplay(ctx, ex, tbl, win, dialect.ReplayMark{PublishedAt: mid.Add(5000 * time.Second), Sequence: 1}, 1000)
			return err
		}, window / 2},
		{"read 1000", func(ex dialect.Executor) error { _, err := d.ReadReplay(ctx, ex, tbl, seqs); return err }, len(seqs)},
	} {
		t.Run(op.name, func(t *testing.T) {
			e := &explainer{db: db}
			if err := op.run(e); err != nil {
				t.Fatal(err)
			}
			for _, p := range e.plans {
				t.Logf("%d buffers, %.1f ms, indexes %v", p.buffers, p.ms, p.indexes)
				if os.Getenv("OUTBOX_PLAN_LOG") != "" {
					t.Log(p.text)
				}
				if slices.Contains(p.seq, name) {
					t.Errorf("sequential scan of the outbox table")
				}
				if p.buffers > 4*op.reads+20 {
					t.Errorf("%d buffers read, more than 4 per event of %d", p.buffers, op.reads)
				}
			}
			if len(e.plans) != 1 {
				t.Fatalf("%d statements, want 1", len(e.plans))
			}
		})
	}
}
