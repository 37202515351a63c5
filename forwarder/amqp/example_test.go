package amqp_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	_ "modernc.org/sqlite"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/forwarder"
	"github.com/watermill-outbox/outbox/forwarder/amqp"
	_ "github.com/watermill-outbox/outbox/sqlite"
)

// Relay the outbox to RabbitMQ with publisher confirms: with the default exchange ("") each
// event goes to the queue named after its topic (Config.Exchange and Config.RoutingKey change
// that). Messages are persistent and mandatory: an event no queue takes is retried, not lost.
// RabbitMQ at 127.0.0.1:5672 (or OUTBOX_TEST_AMQP_URL).
func ExampleNewPublisher() {
	ctx := context.Background()
	url := os.Getenv("OUTBOX_TEST_AMQP_URL")
	if url == "" {
		url = "amqp://guest:guest@127.0.0.1:5672/"
	}
	conn, err := amqp091.Dial(url)
	if err != nil {
		panic(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		panic(err)
	}
	queue := fmt.Sprintf("orders.created.example-%d", time.Now().UnixNano()) // a topic of its own
	if _, err := ch.QueueDeclare(queue, false, false, false, false, nil); err != nil {
		panic(err)
	}
	defer ch.QueueDelete(queue, false, false, false)

	dir, _ := os.MkdirTemp("", "outbox-example")
	defer os.RemoveAll(dir)
	db, _ := sql.Open("sqlite", outbox.SQLiteDSN(filepath.Join(dir, "app.db")))
	defer db.Close()
	schema := outbox.SchemaConfig{Dialect: outbox.DialectSQLite}
	if err := outbox.Migrate(ctx, db, schema); err != nil {
		panic(err)
	}
	writer, _ := outbox.NewPublisher(db, outbox.PublisherConfig{Schema: schema}, nil)
	msg := outbox.NewMessage([]byte(`{"id":"order-1"}`))
	outbox.SetOrderingKey(msg, "order-1")
	if err := writer.Publish(queue, msg); err != nil {
		panic(err)
	}

	pub, err := amqp.NewPublisher(amqp.Config{URL: url}, nil)
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

	deliveries, err := ch.Consume(queue, "", true, false, false, false, nil)
	if err != nil {
		panic(err)
	}
	d := <-deliveries
	fmt.Println(string(d.Body), d.Headers[outbox.MetadataOrderingKey], d.MessageId == msg.UUID)
	// Output:
	// {"id":"order-1"} order-1 true
}
