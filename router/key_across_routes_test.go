package router_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/forwarder"
	"github.com/watermill-outbox/outbox/router"
)

// TestBatchKeyAcrossRoutesHeldBack: one ordering key whose events go to two routes. The
// first event fails at route A; the outbox's rule: "In a batch, a failing event of a key keeps that
// key's later events of the batch off the wire" (and §4.1 step 3: the next only after the
// previous is acked). The router must not put the key's second event on route B's wire.
func TestBatchKeyAcrossRoutesHeldBack(t *testing.T) {
	a := &rec{name: "a", fail: map[string]bool{"e1": true}}
	b := &rec{name: "b", fail: map[string]bool{}}
	p, err := router.New(router.Config{Routes: []router.Route{
		{Topic: "orders.*", Publisher: a},
		{Topic: "shipping.*", Publisher: b},
	}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	m1, m2 := message.NewMessage("e1", nil), message.NewMessage("e2", nil)
	outbox.SetOrderingKey(m1, "order-42")
	outbox.SetOrderingKey(m2, "order-42")
	errs := p.PublishBatch(context.Background(), []forwarder.Outgoing{
		{Topic: "orders.cancelled", Message: m1},
		{Topic: "shipping.requested", Message: m2},
	})
	fmt.Println("results:", errs, "route b got:", b.topics())
	if errs[0] == nil {
		t.Fatalf("e1 should fail")
	}
	if len(b.topics()) != 0 || !errors.Is(errs[1], forwarder.ErrHeldBack) {
		t.Errorf("e2 of key order-42 went out on route b (%v) although e1 of the same key failed earlier in the batch; result %v, want ErrHeldBack and nothing sent", b.topics(), errs[1])
	}
}

// slowFirst is one destination (say one Kafka producer) that takes a while for topic "orders.*".
type slowFirst struct{ rec }

func (s *slowFirst) Publish(topic string, msgs ...*message.Message) error {
	if topic == "orders.cancelled" {
		time.Sleep(50 * time.Millisecond)
	}
	return s.rec.Publish(topic, msgs...)
}

// TestBatchKeyOrderOneDestinationTwoRoutes: two routes to the same destination (the
// README's own shape: different topics, one Kafka), one ordering key across them. Nothing
// fails, yet the key's second event reaches the destination first: the relay's rule, "A key's
// events go out one after another in sequence order (the next only after the previous is
// acked)".
func TestBatchKeyOrderOneDestinationTwoRoutes(t *testing.T) {
	dest := &slowFirst{}
	p, err := router.New(router.Config{Routes: []router.Route{
		{Topic: "orders.*", Name: "kafka", Publisher: dest},
		{Topic: "shipping.*", Name: "kafka", Publisher: dest},
	}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	m1, m2 := message.NewMessage("e1", nil), message.NewMessage("e2", nil)
	outbox.SetOrderingKey(m1, "order-42")
	outbox.SetOrderingKey(m2, "order-42")
	errs := p.PublishBatch(context.Background(), []forwarder.Outgoing{
		{Topic: "orders.cancelled", Message: m1},
		{Topic: "shipping.requested", Message: m2},
	})
	if errs[0] != nil || errs[1] != nil {
		t.Fatal(errs)
	}
	if got := fmt.Sprint(dest.topics()); got != "[orders.cancelled/e1 shipping.requested/e2]" {
		t.Errorf("destination received key order-42 as %s, want e1 then e2", got)
	}
}
