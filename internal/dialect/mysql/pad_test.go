package mysql

import (
	"context"
	"fmt"
	"testing"

	"github.com/watermill-outbox/outbox/internal/dialect"
)

// TestTrailingSpaceIdempotencyKeys: idempotency keys "k" and "k " are two keys (the tables'
// collation is NO PAD; with utf8mb4_bin, PAD SPACE, the second event was taken for the first
// one's duplicate and lost).
func TestTrailingSpaceIdempotencyKeys(t *testing.T) {
	tb := newTable(t)
	a := mustInsert(t, tb, ev("t", `1`, "", "k"))
	b := mustInsert(t, tb, ev("t", `2`, "", "k "))
	n := queryInt64s(t, "SELECT COUNT(*) FROM "+namesOf(tb).table)
	if n[0] != 2 || b[0].Duplicate || a[0].Sequence == b[0].Sequence {
		t.Fatalf("rows stored %d, second Duplicate=%v (key %q): event with idempotency key \"k \" lost", n[0], b[0].Duplicate, *b[0].IdempotencyKey)
	}
}

// TestTrailingSpaceOrderingKeys: ordering keys "k " and "k" are two keys: one claim leases both
// heads, each once.
func TestTrailingSpaceOrderingKeys(t *testing.T) {
	tb := newTable(t)
	mustInsert(t, tb, ev("t", `1`, "k ", ""))
	mustInsert(t, tb, ev("t", `2`, "k", ""))
	cfg := relayConfig(10, 5)
	r := New().NewRelay(tb, cfg, all)
	res, err := r.Claim(context.Background(), sqlEx(needDB(t)), &dialect.ClaimParams{Token: "relay#000000000000#1", Limit: 10, Oldest: 10})
	if err != nil {
		t.Fatal(err)
	}
	seqs := seqsOf(res.Events)
	var keys []string
	for _, e := range res.Events {
		keys = append(keys, *e.OrderingKey)
	}
	if fmt.Sprint(seqs) != "[1 2]" || fmt.Sprintf("%q", keys) != `["k " "k"]` {
		t.Fatalf("claimed %v keys %q, want [1 2] keys [\"k \" \"k\"]", seqs, keys)
	}
	for _, e := range res.Events {
		if e.Rank != 1 {
			t.Fatalf("event %d ranked %d, want 1 (each its key's head)", e.Sequence, e.Rank)
		}
	}
}
