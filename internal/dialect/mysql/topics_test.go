package mysql

import (
	"testing"

	"github.com/watermill-outbox/outbox/internal/dialect"
)

// A relay of topic "a" must not lease an event of topic "b" that shares an ordering key: the
// key's run ends before it, so the claim leases exactly the key's first event.
func TestRunHonoursTopicFilter(t *testing.T) {
	tb := newTable(t)
	out := mustInsert(t, tb, ev("a", `1`, "k", ""), ev("b", `2`, "k", ""), ev("a", `3`, "k", ""))
	cfg := relayConfig(10, 5)
	onlyA := dialect.TopicSelection{Include: dialect.Topic{Value: "a"}}
	r := New().NewRelay(tb, cfg, onlyA)
	res := claim(t, r, cfg, "relay#000000000000#1")
	var topics []string
	for _, e := range res.Events {
		topics = append(topics, e.Topic)
	}
	t.Logf("stored %d %d %d; claimed %v topics %q", out[0].Sequence, out[1].Sequence, out[2].Sequence, seqsOf(res.Events), topics)
	for _, e := range res.Events {
		if e.Topic != "a" {
			t.Fatalf("relay of topic a leased event %d of topic %q", e.Sequence, e.Topic)
		}
	}
	if got := seqsOf(res.Events); len(got) != 1 || got[0] != out[0].Sequence {
		t.Fatalf("claimed %v, want [%d] (the run stops at the other topic's event)", got, out[0].Sequence)
	}
}

// Paused topics (an outage) must not be leased through a run either.
func TestRunHonoursPausedTopics(t *testing.T) {
	tb := newTable(t)
	out := mustInsert(t, tb, ev("a", `1`, "k", ""), ev("b", `2`, "k", ""))
	cfg := relayConfig(10, 5)
	r := New().NewRelay(tb, cfg, all)
	res, err := r.Claim(t.Context(), sqlEx(needDB(t)), &dialect.ClaimParams{Token: "relay#000000000000#1", Limit: 10, Oldest: 10, Paused: []string{"b"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range res.Events {
		if e.Topic == "b" {
			t.Fatalf("paused topic b leased: event %d (claimed %v)", e.Sequence, seqsOf(res.Events))
		}
	}
	if got := seqsOf(res.Events); len(got) != 1 || got[0] != out[0].Sequence {
		t.Fatalf("claimed %v, want [%d]", got, out[0].Sequence)
	}
}
