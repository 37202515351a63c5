package asynq_test

import (
	"context"

	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/forwarder"
	outboxasynq "github.com/watermill-outbox/outbox/forwarder/asynq"
)

// Relay the outbox's task events to asynq: an event of topic "task.email:welcome" becomes a
// task of type "email:welcome" whose id is the event id.
func ExampleNewPublisher() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://app@127.0.0.1:5432/app")
	if err != nil {
		panic(err)
	}
	sub, err := outbox.NewSubscriber(pool, outbox.SubscriberConfig{}, nil)
	if err != nil {
		panic(err)
	}
	pub, err := outboxasynq.NewPublisher(outboxasynq.Config{
		Redis: asynq.RedisClientOpt{Addr: "127.0.0.1:6379"},
		Queue: "emails",
	}, nil)
	if err != nil {
		panic(err)
	}
	defer pub.Close()
	fwd, err := forwarder.New(sub, pub, forwarder.Config{SubscribeTopic: outboxasynq.DefaultTopicPrefix + "*"}, nil)
	if err != nil {
		panic(err)
	}
	_ = fwd.Run(ctx)
}
