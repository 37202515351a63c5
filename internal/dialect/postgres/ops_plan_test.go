package postgres

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/watermill-outbox/outbox/internal/dialect"
	"github.com/watermill-outbox/outbox/internal/pgtest"
)

// explainer is an Executor that runs each statement as EXPLAIN (ANALYZE, BUFFERS) in a
// transaction it rolls back, keeps the plan, and returns no rows.
type explainer struct {
	db    *sql.DB
	plans []opPlan
}

// opPlan is what one statement's plan read: shared buffers (hit + read) of the whole
// statement, the indexes it used, the relations it scanned sequentially, and its time.
type opPlan struct {
	buffers int
	indexes []string
	seq     []string
	ms      float64
	text    string
}

func (e *explainer) explain(ctx context.Context, q string, args ...any) error {
	tx, err := e.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	var raw string
	if err := tx.QueryRowContext(ctx, `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) `+q, args...).Scan(&raw); err != nil {
		return fmt.Errorf("explain %s: %w", q, err)
	}
	var doc []struct {
		Plan map[string]any `json:"Plan"`
		Exec float64        `json:"Execution Time"`
	}
	if err := json.Unmarshal([]byte(raw), &doc); err != nil {
		return err
	}
	p := opPlan{ms: doc[0].Exec, text: raw}
	hit, _ := doc[0].Plan["Shared Hit Blocks"].(float64)
	read, _ := doc[0].Plan["Shared Read Blocks"].(float64)
	p.buffers = int(hit + read)
	var walk func(v any)
	walk = func(v any) {
		switch n := v.(type) {
		case map[string]any:
			if ix, ok := n["Index Name"].(string); ok && !slices.Contains(p.indexes, ix) {
				p.indexes = append(p.indexes, ix)
			}
			if n["Node Type"] == "Seq Scan" {
				p.seq = append(p.seq, fmt.Sprint(n["Relation Name"]))
			}
			for _, c := range n {
				walk(c)
			}
		case []any:
			for _, c := range n {
				walk(c)
			}
		}
	}
	walk(doc[0].Plan)
	e.plans = append(e.plans, p)
	return nil
}

func (e *explainer) Query(ctx context.Context, q string, args ...any) (dialect.Rows, error) {
	if err := e.explain(ctx, q, args...); err != nil {
		return nil, err
	}
	return dialect.StdSQL{D: e.db}.Query(ctx, `SELECT 1 WHERE false`)
}

func (e *explainer) Exec(ctx context.Context, q string, args ...any) (int64, error) {
	return 0, e.explain(ctx, q, args...)
}

func (e *explainer) InTx() bool { return false }
func (e *explainer) OneShot(args []any) []any {
	return dialect.StdSQL{D: e.db, Pgx: true}.OneShot(args)
}
func (e *explainer) Handle() any { return e.db }

