package outbox

import "testing"

// TestSuspectChoice: the event a batch with suspects delivers alone is its first suspect when
// unordered, else the head of that suspect's key in the batch (never an event behind its key's
// head); a batch without suspects (DeliveryStarts 1: only this claim's start) has none. Above
// 2 (MaxDeliveryStarts 3 or more), one start without an outcome (one crash) is no suspect.
func TestSuspectChoice(t *testing.T) {
	ev := func(seq int64, key string, starts int) *item {
		return &item{ev: &Event{Sequence: seq, OrderingKey: key, DeliveryStarts: starts}}
	}
	cases := []struct {
		name  string
		items []*item
		above int   // suspectAbove's value
		want  int64 // 0: none
	}{
		{"no suspect", []*item{ev(1, "", 1), ev(2, "a", 1), ev(3, "a", 1)}, 1, 0},
		{"unordered suspect", []*item{ev(1, "a", 1), ev(2, "", 2), ev(3, "", 3)}, 1, 2},
		{"keyed head suspect", []*item{ev(1, "", 1), ev(2, "b", 4), ev(3, "", 2)}, 1, 2},
		{"suspect behind its key's head", []*item{ev(1, "", 1), ev(2, "a", 1), ev(3, "b", 1), ev(4, "a", 2)}, 1, 2},
		{"one crash is no suspect above 2", []*item{ev(1, "", 2), ev(2, "a", 2), ev(3, "b", 1)}, 2, 0},
		{"two crashes are above 2", []*item{ev(1, "", 2), ev(2, "a", 1), ev(3, "a", 3)}, 2, 2},
		{"first suspect decides", []*item{ev(1, "a", 1), ev(2, "b", 1), ev(3, "b", 2), ev(4, "a", 5)}, 1, 2},
	}
	for _, c := range cases {
		var got int64
		if it := suspect(c.items, c.above); it != nil {
			got = it.ev.Sequence
		}
		if got != c.want {
			t.Errorf("%s: delivered alone %d, want %d", c.name, got, c.want)
		}
	}
}
