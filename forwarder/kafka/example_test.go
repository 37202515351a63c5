package kafka_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	_ "modernc.org/sqlite"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/forwarder"
	"github.com/watermill-outbox/outbox/forwarder/kafka"
	_ "github.com/watermill-outbox/outbox/sqlite"
)

// Relay the outbox to Kafka: each event becomes a record of the topic of the same name, with
// the ordering key as the record key (so one key's events share a partition, in order, the
// partition the Java client picks for that key) and the payload as the value. The broker here
// is an in-process kfake cluster.
func ExampleNewPublisher() {
	ctx := context.Background()
	cluster, err := kfake.NewCluster(kfake.SeedTopics(3, "orders.created"))
	if err != nil {
		panic(err)
	}
	defer cluster.Close()

	dir, _ := os.MkdirTemp("", "outbox-example")
	defer os.RemoveAll(dir)
	db, _ := sql.Open("sqlite", outbox.SQLiteDSN(filepath.Join(dir, "app.db")))
	defer db.Close()
	schema := outbox.SchemaConfig{Dialect: outbox.DialectSQLite}
	if err := outbox.Migrate(ctx, db, schema); err != nil {
		panic(err)
	}
	writer, _ := outbox.NewPublisher(db, outbox.PublisherConfig{Schema: schema}, nil)
	for _, total := range []string{"10", "20"} {
		msg := outbox.NewMessage([]byte(`{"total":` + total + `}`))
		outbox.SetOrderingKey(msg, "order-1")
		if err := writer.Publish("orders.created", msg); err != nil {
			panic(err)
		}
	}

	pub, err := kafka.NewPublisher(kafka.Config{Brokers: cluster.ListenAddrs()}, nil)
	if err != nil {
		panic(err)
	}
	defer pub.Close()
	sub, _ := outbox.NewSubscriber(db, outbox.SubscriberConfig{Schema: schema}, nil)
	fwd, err := forwarder.New(sub, pub, forwarder.Config{}, nil)
	if err != nil {
		panic(err)
	}
	go func() { _ = fwd.Run(ctx) }()
	defer fwd.Close()

	// Read the topic back with a plain Kafka client.
	client, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...),
		kgo.ConsumeTopics("orders.created"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		panic(err)
	}
	defer client.Close()
	for n := 0; n < 2; {
		client.PollFetches(ctx).EachRecord(func(r *kgo.Record) {
			fmt.Printf("%s key=%s %s\n", r.Topic, r.Key, r.Value)
			n++
		})
	}
	// Output:
	// orders.created key=order-1 {"total":10}
	// orders.created key=order-1 {"total":20}
}