// TestOperationPlans runs every operation of the PostgreSQL dialect (dead letters by topic,
// prefix, id and age; cleanup of published and dead-lettered events; backlog totals and by
// topic; take-back; the idempotency read-backs) as EXPLAIN (ANALYZE, BUFFERS) on a table of
// 200,000 published events (five topics, half keyed over 1,000 keys), 10,000 pending and 100
// dead-lettered ones, and checks that none reads the table sequentially and that each reads
// at most one buffer per live event (pending or dead) plus five per row it deletes: each is
// bounded by the live work or by the rows it changes, not by the history. No operation uses a
// (topic, sequence) index (the table has none any more). OUTBOX_PLAN_LOG=1 logs each plan.
func TestOperationPlans(t *testing.T) {
	ctx := context.Background()
	db := pgtest.StdDB(t)
	name, tbl := migratedTable(t, db)
	d := Dialect{}
	q := dialect.DoubleQuote(name)
	const topics = `(ARRAY['orders.created', 'orders.paid', 'billing.invoice', 'mail', 'audit'])[1 + i % 5]`
	for _, st := range []string{
		fmt.Sprintf(`INSERT INTO %s ("id", "topic", "payload", "ordering_key", "idempotency_key", "created_at", "published_at")
			SELECT gen_random_uuid(), %s, '{}', CASE WHEN i %% 2 = 0 THEN 'k' || (i %% 1000) END, CASE WHEN i %% 10 = 0 THEN 'idem' || i END,
			now() - (200000 - i) * interval '1 second', now() - (200000 - i) * interval '1 second' FROM generate_series(1, 200000) i`, q, topics),
		fmt.Sprintf(`INSERT INTO %s ("id", "topic", "payload", "ordering_key", "attempts", "last_error", "dead_lettered_at")
			SELECT gen_random_uuid(), %s, '{}', CASE WHEN i %% 2 = 0 THEN 'k' || (i %% 1000) END, 10, 'boom', now() - i * interval '1 minute' FROM generate_series(1, 100) i`, q, topics),
		fmt.Sprintf(`INSERT INTO %s ("id", "topic", "payload", "ordering_key", "attempts", "last_error", "last_error_class", "lease_until", "leased_by")
			SELECT gen_random_uuid(), %s, '{}', CASE WHEN i %% 2 = 0 THEN 'k' || (i %% 1000) END, CASE WHEN i %% 100 = 0 THEN 1 ELSE 0 END,
			CASE WHEN i %% 200 = 0 THEN 'unavailable: x' END, CASE WHEN i %% 200 = 0 THEN 'unavailable' END, CASE WHEN i %% 3 = 0 THEN now() + interval '1 minute' END, CASE WHEN i %% 3 = 0 THEN 'r1abcdef012345#1' END
			FROM generate_series(1, 10000) i`, q, topics),
		`VACUUM ANALYZE ` + q,
	} {
		if _, err := db.ExecContext(ctx, st); err != nil {
			t.Fatal(err)
		}
	}
	var heap int
	if err := db.QueryRowContext(ctx, `SELECT pg_relation_size($1::regclass) / 8192`, q).Scan(&heap); err != nil {
		t.Fatal(err)
	}
	var ids []string
	rs, err := db.QueryContext(ctx, fmt.Sprintf(`SELECT "id"::text FROM %s WHERE "dead_lettered_at" IS NOT NULL ORDER BY "sequence" LIMIT 3`, q))
	if err != nil {
		t.Fatal(err)
	}
	for rs.Next() {
		var id string
		rs.Scan(&id)
		ids = append(ids, id)
	}
	rs.Close()
	exact := dialect.Topic{Value: "orders.paid"}
	prefix := dialect.Topic{Prefix: true, Value: "orders."}
	all := dialect.Topic{All: true}
	const live = 10000 + 100
	ops := []struct {
		name    string
		run     func(ex dialect.Executor) error
		changed int // rows the operation deletes
	}{
		{"list dead by topic", func(ex dialect.Executor) error {
			_, err := d.ListDead(ctx, ex, tbl, dialect.DeadFilter{Topics: []dialect.Topic{exact}}, 100)
			return err
		}, 0},
		{"list dead by prefix", func(ex dialect.Executor) error {
			_, err := d.ListDead(ctx, ex, tbl, dialect.DeadFilter{Topics: []dialect.Topic{prefix}}, 100)
			return err
		}, 0},
		{"list dead by id", func(ex dialect.Executor) error {
			_, err := d.ListDead(ctx, ex, tbl, dialect.DeadFilter{IDs: ids}, 100)
			return err
		}, 0},
		{"retry dead by topic", func(ex dialect.Executor) error {
			_, err := d.RetryDead(ctx, ex, tbl, dialect.DeadFilter{Topics: []dialect.Topic{exact}})
			return err
		}, 0},
		{"retry dead by id", func(ex dialect.Executor) error {
			_, err := d.RetryDead(ctx, ex, tbl, dialect.DeadFilter{IDs: ids})
			return err
		}, 0},
		{"purge dead, all older than 30 min", func(ex dialect.Executor) error {
			_, err := d.PurgeDead(ctx, ex, tbl, dialect.DeadFilter{Topics: []dialect.Topic{all}, OlderThan: 30 * time.Minute})
			return err
		}, 0},
		{"cleanup published, none old enough", func(ex dialect.Executor) error {
			_, err := d.Cleanup(ctx, ex, tbl, "published_at", 30*24*time.Hour, 1000)
			return err
		}, 0},
		{"cleanup published, 1000 of many", func(ex dialect.Executor) error {
			_, err := d.Cleanup(ctx, ex, tbl, "published_at", time.Hour, 1000)
			return err
		}, 1000},
		{"cleanup dead", func(ex dialect.Executor) error {
			_, err := d.Cleanup(ctx, ex, tbl, "dead_lettered_at", 30*time.Minute, 1000)
			return err
		}, 0},
		{"backlog", func(ex dialect.Executor) error {
			_, err := d.Backlog(ctx, ex, tbl)
			return err
		}, 0},
		{"backlog by topic", func(ex dialect.Executor) error {
			_, err := d.BacklogByTopic(ctx, ex, tbl)
			return err
		}, 0},
		{"backlog overview, capped at 1,000 of each kind", func(ex dialect.Executor) error {
			_, err := d.BacklogOverview(ctx, ex, tbl, 1000)
			return err
		}, 0},
		{"blocked keys", func(ex dialect.Executor) error {
			_, err := d.BlockedKeys(ctx, ex, tbl, 100)
			return err
		}, 0},
		{"delivery stats of the last hour", func(ex dialect.Executor) error {
			_, err := d.DeliveryStats(ctx, ex, tbl, time.Hour, 50000)
			return err
		}, 0},
		{"leases", func(ex dialect.Executor) error {
			_, err := d.Leases(ctx, ex, tbl, 2000)
			return err
		}, 0},
		{"count dead by key, error text and time", func(ex dialect.Executor) error {
			_, err := d.CountDead(ctx, ex, tbl, dialect.DeadFilter{Topics: []dialect.Topic{all}, Key: "k2", ErrorContains: "BOOM",
				After: time.Now().Add(-2 * time.Hour), Before: time.Now()})
			return err
		}, 0},
		{"retry dead by error text", func(ex dialect.Executor) error {
			_, err := d.RetryDead(ctx, ex, tbl, dialect.DeadFilter{Topics: []dialect.Topic{prefix}, ErrorContains: "boom"})
			return err
		}, 0},
		{"retry, skip and purge a head", func(ex dialect.Executor) error {
			for _, a := range []dialect.HeadAction{dialect.HeadRetry, dialect.HeadSkip, dialect.HeadPurge} {
				if _, err := d.ActOnHead(ctx, ex, tbl, "k2", 1, a); err != nil {
					return err
				}
			}
			return nil
		}, 0},
		{"take back", func(ex dialect.Executor) error {
			_, err := d.TakeBack(ctx, ex, tbl, "r1", "r1abcdef012345")
			return err
		}, 0},
		{"read stored by idempotency key", func(ex dialect.Executor) error {
			_, err := d.ReadStored(ctx, ex, tbl, []string{"idem10", "idem20"})
			return err
		}, 0},
		{"resolve scoped", func(ex dialect.Executor) error {
			_, err := d.ResolveScoped(ctx, ex, tbl, []dialect.Probe{{Index: 0, Key: "idem10"}})
			return err
		}, 0},
	}
	for _, op := range ops {
		t.Run(op.name, func(t *testing.T) {
			e := &explainer{db: db}
			if err := op.run(e); err != nil {
				t.Fatal(err)
			}
			for _, p := range e.plans {
				t.Logf("%d buffers (heap %d pages), %.1f ms, indexes %v", p.buffers, heap, p.ms, p.indexes)
				if os.Getenv("OUTBOX_PLAN_LOG") != "" {
					t.Log(p.text)
				}
				if slices.Contains(p.seq, name) {
					t.Errorf("sequential scan of the outbox table")
				}
				if strings.HasPrefix(op.name, "backlog overview") && p.buffers > 1000 {
					t.Errorf("%d buffers read, more than the limit of 1,000 events of each kind: not bounded by the limit", p.buffers)
				}
				if p.buffers > live+5*op.changed {
					t.Errorf("%d buffers read, more than %d live events + 5 per deleted row", p.buffers, live)
				}
			}
			if len(e.plans) == 0 {
				t.Fatal("no statement ran")
			}
			if t.Failed() {
				t.Log(e.plans[0].text)
			}
		})
	}
}
