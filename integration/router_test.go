package integration_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/forwarder"
	"github.com/watermill-outbox/outbox/router"
)

// TestRouterThroughForwarder: the forwarder relays through a router.Publisher: the exact route
// beats a pattern declared before it, the first matching pattern wins, and a topic no route
// takes (no default) fails with ErrNoRoute — retried with backoff, dead-lettered, never marked
// published — while the routed events arrive in order, once (a default is covered by router's unit
// tests). Both the batch path and the per-message path.
func TestRouterThroughForwarder(t *testing.T) {
	for _, batches := range []bool{true, false} {
		name := map[bool]string{true: "batches", false: "per-message"}[batches]
		t.Run(name, func(t *testing.T) {
			e := fwdNewEnv(t)
			dests := map[string]*fwdCollector{}
			var mu sync.Mutex
			dest := func(name string) forwarder.Func {
				col := &fwdCollector{}
				mu.Lock()
				dests[name] = col
				mu.Unlock()
				return func(ctx context.Context, msg *message.Message) error {
					topic, _ := forwarder.TopicFromContext(ctx)
					col.add(fwdReceived{uuid: msg.UUID, topic: topic, payload: msg.Payload, metadata: msg.Metadata, partition: -1})
					return nil
				}
			}
			rt, err := router.New(router.Config{Routes: []router.Route{
				{Topic: "rt.orders.*", Publisher: dest("orders")},
				{Topic: "rt.orders.audit*", Publisher: dest("shadowed")},
				{Topic: "rt.orders.audit", Publisher: dest("audit")},
				{Topic: "rt.*", Publisher: dest("rt")},
			}}, nil)
			if err != nil {
				t.Fatal(err)
			}
			topics := []string{"rt.orders.paid", "rt.orders.audit", "rt.orders.audit2", "rt.billing", "other.x"}
			evs := e.seed(250, 25, func(k int) string { return topics[k%len(topics)] })
			e.run(e.subscriber(outbox.SubscriberConfig{}), rt, forwarder.Config{DisableBatches: !batches})

			routed, unrouted := fwdSplit(evs, func(ev *fwdEvent) bool { return ev.topic != "other.x" })
			heads, _ := fwdSplit(unrouted, func(ev *fwdEvent) bool { return ev.pos == 0 })
			e.waitSettled(30*time.Second, len(routed), len(heads))
			e.checkDeadLettered(heads, 3, router.ErrNoRoute)
			e.checkMarkedOnce(fwdIDs(routed))
			want := map[string][]*fwdEvent{}
			for _, ev := range routed {
				d := map[string]string{"rt.orders.paid": "orders", "rt.orders.audit": "audit", "rt.orders.audit2": "orders", "rt.billing": "rt"}[ev.topic]
				want[d] = append(want[d], ev)
			}
			for name, col := range dests {
				e.checkReceived(col.all(), want[name], func(s string) string { return s })
			}
			if n := dests["shadowed"].len(); n != 0 {
				t.Errorf("shadowed pattern got %d messages", n)
			}
		})
	}
}
