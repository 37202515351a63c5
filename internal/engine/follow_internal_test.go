package engine

import (
	"context"
	"testing"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/watermill-outbox/outbox/internal/dialect"
)

// followSub is a subscription with floors (a sweeper) and continuations, as on PostgreSQL.
func followSub() *subscription {
	s := &Relay{logger: watermill.NopLogger{}, caps: dialect.Capabilities{Continuations: true}}
	s.cfg.MaxRunPerKey = 10
	return &subscription{s: s, ctx: context.Background(), claimer: claimer{sweep: &sweeper{}}}
}

func ev(seq int64, key string, state int, follow bool) *item {
	return &item{ev: event{Sequence: seq, OrderingKey: key}, state: state, follow: follow}
}

// TestFollowedKeyNotLost: a followed key (claimed below the keyed floor) whose continuation
// is lost has the next claim lower the floor to the key's next event, which nothing else
// would find before the sweep. Seen in TestEventsBehindAFloor under load: the retried head
// was delivered while the next batch was out (claimed ahead); that batch's continuations
// replaced the head's before any claim used them, and the key's 4 later events waited for
// the sweep (30 s).
func TestFollowedKeyNotLost(t *testing.T) {
	t.Run("continuations no claim used", func(t *testing.T) {
		sub := followSub()
		sub.continueRuns("t1", []*item{ev(1, "a", stateAcked, true), ev(40, "b", stateAcked, false)})
		if len(sub.contKeys) != 1 || sub.contKeys[0] != "a" || sub.contAfter[0] != 1 || !sub.contFollow["a"] || sub.refind != 0 {
			t.Fatalf("after the head's batch: contKeys %v after %v follow %v refind %d, want [a] [1] a, 0", sub.contKeys, sub.contAfter, sub.contFollow, sub.refind)
		}
		// The batch claimed ahead is delivered before any claim used the continuations.
		sub.continueRuns("t2", []*item{ev(41, "b", stateAcked, false)})
		if sub.refind != 2 {
			t.Fatalf("refind %d, want 2 (the event after the head's run)", sub.refind)
		}
	})
	t.Run("not followed", func(t *testing.T) {
		sub := followSub()
		sub.continueRuns("t1", []*item{ev(1, "a", stateAcked, false), ev(2, "a", stateReleased, false)})
		sub.continueRuns("t2", []*item{ev(41, "b", stateAcked, false)})
		if sub.refind != 0 {
			t.Fatalf("refind %d for keys above the floor, want 0", sub.refind)
		}
	})
	t.Run("run not acked whole", func(t *testing.T) {
		sub := followSub()
		sub.continueRuns("t1", []*item{ev(5, "a", stateAcked, true), ev(6, "a", stateReleased, true), ev(7, "a", stateReleased, true)})
		if len(sub.contKeys) != 0 || sub.refind != 6 {
			t.Fatalf("contKeys %v refind %d, want none and 6", sub.contKeys, sub.refind)
		}
		sub.refindFrom(9) // only ever lowered
		if sub.refind != 6 {
			t.Fatalf("refind %d after refindFrom(9), want 6", sub.refind)
		}
	})
	t.Run("claim without the continuation", func(t *testing.T) {
		sub := followSub()
		conts := []dialect.Continuation{{Key: "a", From: 1, After: 3}, {Key: "b", From: 10, After: 12}}
		follow := map[string]bool{"a": true, "b": true}
		sub.lostFollowed(conts, follow, []*item{{ev: event{Sequence: 4, OrderingKey: "a"}, cont: true}, {ev: event{Sequence: 50, OrderingKey: "c"}}})
		if sub.refind != 13 {
			t.Fatalf("refind %d, want 13 (b not continued)", sub.refind)
		}
		sub.refind = 0
		sub.lostFollowed(conts, map[string]bool{"a": true}, nil)
		if sub.refind != 4 {
			t.Fatalf("refind %d after a failed claim, want 4", sub.refind)
		}
	})
	t.Run("no floors", func(t *testing.T) {
		sub := followSub()
		sub.sweep = nil // MariaDB/MySQL: continuations without floors
		sub.lostFollowed([]dialect.Continuation{{Key: "a", After: 3}}, map[string]bool{"a": true}, nil)
		if sub.refind != 0 {
			t.Fatalf("refind %d without floors, want 0", sub.refind)
		}
	})
}
