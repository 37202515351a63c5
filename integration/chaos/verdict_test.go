package chaos

import (
	"cmp"
	"reflect"
	"slices"
	"testing"
	"time"
)

// stored is one committed event as the outbox table holds it at the end of a cell.
type stored struct {
	id, key   string
	seq       int64
	published bool
	dead      bool
	attempts  int
}

// verdict is what a cell found, comparing the destination with the committed events.
type verdict struct {
	// Events is the number of committed events; Delivered the distinct ones the destination got.
	Events, Delivered int
	// Lost: committed, never delivered, neither dead-lettered nor held behind a dead letter.
	Lost int
	// Reordered: events whose first delivery came after the first delivery of a later event
	// (in commit order) of their key.
	Reordered int
	// Duplicates: deliveries beyond the first of each event.
	Duplicates int
	// Dead: dead-lettered events. Held: undelivered events behind a dead letter of their key.
	Dead, Held int
	// Phantoms: delivered ids that were never committed.
	Phantoms int
	// AttemptsSum is the sum of the attempts column; AttemptEvents the events with attempts > 0.
	AttemptsSum, AttemptEvents int
}

// judge compares the deliveries (in arrival order) with the committed events. commitOrder
// gives each key's event ids in commit order; keys it does not name are in sequence order.
func judge(events []stored, commitOrder map[string][]string, deliveries []delivery) verdict {
	v := verdict{Events: len(events)}
	byID := make(map[string]stored, len(events))
	rank := make(map[string]int, len(events))
	bySeq := map[string][]stored{}
	for _, e := range events {
		byID[e.id] = e
		bySeq[e.key] = append(bySeq[e.key], e)
		v.AttemptsSum += e.attempts
		if e.attempts > 0 {
			v.AttemptEvents++
		}
		if e.dead {
			v.Dead++
		}
	}
	for key, evs := range bySeq {
		if order, ok := commitOrder[key]; ok {
			for i, id := range order {
				rank[id] = i
			}
			continue
		}
		slices.SortFunc(evs, func(a, b stored) int { return cmp.Compare(a.seq, b.seq) })
		for i, e := range evs {
			rank[e.id] = i
		}
	}
	seen := make(map[string]bool, len(events))
	maxRank := map[string]int{}
	for _, d := range deliveries {
		e, ok := byID[d.id]
		if !ok {
			v.Phantoms++
			continue
		}
		if seen[d.id] {
			v.Duplicates++
			continue
		}
		seen[d.id] = true
		v.Delivered++
		if e.key == "" {
			continue
		}
		if m, ok := maxRank[e.key]; ok && rank[e.id] < m {
			v.Reordered++
		} else {
			maxRank[e.key] = rank[e.id]
		}
	}
	// The first dead letter of each key, by commit rank.
	firstDead := map[string]int{}
	for _, e := range events {
		if e.dead && e.key != "" {
			if r, ok := firstDead[e.key]; !ok || rank[e.id] < r {
				firstDead[e.key] = rank[e.id]
			}
		}
	}
	for _, e := range events {
		if seen[e.id] || e.dead {
			continue
		}
		if r, ok := firstDead[e.key]; ok && e.key != "" && rank[e.id] > r {
			v.Held++
			continue
		}
		v.Lost++
	}
	return v
}

// TestJudge checks the checker: each fault it must see, in isolation.
func TestJudge(t *testing.T) {
	t0 := time.Unix(0, 0)
	d := func(ids ...string) []delivery {
		out := make([]delivery, len(ids))
		for i, id := range ids {
			out[i] = delivery{id: id, at: t0.Add(time.Duration(i) * time.Millisecond)}
		}
		return out
	}
	events := []stored{
		{id: "a1", key: "a", seq: 1}, {id: "b1", key: "b", seq: 2}, {id: "a2", key: "a", seq: 3},
		{id: "a3", key: "a", seq: 4}, {id: "u", seq: 5, attempts: 2},
	}
	cases := []struct {
		name   string
		events []stored
		order  map[string][]string
		got    []delivery
		want   verdict
	}{
		{"clean", events, nil, d("a1", "b1", "u", "a2", "a3"),
			verdict{Events: 5, Delivered: 5, AttemptsSum: 2, AttemptEvents: 1}},
		{"redelivered run is a duplicate, not a reorder", events, nil, d("a1", "a2", "b1", "a1", "a2", "a3", "u"),
			verdict{Events: 5, Delivered: 5, Duplicates: 2, AttemptsSum: 2, AttemptEvents: 1}},
		{"later event of a key first", events, nil, d("a2", "a1", "a3", "b1", "u"),
			verdict{Events: 5, Delivered: 5, Reordered: 1, AttemptsSum: 2, AttemptEvents: 1}},
		{"lost and phantom", events, nil, d("a1", "a2", "a3", "zz", "u"),
			verdict{Events: 5, Delivered: 4, Lost: 1, Phantoms: 1, AttemptsSum: 2, AttemptEvents: 1}},
		{"commit order overrides sequence order", events, map[string][]string{"a": {"a2", "a1", "a3"}}, d("a1", "a2", "a3", "b1", "u"),
			verdict{Events: 5, Delivered: 5, Reordered: 1, AttemptsSum: 2, AttemptEvents: 1}},
		{"held behind a dead letter", []stored{{id: "a1", key: "a", seq: 1}, {id: "a2", key: "a", seq: 2, dead: true, attempts: 3},
			{id: "a3", key: "a", seq: 3}, {id: "b1", key: "b", seq: 4}}, nil, d("a1", "b1"),
			verdict{Events: 4, Delivered: 2, Dead: 1, Held: 1, AttemptsSum: 3, AttemptEvents: 1}},
	}
	for _, c := range cases {
		if got := judge(c.events, c.order, c.got); !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: got %+v, want %+v", c.name, got, c.want)
		}
	}
}

// TestKillCost checks the attribution of repeats to kills.
func TestKillCost(t *testing.T) {
	t0 := time.Unix(0, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	kills := []time.Time{at(100), at(200)}
	ds := []delivery{
		{"a", at(10)}, {"b", at(90)}, {"c", at(150)}, {"d", at(250)},
		{"b", at(120)}, // orphaned by kill 0, 20 ms after it
		{"c", at(900)}, // orphaned by kill 1, 700 ms after it
		{"c", at(950)}, // a second repeat of c: counted, not timed
		{"d", at(300)}, // no kill after d's first delivery
	}
	perKill, other, slowest := killCost(ds, kills)
	if !reflect.DeepEqual(perKill, []int{1, 2}) || other != 1 || slowest != 700*time.Millisecond {
		t.Errorf("got perKill %v other %d slowest %s, want [1 2] 1 700ms", perKill, other, slowest)
	}
}
