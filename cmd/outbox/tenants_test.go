package main

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/watermill-outbox/outbox/internal/pgtest"
)

// TestRelayTables: `relay --table` with a list holding a pattern relays every matching outbox
// table and the literal one with one relay, each key in order; a pattern that matches no
// outbox table is refused at start, naming the pattern.
func TestRelayTables(t *testing.T) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			db, literal := b.fresh(t)
			var tenants []string
			pattern := "tenant_*"
			if b.name == "postgres" {
				pool := pgtest.Require(t)
				prefix := fmt.Sprintf("rt_%d_%s", os.Getpid(), randomHex(4))
				for _, s := range []string{"a", "b", "c"} {
					schema := prefix + "_" + s
					if _, err := pool.Exec(context.Background(), "CREATE SCHEMA "+schema); err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE") })
					tenants = append(tenants, schema+".watermill_outbox")
				}
				pattern = prefix + "_*.watermill_outbox"
			} else if b.name == "mariadb" {
				// Tables of a shared database: names of this run only, dropped at the end.
				prefix := fmt.Sprintf("rt_%d_%s", os.Getpid(), randomHex(4))
				for _, s := range []string{"a", "b", "c"} {
					tenants = append(tenants, prefix+"_"+s)
				}
				t.Cleanup(func() { dropMariaDBTables(t, tenants...) })
				pattern = prefix + "_*"
			} else {
				tenants = []string{"tenant_a", "tenant_b", "tenant_c"}
			}
			var all []string
			for i, tb := range append(slices.Clone(tenants), literal) {
				mustRun(t, nil, "migrate", "--db", db, "--table", tb)
				var evs []testEvent
				for n := range 12 {
					evs = append(evs, testEvent{topic: "orders.created", key: fmt.Sprintf("t%d-k%d", i, n%3), n: n})
				}
				all = append(all, b.publish(t, db, tb, evs)...)
			}
			rcv := newReceiver(t, 200)
			p := start(t, []string{"OUTBOX_SECRET=" + rcv.secret}, "relay", "--db", db, "--table", pattern+","+literal,
				"--to", rcv.URL+"/hook", "--allow-prefix", "127.0.0.0/8", "--poll-interval", "50ms")
			p.runUntil(t, "every table delivered", func() bool {
				for _, tb := range append(slices.Clone(tenants), literal) {
					if status(t, db, tb).Pending != 0 {
						return false
					}
				}
				return true
			})
			if got := rcv.received(); !slices.Equal(sorted(got), sorted(all)) {
				t.Fatalf("received %d ids, want the %d events of the four tables", len(got), len(all))
			}
			rcv.mu.Lock()
			for k, ns := range rcv.order {
				if !slices.IsSorted(ns) || len(ns) != 4 {
					t.Errorf("key %s arrived as %v, want 4 in order", k, ns)
				}
			}
			rcv.mu.Unlock()
			logged := p.errb.String()
			for _, tb := range append(slices.Clone(tenants), literal) {
				if !strings.Contains(logged, "outbox relay serving several tables") || !strings.Contains(logged, tb) {
					t.Errorf("relay log does not list table %s: %s", tb, logged)
				}
			}
			r := cli(t, nil, "relay", "--db", db, "--table", "nomatch_*,"+literal, "--to", rcv.URL+"/hook", "--allow-prefix", "127.0.0.0/8")
			wantFailure(t, r, 1, `--table pattern "nomatch_*" matches no outbox table`)
		})
	}
}
