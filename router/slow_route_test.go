package router_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/forwarder"
	"github.com/watermill-outbox/outbox/internal/pgtest"
	"github.com/watermill-outbox/outbox/router"
)

// TestHealthySlowRouteDeliversEachEventOnce: a router with one route to a healthy
// per-message destination (a webhook receiver answering 2xx in 150 ms; webhook.Publisher is
// not a BatchPublisher). Through forwarder.New the router's PublishBatch is used, which sends
// a route's part one message after another: a batch of 20 takes 3 s, past DeliveryTimeout
// (1 s here; 30 s with 100-event batches and a 300 ms receiver by default), so events that
// were delivered are counted as failed and delivered again, batch after batch.
func TestHealthySlowRouteDeliversEachEventOnce(t *testing.T) {
	var deliveries atomic.Int32
	slow := forwarder.Func(func(context.Context, *message.Message) error {
		time.Sleep(150 * time.Millisecond)
		deliveries.Add(1)
		return nil
	})
	rt, err := router.New(router.Config{Routes: []router.Route{{Topic: "hooks.*", Publisher: slow}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var in []outbox.EventInput
	for range 20 {
		in = append(in, outbox.EventInput{Topic: "hooks.sent", Payload: 1})
	}
	pool, table, _ := relayThrough(t, in, rt, 20)
	var published, failed int
	pgtest.Eventually(t, 20*time.Second, "the 20 events published", func() bool {
		if err := pool.QueryRow(context.Background(), `SELECT count(*) FILTER (WHERE published_at IS NOT NULL), count(*) FILTER (WHERE attempts > 0) FROM `+table).Scan(&published, &failed); err != nil {
			t.Fatal(err)
		}
		return published == 20
	})
	if failed != 0 || deliveries.Load() != 20 {
		t.Errorf("a healthy 150 ms destination behind the router: %d deliveries, %d counted failed; want 20, 0", deliveries.Load(), failed)
	}
}
