package forwarder_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"

	"github.com/ThreeDotsLabs/watermill/message"
	_ "modernc.org/sqlite"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/forwarder"
	_ "github.com/watermill-outbox/outbox/sqlite"
)

// Relay the outbox to a Go function: forwarder.Func is a Watermill publisher, so the relay's
// batching, retries and dead letters apply as to any broker. The forwarder subscribes to every
// outbox topic ("*") by default and hands each event on under its own topic; Config.Topic
// maps topics, Config.SubscribeTopic narrows them.
func ExampleNew() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "outbox-example")
	defer os.RemoveAll(dir)
	db, _ := sql.Open("sqlite", outbox.SQLiteDSN(filepath.Join(dir, "app.db")))
	defer db.Close()
	schema := outbox.SchemaConfig{Dialect: outbox.DialectSQLite}
	if err := outbox.Migrate(ctx, db, schema); err != nil {
		panic(err)
	}
	writer, _ := outbox.NewPublisher(db, outbox.PublisherConfig{Schema: schema}, nil)
	for _, step := range []string{"created", "paid"} {
		msg := outbox.NewMessage([]byte(`{"order":1}`))
		outbox.SetOrderingKey(msg, "order-1")
		if err := writer.Publish("orders."+step, msg); err != nil {
			panic(err)
		}
	}

	got := make(chan string, 2)
	dest := forwarder.Func(func(ctx context.Context, msg *message.Message) error {
		topic, _ := forwarder.TopicFromContext(ctx)
		got <- topic + " " + string(msg.Payload)
		return nil // an error: retried with backoff, dead-lettered after MaxAttempts
	})
	sub, err := outbox.NewSubscriber(db, outbox.SubscriberConfig{Schema: schema}, nil)
	if err != nil {
		panic(err)
	}
	fwd, err := forwarder.New(sub, dest, forwarder.Config{
		Topic: func(topic string, _ *message.Message) string { return "public." + topic },
	}, nil)
	if err != nil {
		panic(err)
	}
	go func() { _ = fwd.Run(ctx) }()
	fmt.Println(<-got)
	fmt.Println(<-got)
	_ = fwd.Close() // waits for the acks to be written

	b, _ := sub.Backlog(ctx)
	fmt.Println("pending:", b.Pending)
	// Output:
	// public.orders.created {"order":1}
	// public.orders.paid {"order":1}
	// pending: 0
}
