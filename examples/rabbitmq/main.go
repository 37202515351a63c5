// Command rabbitmq runs the outbox end to end with RabbitMQ: four writers commit 100
// transactions that each insert ten order rows and their ten events (ordering key = order id,
// 50 orders), a forwarder relays the events to a durable queue through the default exchange
// (persistent messages, publisher confirms, mandatory routing), and the stock watermill-amqp
// subscriber reads them back. RabbitMQ comes from OUTBOX_EXAMPLE_AMQP_URL (default
// amqp://guest:guest@127.0.0.1:5672/), PostgreSQL from OUTBOX_EXAMPLE_POSTGRES_DSN.
//
//	go run ./examples/rabbitmq
//
// It prints one line, "delivered=1000 duplicates=0 reordered=0", and exits non-zero when the
// numbers differ or it does not finish within 25 seconds.
package main

import (
	"context"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	wmamqp "github.com/ThreeDotsLabs/watermill-amqp/v2/pkg/amqp"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/watermill-outbox/outbox/examples/internal/demo"
	"github.com/watermill-outbox/outbox/forwarder/amqp"
)

func main() { demo.Main(run) }

func run(ctx context.Context) (string, bool, error) {
	url := demo.Env("OUTBOX_EXAMPLE_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
	r, err := demo.Setup(ctx, "rabbitmq")
	if err != nil {
		return "", false, err
	}
	defer r.Close()
	topic := fmt.Sprintf("outbox-example-orders-%s", r.Schema.Table) // the queue; the routing key on the default exchange

	// The consumer first: the stock subscriber declares the durable queue named after the
	// topic, so the relay's mandatory messages have somewhere to go.
	defer deleteQueue(url, topic) // after the subscriber closed
	asub, err := wmamqp.NewSubscriber(wmamqp.NewDurableQueueConfig(url), watermill.NopLogger{})
	if err != nil {
		return "", false, err
	}
	defer asub.Close()
	msgs, err := asub.Subscribe(ctx, topic)
	if err != nil {
		return "", false, err
	}

	pub, err := amqp.NewPublisher(amqp.Config{URL: url}, nil)
	if err != nil {
		return "", false, err
	}
	defer pub.Close()
	stop, err := r.Relay(ctx, pub)
	if err != nil {
		return "", false, err
	}
	defer stop()
	if err := r.Write(ctx, topic, "examples/rabbitmq"); err != nil {
		return "", false, err
	}
	return r.Tally(ctx, msgs)
}

func deleteQueue(url, queue string) {
	conn, err := amqp091.Dial(url)
	if err != nil {
		return
	}
	defer conn.Close()
	if ch, err := conn.Channel(); err == nil {
		_, _ = ch.QueueDelete(queue, false, false, false)
	}
}
