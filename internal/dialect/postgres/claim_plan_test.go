package postgres

import (
	"context"
	"encoding/json"
	"fmt"
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
	name := pgtest.Table(t)
	tbl := &dialect.Table{Parts: []string{name}, IndexBase: name, FillFactor: 50, FillDefault: true, LockSeed: 1}
	ex := dialect.StdSQL{D: db, Pgx: true}
	d := Dialect{}
	if err := d.Migrate(ctx, ex, tbl); err != nil {
		t.Fatal(err)
	}
	q := dialect.DoubleQuote(name)
	for _, st := range []string{
		fmt.Sprintf(`INSERT INTO %s ("id", "topic", "payload", "ordering_key") SELECT gen_random_uuid(), 't', '{}', CASE WHEN i %% 2 = 0 THEN 'k' || (i %% 1000) END FROM generate_series(1, 100000) i`, q),
		fmt.Sprintf(`INSERT INTO %s ("id", "topic", "payload", "ordering_key", "published_at") SELECT gen_random_uuid(), 't', '{}', 'k' || (i %% 1000), now() FROM generate_series(1, 20000) i`, q),
		`ANALYZE ` + q,
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
		{"paused", r.paused, params{"oldest": 1000, "floor_keyed": int64(0), "paused": []string{"u"}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			named := params{"cursor": "", "lease_us": int64(30e6), "token": "x", "run_limit": 1000, "floor_unordered": int64(0),
				"cont_token": "", "cont_margin_us": int64(10e6), "cont_keys": []string(nil), "cont_after": []int64(nil), "cont_from": []int64(nil),
				"low_keys": []string{}, "low_seqs": []int64{}}
			for k, v := range c.p {
				named[k] = v
			}
			var plan string
			if err := db.QueryRowContext(ctx, `EXPLAIN (FORMAT JSON) `+c.st.SQL, ex.OneShot(c.st.Args(named))...).Scan(&plan); err != nil {
				t.Fatal(err)
			}
			var nodes []map[string]any
			var walk func(v any)
			walk = func(v any) {
				switch n := v.(type) {
				case map[string]any:
					if _, ok := n["Node Type"]; ok {
						nodes = append(nodes, n)
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
			var doc any
			if err := json.Unmarshal([]byte(plan), &doc); err != nil {
				t.Fatal(err)
			}
			walk(doc)
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
