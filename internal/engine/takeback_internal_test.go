package engine

import (
	"slices"
	"testing"
	"time"

	"github.com/watermill-outbox/outbox/internal/dialect"
)

// TestClaimedFirstKeepsUnfinishedKeys: after a claim given taken-back keys, a key stays first
// until its last taken-back event is leased; a key not given to the claim (past the claim's
// share) stays, over any number of claims; none stays after firstUntil.
func TestClaimedFirstKeepsUnfinishedKeys(t *testing.T) {
	ev := func(key string, seq int64) *item { return &item{ev: event{OrderingKey: key, Sequence: seq}} }
	sub := &subscription{claimer: claimer{first: []dialect.TakenKey{{Key: "done", Last: 30}, {Key: "cut", Last: 40}, {Key: "none", Last: 50}, {Key: "later", Last: 60}},
		firstUntil: time.Now().Add(time.Hour)}}
	sub.claimedFirst(sub.firstKeys(3), []*item{ev("done", 10), ev("done", 30), ev("cut", 20), ev("", 45), ev("other", 55)})
	var got []string
	for _, f := range sub.first {
		got = append(got, f.Key)
	}
	if want := []string{"cut", "none", "later"}; !slices.Equal(got, want) {
		t.Errorf("first keys %v after the claim, want %v", got, want)
	}
	for range 20 {
		sub.claimedFirst(sub.firstKeys(3), nil)
	}
	if len(sub.first) != 3 {
		t.Errorf("first keys %v after 20 claims that leased none of them, want the 3 kept", sub.first)
	}
	sub.firstUntil = time.Now().Add(-time.Millisecond)
	if sub.claimedFirst(sub.firstKeys(3), nil); sub.first != nil {
		t.Errorf("first keys %v after firstUntil, want none", sub.first)
	}
}
