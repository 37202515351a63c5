package sqlite

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/watermill-outbox/outbox/internal/dialect"
	"github.com/watermill-outbox/outbox/internal/dialect/dialecttest"
)

// planRecorder is an Executor inside the caller's transaction (InTx, so ActOnHead's steps run
// on it too) that records the EXPLAIN QUERY PLAN of every statement before running it.
type planRecorder struct {
	dialect.StdSQL
	plans []string
}

func (p *planRecorder) explain(ctx context.Context, q string, args []any) error {
	rs, err := p.StdSQL.Query(ctx, "EXPLAIN QUERY PLAN "+q, args...)
	if err != nil {
		return fmt.Errorf("EXPLAIN QUERY PLAN %s: %w", q, err)
	}
	defer rs.Close()
	var b strings.Builder
	for rs.Next() {
		var id, parent, unused int
		var detail string
		if err := rs.Scan(&id, &parent, &unused, &detail); err != nil {
			return err
		}
		b.WriteString(detail + "\n")
	}
	p.plans = append(p.plans, b.String())
	return rs.Err()
}

func (p *planRecorder) Query(ctx context.Context, q string, args ...any) (dialect.Rows, error) {
	if err := p.explain(ctx, q, args); err != nil {
		return nil, err
	}
	return p.StdSQL.Query(ctx, q, args...)
}

func (p *planRecorder) Exec(ctx context.Context, q string, args ...any) (int64, error) {
	if err := p.explain(ctx, q, args); err != nil {
		return 0, err
	}
	return p.StdSQL.Exec(ctx, q, args...)
}

func (p *planRecorder) InTx() bool { return true }

// TestOperatorPlans: every statement of the operator's reads and actions (dialect.Operator)
// and of the narrowed dead-letter filters reads the outbox table only through its partial
// indexes of live events (keyed_idx, unordered_idx, key_idx, dead_idx), a range of
// published_idx (DeliveryStats' window) or the primary key: never a scan of the table or of an
// index that holds the published history. The table holds 20,000 published events, 1,000
// pending (some failed, some leased) and 50 dead-lettered ones, ANALYZEd. OUTBOX_PLAN_DUMP=file
// writes the plans there.
func TestOperatorPlans(t *testing.T) {
	ctx := context.Background()
	db := openPool(t, filepath.Join(t.TempDir(), "plans.db"), 5000)
	tb := &dialect.Table{Parts: []string{"ob"}, IndexBase: "ob"}
	d := Dialect{}
	if err := d.Migrate(ctx, dialect.StdSQL{D: db}, tb); err != nil {
		t.Fatal(err)
	}
	now := time.Now().UnixMicro()
	for _, q := range []string{
		// History: published up to 20,000 s ago.
		`INSERT INTO "ob" ("id", "topic", "payload", "ordering_key", "created_at", "published_at")
		WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 20000)
		SELECT 'p' || i, 't' || (i % 5), '{}', CASE WHEN i % 2 = 0 THEN 'k' || (i % 500) END, $1 - i * 1000000, $1 - i * 1000000 + 500000 FROM n`,
		// Pending: every 50th failed (due in an hour), every 3rd leased.
		`INSERT INTO "ob" ("id", "topic", "payload", "ordering_key", "attempts", "last_error", "next_attempt_at", "lease_until", "leased_by")
		WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 1000)
		SELECT 'q' || i, 't' || (i % 5), '{}', CASE WHEN i % 2 = 0 THEN 'k' || (i % 100) END, CASE WHEN i % 50 = 0 THEN 1 ELSE 0 END,
			CASE WHEN i % 50 = 0 THEN 'boom' END, CASE WHEN i % 50 = 0 THEN $1 + 3600000000 END,
			CASE WHEN i % 3 = 0 THEN $1 + 60000000 END, CASE WHEN i % 3 = 0 THEN 'r#0123456789ab#1' END FROM n`,
		`INSERT INTO "ob" ("id", "topic", "payload", "ordering_key", "attempts", "last_error", "dead_lettered_at")
		WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 50)
		SELECT 'd' || i, 't' || (i % 5), '{}', CASE WHEN i % 2 = 0 THEN 'k' || (i % 100) END, 5, 'boom', $1 - i * 60000000 FROM n`,
		`ANALYZE`,
	} {
		if _, err := db.ExecContext(ctx, q, now); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	// A failed keyed head to act on: the lowest failed keyed pending event whose key has no
	// earlier unpublished event.
	var key string
	var head int64
	if err := db.QueryRowContext(ctx, `SELECT o."ordering_key", o."sequence" FROM "ob" o WHERE o."published_at" IS NULL AND o."attempts" > 0 AND o."ordering_key" IS NOT NULL
		AND o."dead_lettered_at" IS NULL AND o."sequence" = (SELECT min(e."sequence") FROM "ob" e WHERE e."published_at" IS NULL AND e."ordering_key" = o."ordering_key") LIMIT 1`).Scan(&key, &head); err != nil {
		t.Fatal(err)
	}
	ops := dialecttest.OperatorCalls(ctx, d, tb, key, head)
	table := regexp.MustCompile(`^(SCAN|SEARCH) (ob|o|e|r|s)\b(.*)$`)
	live := regexp.MustCompile(`USING (COVERING )?INDEX ob_(keyed_idx|unordered_idx|key_idx|dead_idx)\b`)
	var dump strings.Builder
	for _, op := range ops {
		t.Run(op.Name, func(t *testing.T) {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback()
			rec := &planRecorder{StdSQL: dialect.StdSQL{D: tx, Tx: true}}
			if err := op.Run(rec); err != nil {
				t.Fatal(err)
			}
			if len(rec.plans) == 0 {
				t.Fatal("no statement ran")
			}
			dump.WriteString("== " + op.Name + "\n" + strings.Join(rec.plans, "-- then\n"))
			for _, plan := range rec.plans {
				for _, line := range strings.Split(plan, "\n") {
					m := table.FindStringSubmatch(strings.TrimSpace(line))
					if m == nil {
						continue
					}
					ok := live.MatchString(m[3]) || (m[1] == "SEARCH" && (strings.Contains(m[3], "INTEGER PRIMARY KEY") ||
						strings.Contains(m[3], "INDEX ob_published_idx (published_at>?)")))
					if !ok {
						t.Errorf("%q reads the table outside its live indexes, the primary key and published_at's window:\n%s", line, plan)
					}
				}
			}
		})
	}
	if f := os.Getenv("OUTBOX_PLAN_DUMP"); f != "" {
		if err := os.WriteFile(f, []byte(dump.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
