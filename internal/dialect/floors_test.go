package dialect

import (
	"testing"
	"time"
)

// TestFloorTracker: a claim's highest sequence settles once a later claim's xmin reaches the
// claim's transaction id, or once none of a look's lock holders is left at a later look; the
// floors are the first held event or the settled sequence + 1, whichever is lower.
func TestFloorTracker(t *testing.T) {
	t0 := time.Unix(1000, 0)
	var f FloorTracker
	f.Update(&FloorReport{Xmin: 90, Xid: 100, MaxSeq: 50, NextKeyed: 10}, t0)
	if f.Keyed != 1 || f.Unordered != 1 {
		t.Fatalf("nothing settled yet: floors %d/%d, want 1/1", f.Keyed, f.Unordered)
	}
	// xmin 99 < 100: the first claim's writers may still run.
	f.Update(&FloorReport{Xmin: 99, Xid: 105, MaxSeq: 60, NextKeyed: 10}, t0)
	if f.Keyed != 1 {
		t.Fatalf("keyed floor %d, want 1", f.Keyed)
	}
	// xmin 100: sequence 50 is settled; the keyed floor stops at the held event 10.
	f.Update(&FloorReport{Xmin: 100, Xid: 0, MaxSeq: 60, NextKeyed: 10}, t0)
	if f.Keyed != 10 || f.Unordered != 51 {
		t.Fatalf("floors %d/%d, want 10/51", f.Keyed, f.Unordered)
	}
	// A claim without a transaction id adds no point; xmin stuck below 105.
	f.Update(&FloorReport{Xmin: 101, MaxSeq: 60}, t0.Add(100*time.Millisecond))
	if f.Keyed != 51 || f.Unordered != 51 {
		t.Fatalf("floors %d/%d, want 51/51", f.Keyed, f.Unordered)
	}
	if f.LookAtLocks(t0.Add(SettleWait - time.Millisecond)) {
		t.Fatal("looks at the locks before SettleWait")
	}
	at := t0.Add(SettleWait)
	if !f.LookAtLocks(at) {
		t.Fatal("does not look at the locks after SettleWait")
	}
	f.CheckLocks([]string{"3/7", "4/2"}, at)
	f.Update(&FloorReport{Xmin: 101, Xid: 110, MaxSeq: 70}, at)
	if f.Keyed != 51 || f.LookAtLocks(at.Add(SettleWait-time.Millisecond)) {
		t.Fatalf("keyed floor %d, want 51, and no look before another SettleWait", f.Keyed)
	}
	// 4/2 is still there: nothing settles.
	at2 := at.Add(SettleWait)
	f.CheckLocks([]string{"4/2", "5/1"}, at2)
	f.Update(&FloorReport{Xmin: 101, MaxSeq: 70}, at2)
	if f.Keyed != 51 {
		t.Fatalf("keyed floor %d while a holder of the first look is left, want 51", f.Keyed)
	}
	// The first look's last holder is gone: the point recorded before it (60) is settled, and
	// this look starts the next round, for the point recorded after the first look (70).
	at3 := at2.Add(SettleWait)
	f.CheckLocks([]string{"5/1"}, at3)
	f.Update(&FloorReport{Xmin: 101, MaxSeq: 70}, at3)
	if f.Keyed != 61 || f.Unordered != 61 {
		t.Fatalf("floors %d/%d after the first look's holders left, want 61/61", f.Keyed, f.Unordered)
	}
	at4 := at3.Add(SettleWait)
	f.CheckLocks(nil, at4)
	f.Update(&FloorReport{Xmin: 101, MaxSeq: 70}, at4)
	if f.Keyed != 71 || f.Unordered != 71 {
		t.Fatalf("floors %d/%d after the second round, want 71/71", f.Keyed, f.Unordered)
	}
	f.Lower(40, 0)
	if f.Keyed != 40 || f.Unordered != 71 {
		t.Fatalf("lowered floors %d/%d, want 40/71", f.Keyed, f.Unordered)
	}
}
