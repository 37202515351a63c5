// Command redis runs the outbox end to end with Redis Streams: four writers commit 100
// transactions that each insert ten order rows and their ten events (ordering key = order id,
// 50 orders), a forwarder appends the events to a stream (one pipeline per batch, no client
// retries), and the stock watermill-redisstream subscriber reads them back in a consumer
// group. Redis comes from OUTBOX_EXAMPLE_REDIS_ADDR (default 127.0.0.1:6379), PostgreSQL from
// OUTBOX_EXAMPLE_POSTGRES_DSN.
//
//	go run ./examples/redis
//
// It prints one line, "delivered=1000 duplicates=0 reordered=0", and exits non-zero when the
// numbers differ or it does not finish within 25 seconds.
package main

import (
	"context"

	"github.com/ThreeDotsLabs/watermill"
	wmredis "github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/redis/go-redis/v9"

	"github.com/watermill-outbox/outbox/examples/internal/demo"
	"github.com/watermill-outbox/outbox/forwarder/redisstream"
)

func main() { demo.Main(run) }

func run(ctx context.Context) (string, bool, error) {
	addr := demo.Env("OUTBOX_EXAMPLE_REDIS_ADDR", "127.0.0.1:6379")
	r, err := demo.Setup(ctx, "redis")
	if err != nil {
		return "", false, err
	}
	defer r.Close()
	topic := "outbox-example-orders-" + r.Schema.Table // the stream

	// A client to delete the stream at the end (the subscriber's Close closes its own client;
	// the relay builds its own, without retries).
	admin := redis.NewClient(&redis.Options{Addr: addr})
	defer admin.Close()
	defer admin.Del(context.Background(), topic)

	pub, err := redisstream.NewPublisher(redisstream.Config{Options: &redis.Options{Addr: addr}}, nil)
	if err != nil {
		return "", false, err
	}
	defer pub.Close()
	stop, err := r.Relay(ctx, pub)
	if err != nil {
		return "", false, err
	}
	defer stop()
	if err := r.Write(ctx, topic, "examples/redis"); err != nil {
		return "", false, err
	}

	// The consumer: watermill-redisstream's own subscriber in a consumer group reading the
	// stream from its start, with its default unmarshaller.
	rsub, err := wmredis.NewSubscriber(wmredis.SubscriberConfig{
		Client: redis.NewClient(&redis.Options{Addr: addr}), ConsumerGroup: "example", OldestId: "0", DisableIndefiniteInitialBlock: true,
	}, watermill.NopLogger{})
	if err != nil {
		return "", false, err
	}
	defer rsub.Close()
	msgs, err := rsub.Subscribe(ctx, topic)
	if err != nil {
		return "", false, err
	}
	return r.Tally(ctx, msgs)
}
