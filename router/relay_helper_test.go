package router_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/forwarder"
	"github.com/watermill-outbox/outbox/internal/pgtest"
	"github.com/watermill-outbox/outbox/router"
)

// relayThrough enqueues in on a fresh PostgreSQL outbox table and runs a relay (batches of
// batch events, 1 s DeliveryTimeout, fast retries) forwarding to rt through forwarder.New,
// which uses rt's PublishBatch, until the test ends. It returns the pool, the table and the
// stored events.
func relayThrough(t *testing.T, in []outbox.EventInput, rt *router.Publisher, batch int) (*pgxpool.Pool, string, []outbox.Event) {
	t.Helper()
	pool := pgtest.Require(t)
	schema := outbox.SchemaConfig{Table: pgtest.Table(t)}
	ctx := context.Background()
	if err := outbox.Migrate(ctx, pool, schema); err != nil {
		t.Fatal(err)
	}
	pub, err := outbox.NewPublisher(pool, outbox.PublisherConfig{Schema: schema}, nil)
	if err != nil {
		t.Fatal(err)
	}
	evs, err := pub.EnqueueMany(ctx, in)
	if err != nil {
		t.Fatal(err)
	}
	sub, err := outbox.NewSubscriber(pool, outbox.SubscriberConfig{Schema: schema, PollInterval: 50 * time.Millisecond, BatchSize: batch,
		LeaseDuration: 3 * time.Second, DeliveryTimeout: time.Second, RetryBase: 100 * time.Millisecond, RetryMax: 200 * time.Millisecond}, nil)
	if err != nil {
		t.Fatal(err)
	}
	fw, err := forwarder.New(sub, rt, forwarder.Config{CloseTimeout: time.Second}, nil)
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = fw.Run(rctx) }()
	t.Cleanup(func() { cancel(); wg.Wait() })
	return pool, schema.Table, evs
}
