package integration_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/forwarder"
	"github.com/watermill-outbox/outbox/internal/pgtest"
	"github.com/watermill-outbox/outbox/router"
)

// BenchmarkRouterOutage measures what one destination's outage costs the others (issue 13,
// "Done when" 2): a router sends topics a.* to destination A and b.* to destination B, each
// answering in about 1 ms; half of the backlog is on each. The same drain runs twice in one
// benchmark run, with A up and with A answering unavailable throughout, and reports B's events/s
// in both and their ratio (target ≥ 0.8), plus the attempts counted on A's events during the
// outage (target 0).
//
//	go test ./integration -run '^$' -bench RouterOutage -benchtime 1x
func BenchmarkRouterOutage(b *testing.B) {
	n := fwdBenchEnv("OUTBOX_BENCH_EVENTS", 10000)
	var rates [2]float64
	for round, down := range []bool{false, true} {
		schema := fwdBenchSeedTopics(b, n, 1000)
		rate, attempts := routerOutageDrain(b, schema, n/2, down)
		rates[round] = rate
		if down {
			b.ReportMetric(float64(attempts), "a-attempts")
		}
	}
	b.ReportMetric(rates[0], "b-events/s-no-outage")
	b.ReportMetric(rates[1], "b-events/s-a-down")
	b.ReportMetric(rates[1]/rates[0], "b-ratio")
}

// fwdBenchSeedTopics is fwdBenchSeed over two topics, a.x and b.x, alternating.
func fwdBenchSeedTopics(b *testing.B, n, keys int) outbox.SchemaConfig {
	b.Helper()
	pool := pgtest.Require(b)
	schema := outbox.SchemaConfig{Table: pgtest.Table(b)}
	ctx := context.Background()
	if err := outbox.Migrate(ctx, pool, schema); err != nil {
		b.Fatal(err)
	}
	q := fmt.Sprintf(`INSERT INTO %q (id, topic, payload, ordering_key)
SELECT gen_random_uuid(), CASE WHEN g %% 2 = 0 THEN 'a.x' ELSE 'b.x' END, json_build_object('n', g), 'key-' || (g %% $1)
FROM generate_series(1, $2) g`, schema.Table)
	if _, err := pool.Exec(ctx, q, keys, n); err != nil {
		b.Fatal(err)
	}
	if _, err := pool.Exec(ctx, fmt.Sprintf(`VACUUM ANALYZE %q`, schema.Table)); err != nil {
		b.Fatal(err)
	}
	return schema
}

// routerOutageDrain relays schema's backlog through the router until B's nb events are
// published and returns B's events/s and the attempts counted on A's events.
func routerOutageDrain(b *testing.B, schema outbox.SchemaConfig, nb int, aDown bool) (float64, int) {
	b.Helper()
	pool := pgtest.Require(b)
	var deliveredB atomic.Int64
	done := make(chan struct{})
	sub, err := outbox.NewSubscriber(pool, outbox.SubscriberConfig{
		Schema: schema, BatchSize: 1000, MaxRunPerKey: 100, PollInterval: 10 * time.Millisecond, Concurrency: 20,
		Hooks: outbox.Hooks{OnDelivered: func(d outbox.DeliveredInfo) {
			if strings.HasPrefix(d.Topic, "b.") && deliveredB.Add(1) == int64(nb) {
				close(done)
			}
		}},
	}, nil)
	if err != nil {
		b.Fatal(err)
	}
	dest := func(down bool) forwarder.Func {
		return func(ctx context.Context, _ *message.Message) error {
			time.Sleep(time.Millisecond)
			if down {
				return &outbox.UnavailableError{Destination: "a", Err: errors.New("connect: connection refused")}
			}
			return nil
		}
	}
	rt, err := router.New(router.Config{Routes: []router.Route{
		{Topic: "a.*", Publisher: dest(aDown)},
		{Topic: "b.*", Publisher: dest(false)},
	}}, nil)
	if err != nil {
		b.Fatal(err)
	}
	f, err := forwarder.New(sub, rt, forwarder.Config{DisableBatches: true}, nil)
	if err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	go func() { _ = f.Run(context.Background()) }()
	select {
	case <-done:
	case <-time.After(10 * time.Minute):
		b.Fatalf("B not drained after 10 minutes: %d of %d", deliveredB.Load(), nb)
	}
	rate := float64(nb) / time.Since(start).Seconds()
	_ = f.Close()
	var attempts int
	if err := pool.QueryRow(context.Background(), fmt.Sprintf(`SELECT coalesce(sum(attempts), 0) FROM %q WHERE topic = 'a.x'`, schema.Table)).Scan(&attempts); err != nil {
		b.Fatal(err)
	}
	return rate, attempts
}
