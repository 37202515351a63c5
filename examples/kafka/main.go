// Command kafka runs the outbox end to end with Kafka: four writers commit 100 transactions
// that each insert ten order rows and their ten events (ordering key = order id, 50 orders),
// a forwarder relays the events to Kafka in batches (acks=all, idempotent producer, order id as
// message key), and the stock watermill-kafka subscriber reads them back. Kafka is kfake, run
// in-process on loopback; PostgreSQL comes from OUTBOX_EXAMPLE_POSTGRES_DSN.
//
//	go run ./examples/kafka
//
// It prints one line, "delivered=1000 duplicates=0 reordered=0", and exits non-zero when the
// numbers differ or it does not finish within 25 seconds.
package main

import (
	"context"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	wmkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/watermill-outbox/outbox/examples/internal/demo"
	"github.com/watermill-outbox/outbox/forwarder/kafka"
)

const topic = "orders.events"

func main() { demo.Main(run) }

func run(ctx context.Context) (string, bool, error) {
	r, err := demo.Setup(ctx, "kafka")
	if err != nil {
		return "", false, err
	}
	defer r.Close()

	// Kafka: an in-process kfake cluster with the topic (auto-create off).
	cluster, err := kfake.NewCluster(kfake.SeedTopics(4, topic))
	if err != nil {
		return "", false, err
	}
	defer cluster.Close()

	pub, err := kafka.NewPublisher(kafka.Config{Brokers: cluster.ListenAddrs()}, nil)
	if err != nil {
		return "", false, err
	}
	defer pub.Close()
	stop, err := r.Relay(ctx, pub)
	if err != nil {
		return "", false, err
	}
	defer stop()
	if err := r.Write(ctx, topic, "examples/kafka"); err != nil {
		return "", false, err
	}

	// The consumer: watermill-kafka's own subscriber and unmarshaler.
	sc := wmkafka.DefaultSaramaSubscriberConfig()
	sc.Consumer.Offsets.Initial = sarama.OffsetOldest
	ksub, err := wmkafka.NewSubscriber(wmkafka.SubscriberConfig{
		Brokers: cluster.ListenAddrs(), Unmarshaler: wmkafka.DefaultMarshaler{}, OverwriteSaramaConfig: sc,
	}, watermill.NopLogger{})
	if err != nil {
		return "", false, err
	}
	defer ksub.Close()
	msgs, err := ksub.Subscribe(ctx, topic)
	if err != nil {
		return "", false, err
	}
	return r.Tally(ctx, msgs)
}
