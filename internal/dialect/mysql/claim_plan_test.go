package mysql

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/watermill-outbox/outbox/internal/dialect"
	"github.com/watermill-outbox/outbox/internal/mariadbtest"
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

// TestClaimPlans: every statement of every claim variant reads the table through an index (the
// pending index for the walks, the key index for heads, the skip scan and runs, the primary
// key for the locks and the lease), never by a full scan. OUTBOX_PLAN_DUMP=file writes the
// plans of every variant there.
func TestClaimPlans(t *testing.T) {
	plans := claimPlans(t)
	for _, v := range claimVariants {
		reads := 0
		for _, line := range strings.Split(plans[v.name], "\n") {
			f := strings.Fields(line)
			if len(f) < 5 || (f[2] != "o" && f[2] != "h") {
				continue
			}
			reads++
			if f[3] == "ALL" || f[3] == "index" || strings.HasPrefix(f[4], "key=()") {
				t.Errorf("%s: a statement reads the table without an index range: %q\n%s", v.name, line, plans[v.name])
			}
		}
		if reads < 4 {
			t.Errorf("%s: %d reads of the table in the claim's plans; want the window, its heads, the lock and the lease at least:\n%s", v.name, reads, plans[v.name])
		}
	}
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

// rewritten returns the window statement of p's claim as MariaDB rewrote it for execution
// (EXPLAIN EXTENDED's note 1003), on db.
func rewritten(t *testing.T, db *sql.DB, r *relay, p *dialect.ClaimParams) string {
	t.Helper()
	ctx := context.Background()
	named := r.claimArgs(p)
	named["floor_keyed"], named["window"] = int64(0), 200
	q, args := r.st["window"].Expand(named)
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rs, err := conn.QueryContext(ctx, "EXPLAIN EXTENDED "+q, args...)
	if err != nil {
		t.Fatal(err)
	}
	rs.Close()
	rs, err = conn.QueryContext(ctx, "SHOW WARNINGS")
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	for rs.Next() {
		var (
			level, msg string
			code       int
		)
		if err := rs.Scan(&level, &code, &msg); err != nil {
			t.Fatal(err)
		}
		if code == 1003 {
			return strings.ReplaceAll(msg, r.n.name, "T")
		}
	}
	t.Fatalf("no note 1003 after EXPLAIN EXTENDED %s", q)
	return ""
}

// TestClaimParametersFold: the server folds the claim's parameters into the conditions they
// stand for, as if the statement were written for the selection: every topic leaves no topic
// condition, one topic an equality, paused and probed topics a comparison, and the JSON
// table of excluded topics is there only when topics are excluded. Through the driver's
// interpolateParams (values sent as literals) and through server-side prepared statements.
func TestClaimParametersFold(t *testing.T) {
	tb := newTable(t)
	for _, h := range []struct {
		name string
		db   *sql.DB
	}{{"prepared", needDB(t)}, {"interpolated", mariadbtest.Require(t)}} {
		for _, c := range []struct {
			variant   string
			has, hasn []string
		}{
			{"all", nil, []string{"`topic`", "json_table"}},
			{"exact", []string{"`o`.`topic` = 't1'"}, []string{"left(", "json_table"}},
			{"prefix", []string{"left(`o`.`topic`"}, []string{"`o`.`topic` =", "json_table"}},
			{"excludes", []string{"json_table"}, []string{"left(`o`.`topic`", "`o`.`topic` ="}},
			{"paused", []string{"`o`.`topic` <> 't0'"}, []string{"json_table", "left("}},
			{"probe", []string{"`o`.`topic` = 't0'"}, []string{"json_table", "left("}},
		} {
			i := slices.IndexFunc(claimVariants, func(v claimVariant) bool { return v.name == c.variant })
			v := claimVariants[i]
			r := New().NewRelay(tb, dialect.RelayConfig{BatchSize: 100, MaxRunPerKey: 10, KeyScan: 100, LeaseDuration: time.Minute}, v.sel).(*relay)
			got := rewritten(t, h.db, r, &v.p)
			where := got[strings.Index(got, " from "):]
			where = strings.ToLower(strings.ReplaceAll(where, "`test`.", ""))
			for _, s := range c.has {
				if !strings.Contains(where, s) {
					t.Errorf("%s, %s: the rewritten window lacks %q:\n%s", h.name, c.variant, s, where)
				}
			}
			for _, s := range c.hasn {
				if strings.Contains(where, s) {
					t.Errorf("%s, %s: the rewritten window holds %q:\n%s", h.name, c.variant, s, where)
				}
			}
		}
	}
}
