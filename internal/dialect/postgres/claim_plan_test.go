package postgres

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/watermill-outbox/outbox/internal/dialect"
	"github.com/watermill-outbox/outbox/internal/pgtest"
)

// TestClaimPlanShape checks the composed claim's plan on a table with 100k pending events
// (half keyed over 1,000 keys, half unordered) and 20k published ones: every scan of the table
// goes through an index — the pending partial indexes for the walk and the unordered scan, the
// key index for heads and runs, the blocking index for the floors' candidates, and (with floors
// above 0) the retry index for the retry scans below them — and none is a sequential scan. EXPLAIN without ANALYZE: the
// claim is not run, so nothing is leased.
func TestClaimPlanShape(t *testing.T) {
	ctx := context.Background()
	db := pgtest.StdDB(t)
	name, tbl := migratedTable(t, db)
	ex := dialect.StdSQL{D: db, Pgx: true}
	d := Dialect{}
	q := dialect.DoubleQuote(name)
	for _, st := range []string{
		fmt.Sprintf(`INSERT INTO %s ("id", "topic", "payload", "ordering_key") SELECT gen_random_uuid(), 't', '{}', CASE WHEN i %% 2 = 0 THEN 'k' || (i %% 1000) END FROM generate_series(1, 100000) i`, q),
		fmt.Sprintf(`INSERT INTO %s ("id", "topic", "payload", "ordering_key", "published_at") SELECT gen_random_uuid(), 't', '{}', 'k' || (i %% 1000), now() FROM generate_series(1, 20000) i`, q),
	} {
		if _, err := db.ExecContext(ctx, st); err != nil {
			t.Fatal(err)
		}
	}
	cfg := dialect.RelayConfig{BatchSize: 1000, MaxRunPerKey: 100, KeyScan: 1000, LeaseDuration: 30 * time.Second, MaxAttempts: 10, RetryBase: time.Second, RetryMax: time.Minute}
	r := d.NewRelay(tbl, cfg, dialect.TopicSelection{Include: dialect.Topic{All: true}}).(*relay)
	cases := []struct {
		name string
		st   *dialect.Stmt
		p    params
	}{
		{"claim", r.claim, params{"oldest": 1000, "floor_keyed": int64(0)}},
		{"claim above floors", r.claim, params{"oldest": 1000, "floor_keyed": int64(50000), "floor_unordered": int64(50001),
			"low_keys": []string{"k2", "k4"}, "low_seqs": []int64{2, 4}}},
		{"claim with continuations", r.claim, params{"oldest": 32, "floor_keyed": int64(0), "cont_keys": []string{"k2", "k4"}, "cont_after": []int64{10, 12}, "cont_from": []int64{2, 4}}},
		{"claim with taken-back keys", r.claim, params{"oldest": 1000, "floor_keyed": int64(0), "first_keys": []string{"k2", "k4"}, "first_last": []int64{90000, 90000},
			"low_keys": []string{"k2"}, "low_seqs": []int64{2}}},
		{"paused", r.claim, params{"oldest": 1000, "floor_keyed": int64(0), "paused": []string{"u"}}},
		{"probe", r.claim, params{"oldest": 1000, "floor_keyed": int64(0), "paused": []string{"t"}, "probe": true, "batch": 1, "run": 1}},
	}
	for _, analyzed := range []bool{false, true} {
		if analyzed {
			if _, err := db.ExecContext(ctx, `ANALYZE `+q); err != nil {
				t.Fatal(err)
			}
		}
		for _, c := range cases {
			t.Run(fmt.Sprintf("%s/analyzed=%v", c.name, analyzed), func(t *testing.T) {
				named := params{"cursor": "", "lease_us": int64(30e6), "token": "x", "run_limit": 1000, "floor_unordered": int64(0),
					"cont_token": "", "cont_margin_us": int64(10e6), "cont_keys": []string(nil), "cont_after": []int64(nil), "cont_from": []int64(nil),
					"low_keys": []string{}, "low_seqs": []int64{}, "first_keys": []string{}, "first_last": []int64{}, "no_key_scan": false,
					"batch": 1000, "run": 100, "key_scan": 1000, "paused": []string{}, "probe": false}
				for k, v := range r.topics {
					named[k] = v
				}
				for k, v := range c.p {
					named[k] = v
				}
				plan, nodes, cteIndexes := explainClaim(t, db, c.st.SQL, ex.OneShot(c.st.Args(named)), name)
				var indexes []string
				for _, n := range nodes {
					if n["Node Type"] == "Seq Scan" {
						t.Errorf("sequential scan of %v in the claim's plan", n["Relation Name"])
					}
					if ix, ok := n["Index Name"].(string); ok && !slices.Contains(indexes, strings.TrimPrefix(ix, name+"_")) {
						indexes = append(indexes, strings.TrimPrefix(ix, name+"_"))
					}
				}
				wants := []string{"keyed_idx", "unordered_idx", "key_idx", "blocking_idx"}
				if c.p["floor_keyed"] != int64(0) {
					wants = append(wants, "retry_idx") // the retry scans below the floors
					// Below the floors every other index holds the history since the oldest
					// snapshot: on a table without statistics the planner served walked_retry
					// from keyed_idx ("sequence" < floor), 495k buffers per claim under a
					// snapshot held for 10 minutes.
					for _, cte := range []string{"walked_retry", "unordered_retry"} {
						if got := cteIndexes[cte]; !slices.Equal(got, []string{"retry_idx"}) {
							t.Errorf("%s reads indexes %v, want only retry_idx", cte, got)
						}
					}
				}
				for _, want := range wants {
					if !slices.Contains(indexes, want) {
						t.Errorf("index %s not used; the plan uses %v", want, indexes)
					}
				}
				if t.Failed() {
					t.Log(plan)
				}
			})
		}
	}
}

