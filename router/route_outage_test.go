package router_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/forwarder"
	"github.com/watermill-outbox/outbox/internal/pgtest"
	"github.com/watermill-outbox/outbox/router"
)

// TestOutageOfOneRouteChargesNoOtherRoute guards against this: route "hooks.*" is down (each call takes
// 250 ms to find that out, as a connect timeout does, and answers unavailable); route
// "billing.*" is up and answers at once. An unavailable destination counts
// no attempt and "Other topics (other routes of a router.Publisher) keep flowing". The
// router's non-batch part of the down route keeps calling it for every event of the batch
// after the first unavailable answer, so the whole batch's results wait for that, past
// DeliveryTimeout: the billing event, delivered at once, is counted as a failed attempt and
// delivered again.
func TestOutageOfOneRouteChargesNoOtherRoute(t *testing.T) {
	var billingDeliveries atomic.Int32
	billing := uuid.Must(uuid.NewV7())
	down := forwarder.Func(func(context.Context, *message.Message) error {
		time.Sleep(250 * time.Millisecond)
		return outbox.Unavailable(errors.New("dial tcp: i/o timeout"))
	})
	up := forwarder.Func(func(_ context.Context, m *message.Message) error {
		if m.UUID == billing.String() {
			billingDeliveries.Add(1)
		}
		return nil
	})
	rt, err := router.New(router.Config{Routes: []router.Route{
		{Topic: "hooks.*", Name: "webhooks", Publisher: down},
		{Topic: "billing.*", Name: "billing", Publisher: up},
	}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var in []outbox.EventInput
	for range 8 {
		in = append(in, outbox.EventInput{Topic: "hooks.sent", Payload: 1})
	}
	in = append(in, outbox.EventInput{ID: billing, Topic: "billing.paid", Payload: 2})
	pool, table, _ := relayThrough(t, in, rt, 100)
	id := billing.String()
	var attempts int
	var published bool
	pgtest.Eventually(t, 10*time.Second, "the billing event published", func() bool {
		if err := pool.QueryRow(context.Background(), `SELECT attempts, published_at IS NOT NULL FROM `+table+` WHERE id = $1`, id).Scan(&attempts, &published); err != nil {
			t.Fatal(err)
		}
		return published
	})
	// Its first delivery's ack, held until the batch's DeliveryTimeout, was a failed attempt,
	// and the event was published only after a second delivery.
	if billingDeliveries.Load() != 1 || attempts != 0 {
		t.Errorf("the webhooks route's outage made the billing route's event count %d failed attempt(s) and go out %d times", attempts, billingDeliveries.Load())
	}
}
