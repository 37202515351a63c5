package mysql

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/watermill-outbox/outbox/internal/dialect"
)

// planEx is an Executor inside one transaction that records the EXPLAIN of every statement it
// runs, before running it, with the table's name written T.
type planEx struct {
	dialect.Executor
	table string
	plans []string
}

func (e *planEx) explain(ctx context.Context, q string, args []any) error {
	rs, err := e.Executor.Query(ctx, "EXPLAIN "+q, args...)
	if err != nil {
		return fmt.Errorf("EXPLAIN %s: %w", q, err)
	}
	defer rs.Close()
	var b strings.Builder
	for rs.Next() {
		var id, selType, table, typ, possible, key, keyLen, ref, rows, extra sql.NullString
		if err := rs.Scan(&id, &selType, &table, &typ, &possible, &key, &keyLen, &ref, &rows, &extra); err != nil {
			return err
		}
		fmt.Fprintf(&b, "%s %s %s %s key=%s(%s) ref=%s %s\n", id.String, selType.String, table.String, typ.String, key.String, keyLen.String, ref.String, extra.String)
	}
	if err := rs.Err(); err != nil {
		return err
	}
	e.plans = append(e.plans, strings.ReplaceAll(b.String(), e.table, "T"))
	return nil
}

func (e *planEx) Query(ctx context.Context, q string, args ...any) (dialect.Rows, error) {
	if err := e.explain(ctx, q, args); err != nil {
		return nil, err
	}
	return e.Executor.Query(ctx, q, args...)
}

func (e *planEx) Exec(ctx context.Context, q string, args ...any) (int64, error) {
	if err := e.explain(ctx, q, args); err != nil {
		return 0, err
	}
	return e.Executor.Exec(ctx, q, args...)
}

func (e *planEx) InTx() bool { return true }

// claimVariant is one shape of the claim: a topic selection and the claim's parameters.
type claimVariant struct {
	name string
	sel  dialect.TopicSelection
	p    dialect.ClaimParams
}

var claimVariants = []claimVariant{
	{"all", dialect.TopicSelection{Include: dialect.Topic{All: true}}, dialect.ClaimParams{}},
	{"exact", dialect.TopicSelection{Include: dialect.Topic{Value: "t1"}}, dialect.ClaimParams{}},
	{"prefix", dialect.TopicSelection{Include: dialect.Topic{Value: "t", Prefix: true}}, dialect.ClaimParams{}},
	{"excludes", dialect.TopicSelection{Include: dialect.Topic{All: true}, Excludes: []dialect.Topic{{Value: "u"}, {Value: "x.", Prefix: true}}}, dialect.ClaimParams{}},
	{"paused", dialect.TopicSelection{Include: dialect.Topic{All: true}}, dialect.ClaimParams{Paused: []string{"t0"}}},
	{"probe", dialect.TopicSelection{Include: dialect.Topic{All: true}}, dialect.ClaimParams{Probe: []string{"t0"}}},
	{"floors", dialect.TopicSelection{Include: dialect.Topic{All: true}}, dialect.ClaimParams{LowKeyed: 2000, LowUnordered: 2000, Cursor: "k5"}},
	{"cont", dialect.TopicSelection{Include: dialect.Topic{All: true}}, dialect.ClaimParams{ContToken: "c",
		Cont: []dialect.Continuation{{Key: "k1", After: 101, From: 1}, {Key: "k2", After: 102, From: 2}}}},
}

// claimPlans returns, for each claim variant, the EXPLAIN of each statement the claim runs, on
// a table of 5,000 keyed and unordered events in two topics.
func claimPlans(t *testing.T) map[string]string {
	t.Helper()
	ctx := context.Background()
	db := needDB(t)
	tb := newTable(t)
	n := namesOf(tb)
	if _, err := db.Exec("INSERT INTO " + n.table + " (`id`, `topic`, `payload`, `ordering_key`) SELECT UUID(), CONCAT('t', seq % 2), '{}', IF(seq % 5 = 0, NULL, CONCAT('k', seq % 100)) FROM seq_1_to_5000"); err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, v := range claimVariants {
		tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
		if err != nil {
			t.Fatal(err)
		}
		ex := &planEx{Executor: sqlEx(tx), table: n.name}
		r := New().NewRelay(tb, dialect.RelayConfig{BatchSize: 100, MaxRunPerKey: 10, KeyScan: 100, LeaseDuration: time.Minute}, v.sel)
		p := v.p
		p.Token, p.Limit, p.Oldest = "p", 100, 100
		if _, err := r.Claim(ctx, ex, &p); err != nil {
			t.Fatalf("%s: %v", v.name, err)
		}
		_ = tx.Rollback()
		out[v.name] = strings.Join(ex.plans, "-- then\n")
	}
	return out
}

// TestClaimPlans: OUTBOX_PLAN_DUMP=file writes the plans of every claim variant there.
func TestClaimPlans(t *testing.T) {
	plans := claimPlans(t)
	if f := os.Getenv("OUTBOX_PLAN_DUMP"); f != "" {
		var b strings.Builder
		for _, v := range claimVariants {
			fmt.Fprintf(&b, "== %s\n%s", v.name, plans[v.name])
		}
		if err := os.WriteFile(f, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