// explainClaim returns the plan of EXPLAIN (FORMAT JSON) sql, its nodes, and the indexes read
// inside each CTE's plan (by CTE name, index names without the table's prefix).
func explainClaim(t *testing.T, q interface {
	QueryRowContext(context.Context, string, ...any) *sql.Row
}, sql string, args []any, table string) (plan string, nodes []map[string]any, cteIndexes map[string][]string) {
	t.Helper()
	if err := q.QueryRowContext(context.Background(), `EXPLAIN (FORMAT JSON) `+sql, args...).Scan(&plan); err != nil {
		t.Fatal(err)
	}
	cteIndexes = map[string][]string{}
	var walk func(v any, cte string)
	walk = func(v any, cte string) {
		switch n := v.(type) {
		case map[string]any:
			if sub, ok := n["Subplan Name"].(string); ok && strings.HasPrefix(sub, "CTE ") {
				cte = strings.TrimPrefix(sub, "CTE ")
			}
			if _, ok := n["Node Type"]; ok {
				nodes = append(nodes, n)
				if ix, ok := n["Index Name"].(string); ok {
					cteIndexes[cte] = append(cteIndexes[cte], strings.TrimPrefix(ix, table+"_"))
				}
			}
			for _, c := range n {
				walk(c, cte)
			}
		case []any:
			for _, c := range n {
				walk(c, cte)
			}
		}
	}
	var doc any
	if err := json.Unmarshal([]byte(plan), &doc); err != nil {
		t.Fatal(err)
	}
	walk(doc, "")
	return plan, nodes, cteIndexes
}

// TestClaimRetryScansNeedRetryIndex checks that nothing but the retry index can serve the
// claim's retry scans below the floors: with it dropped (inside a transaction that is rolled
// back), EXPLAIN shows them reading no index at all. Every other index that could serve a
// "sequence" < floor or topic condition (keyed_idx, unordered_idx, the primary key, the
// (topic, sequence) index) holds every event written since the oldest snapshot; on a table
// without statistics the planner chose keyed_idx for walked_retry once the table passed about
// 500k rows, and under a snapshot held for 10 minutes each claim read 495k buffers (1-3.6 s).
func TestClaimRetryScansNeedRetryIndex(t *testing.T) {
	ctx := context.Background()
	db := pgtest.StdDB(t)
	name, tbl := migratedTable(t, db)
	ex := dialect.StdSQL{D: db, Pgx: true}
	d := Dialect{}
	cfg := dialect.RelayConfig{BatchSize: 1000, MaxRunPerKey: 100, KeyScan: 1000, LeaseDuration: 30 * time.Second, MaxAttempts: 10, RetryBase: time.Second, RetryMax: time.Minute}
	r := d.NewRelay(tbl, cfg, dialect.TopicSelection{Include: dialect.Topic{Value: "t"}}).(*relay)
	named := params{"cursor": "", "lease_us": int64(30e6), "token": "x", "run_limit": 1000, "oldest": 1000,
		"floor_keyed": int64(50000), "floor_unordered": int64(50001), "cont_token": "", "cont_margin_us": int64(10e6),
		"cont_keys": []string(nil), "cont_after": []int64(nil), "cont_from": []int64(nil),
		"low_keys": []string{"k2"}, "low_seqs": []int64{2}, "first_keys": []string{}, "first_last": []int64{}, "no_key_scan": false,
		"batch": 1000, "run": 100, "key_scan": 1000, "paused": []string{}, "probe": false}
	for k, v := range r.topics {
		named[k] = v
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `DROP INDEX `+dialect.DoubleQuote(name+"_retry_idx")); err != nil {
		t.Fatal(err)
	}
	plan, _, cteIndexes := explainClaim(t, tx, r.claim.SQL, ex.OneShot(r.claim.Args(named)), name)
	for _, cte := range []string{"walked_retry", "unordered_retry"} {
		if got := cteIndexes[cte]; len(got) > 0 {
			t.Errorf("without the retry index, %s reads %v, an index of the history since the oldest snapshot", cte, got)
		}
	}
	if t.Failed() {
		t.Log(plan)
	}
}

