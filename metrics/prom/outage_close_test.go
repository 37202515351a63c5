package prom_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/forwarder"
	"github.com/watermill-outbox/outbox/internal/pgtest"
	"github.com/watermill-outbox/outbox/metrics"
	"github.com/watermill-outbox/outbox/metrics/prom"
)

// TestDestinationUnavailableClearedOnClose: a subscription that stops while it treats a
// destination as unavailable no longer treats it so (Subscriber.Outages() is empty), but
// outbox_destination_unavailable{destination} stays 1 for good: OutboxDestinationDown keeps
// firing after the relay stopped, or after it was restarted in-process with the same Observer.
// TestDestinationUnavailableClearedOnClose: a subscription that stops during an outage ends it
// for its hooks (Hooks.OnOutage with Ended), so outbox_destination_unavailable goes back to 0;
// it stayed at 1 for good and README's OutboxDestinationDown alert kept firing.
func TestDestinationUnavailableClearedOnClose(t *testing.T) {
	pool := pgtest.Require(t)
	ctx := t.Context()
	schema := outbox.SchemaConfig{Table: pgtest.Table(t)}
	if err := outbox.Migrate(ctx, pool, schema); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	rec, err := prom.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	obs, err := metrics.New(rec, metrics.Config{})
	if err != nil {
		t.Fatal(err)
	}
	pub, err := outbox.NewPublisher(pool, outbox.PublisherConfig{Schema: schema}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pub.Enqueue(ctx, outbox.EventInput{Topic: "orders", Payload: 1}); err != nil {
		t.Fatal(err)
	}
	sub, err := outbox.NewSubscriber(pool, outbox.SubscriberConfig{
		Schema: schema, PollInterval: 20 * time.Millisecond, UnavailableBackoff: 10 * time.Millisecond,
		Hooks: obs.Hooks(),
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	dest := forwarder.Func(func(context.Context, *message.Message) error {
		return &outbox.UnavailableError{Destination: "sink", Err: errors.New("down")}
	})
	fw, err := forwarder.New(sub, dest, forwarder.Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan struct{})
	go func() { defer close(done); _ = fw.Run(runCtx) }()
	gauge := func() float64 {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "outbox_destination_unavailable" {
				for _, m := range mf.GetMetric() {
					return m.GetGauge().GetValue()
				}
			}
		}
		return -1
	}
	pgtest.Eventually(t, 10*time.Second, "destination down", func() bool { return gauge() == 1 })
	_ = fw.Close()
	cancel()
	<-done
	_ = sub.Close()
	if n := len(sub.Outages()); n != 0 {
		t.Fatalf("Outages() after Close: %d", n)
	}
	if g := gauge(); g != 0 {
		t.Errorf("outbox_destination_unavailable{destination=sink} = %v after the subscription stopped (Outages() empty), want 0", g)
	}
}
