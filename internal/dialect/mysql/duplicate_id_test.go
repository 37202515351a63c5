package mysql

import (
	"context"
	"errors"
	"testing"

	"github.com/watermill-outbox/outbox/internal/dialect"
)

// A keyless row whose id is already stored must fail with ErrDuplicateEventID, also when another
// row of the same call has an idempotency key.
func TestKeylessDuplicateIDInMixedBatch(t *testing.T) {
	tb := newTable(t)
	old := mustInsert(t, tb, ev("old", `1`, "", ""))
	// Alone: refused.
	alone := ev("new", `2`, "", "")
	alone.ID = old[0].ID
	_, err := New().Insert(context.Background(), sqlEx(needDB(t)), &dialect.InsertParams{Table: tb, Rows: []dialect.InsertRow{alone}})
	if !errors.Is(err, ErrDuplicateEventID) {
		t.Fatalf("alone: %v, want ErrDuplicateEventID", err)
	}
	// Beside a row with an idempotency key.
	withKey := ev("new", `3`, "", "ka")
	out, err := New().Insert(context.Background(), sqlEx(needDB(t)), &dialect.InsertParams{Table: tb, Rows: []dialect.InsertRow{withKey, alone}})
	t.Logf("mixed: err=%v", err)
	for i, s := range out {
		t.Logf("  row %d -> seq %d topic %q duplicate %v", i, s.Sequence, s.Topic, s.Duplicate)
	}
	n := queryInt64s(t, "SELECT COUNT(*) FROM "+namesOf(tb).table+" WHERE topic = 'new'")
	if !errors.Is(err, ErrDuplicateEventID) || n[0] != 0 {
		t.Fatalf("mixed batch: err %v, want ErrDuplicateEventID; rows of topic new stored: %d, want 0", err, n[0])
	}
}