// TestClaimParametersFold checks that the claim's and the sweep's parameters for the topic
// selection, the pauses and the probe are folded to constants in their plans (the claim runs as
// a custom plan), so that each variant is planned as if its condition were written out: no
// cardinality, CASE or boolean parameter is left in any plan's filters, a subscription of every topic with
// nothing paused tests no topic at all, and each other variant tests exactly its own condition.
func TestClaimParametersFold(t *testing.T) {
	ctx := context.Background()
	db := pgtest.StdDB(t)
	name, tbl := migratedTable(t, db)
	if _, err := db.ExecContext(ctx, fmt.Sprintf(`INSERT INTO %s ("id", "topic", "payload", "ordering_key") SELECT gen_random_uuid(), 't', '{}', CASE WHEN i %% 2 = 0 THEN 'k' || (i %% 10) END FROM generate_series(1, 1000) i`,
		dialect.DoubleQuote(name))); err != nil {
		t.Fatal(err)
	}
	ex := dialect.StdSQL{D: db, Pgx: true}
	cfg := dialect.RelayConfig{BatchSize: 100, MaxRunPerKey: 10, KeyScan: 100, LeaseDuration: 30 * time.Second, MaxAttempts: 10, RetryBase: time.Second, RetryMax: time.Minute}
	sels := []struct {
		name string
		sel  dialect.TopicSelection
		want []string // the selection's tests in the plan's filters
	}{
		{"all", dialect.TopicSelection{Include: dialect.Topic{All: true}}, nil},
		{"exact", dialect.TopicSelection{Include: dialect.Topic{Value: "t"}}, []string{`= 't'::text`}},
		{"prefix", dialect.TopicSelection{Include: dialect.Topic{Prefix: true, Value: "t."}}, []string{`starts_with(`}},
		{"excludes", dialect.TopicSelection{Include: dialect.Topic{All: true}, Excludes: []dialect.Topic{{Value: "a_b"}, {Prefix: true, Value: "x."}}},
			[]string{`!~~ ALL ('{"a\\_b",x.%}'::text[])`}},
	}
	pauses := []struct {
		name string
		p    dialect.ClaimParams
		want []string
	}{
		{"running", dialect.ClaimParams{}, nil},
		{"paused", dialect.ClaimParams{Paused: []string{"u"}}, []string{`<> ALL ('{u}'::text[])`}},
		{"probe", dialect.ClaimParams{Probe: []string{"u"}}, []string{`= ANY ('{u}'::text[])`}},
	}
	leftover := regexp.MustCompile(`cardinality|CASE|= (true|false)|OR true|AND false`)
	for _, s := range sels {
		r := Dialect{}.NewRelay(tbl, cfg, s.sel).(*relay)
		for _, pa := range pauses {
			t.Run(s.name+"/"+pa.name, func(t *testing.T) {
				p := pa.p
				p.Token, p.Limit, p.Oldest, p.LowKeyed, p.LowUnordered = "x", 100, 100, 1, 1
				plan := explainText(t, db, r.claim.SQL, ex.OneShot(r.claim.Args(r.claimArgs(&p))))
				filters := planFilters(plan)
				if leftover.MatchString(filters) {
					t.Errorf("parameter machinery left in the claim's filters:\n%s", filters)
				}
				want := append(slices.Clone(s.want), pa.want...)
				if len(want) == 0 && strings.Contains(filters, "topic") {
					t.Errorf("a claim of every topic with nothing paused tests the topic:\n%s", filters)
				}
				for _, w := range want {
					if !strings.Contains(filters, w) {
						t.Errorf("no %q in the claim's filters:\n%s", w, filters)
					}
				}
				if t.Failed() {
					t.Log(plan)
				}
			})
		}
		t.Run(s.name+"/sweep", func(t *testing.T) {
			named := params{"floor_keyed": int64(500), "floor_unordered": int64(500)}
			for k, v := range r.topics {
				named[k] = v
			}
			filters := planFilters(explainText(t, db, r.sweep.SQL, ex.OneShot(r.sweep.Args(named))))
			if leftover.MatchString(filters) {
				t.Errorf("parameter machinery left in the sweep's filters:\n%s", filters)
			}
			for _, w := range s.want {
				if !strings.Contains(filters, w) {
					t.Errorf("no %q in the sweep's filters:\n%s", w, filters)
				}
			}
		})
	}
}

// explainText returns EXPLAIN's text of sql.
func explainText(t *testing.T, db *sql.DB, sql string, args []any) string {
	t.Helper()
	rs, err := db.QueryContext(context.Background(), `EXPLAIN `+sql, args...)
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	var b strings.Builder
	for rs.Next() {
		var line string
		if err := rs.Scan(&line); err != nil {
			t.Fatal(err)
		}
		b.WriteString(line + "\n")
	}
	if err := rs.Err(); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// planFilters returns the filter and condition lines of an EXPLAIN text.
func planFilters(plan string) string {
	var b strings.Builder
	for _, line := range strings.Split(plan, "\n") {
		if l := strings.TrimSpace(line); strings.HasPrefix(l, "Filter:") || strings.HasPrefix(l, "One-Time Filter:") || strings.HasPrefix(l, "Index Cond:") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}
