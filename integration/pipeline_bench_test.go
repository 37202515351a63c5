package integration_test

import (
	"context"
	"fmt"
	"math"
	"os"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	wmsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/forwarder"
	"github.com/watermill-outbox/outbox/forwarder/amqp"
	"github.com/watermill-outbox/outbox/internal/brokertest"
)

// noopBatchPublisher is a destination that costs nothing: every message succeeds at once.
type noopBatchPublisher struct{}

func (noopBatchPublisher) Publish(string, ...*message.Message) error { return nil }
func (noopBatchPublisher) Close() error                              { return nil }
func (noopBatchPublisher) PublishBatch(_ context.Context, batch []forwarder.Outgoing) []error {
	return make([]error, len(batch))
}

// BenchmarkForwarderRatios measures how much of each destination's capacity the relay uses,
// with the contenders interleaved: each of OUTBOX_BENCH_ROUNDS rounds (default 3), in reverse
// order every other round, runs RabbitMQ alone (PublishBatch calls of 1,000 with publisher
// confirms, no database), the relay to RabbitMQ with one and with two subscriptions
// (forwarder.Config.Subscriptions), the relay to a no-op destination, Kafka
// (kfake) alone and the relay to Kafka, each through forwarder/kafka (kgo) and through
// forwarder/kafkasarama (Sarama, per-key rounds), and Watermill's components/forwarder tuned
// (batch 1000, 10 ms poll) to Kafka, each on a fresh backlog of OUTBOX_BENCH_EVENTS events (default 100000) over
// OUTBOX_BENCH_KEYS keys (1000), one subscription, BatchSize 1000, MaxRunPerKey 100. It logs
// every run, the medians and the ratios of the medians: relay → RabbitMQ (each) ÷ RabbitMQ alone,
// relay → Kafka ÷ Kafka alone, relay → Kafka ÷ relay → no-op, relay → Kafka ÷ Watermill's
// forwarder, and the ceilings of the last two (relay → no-op ÷ Watermill's forwarder, Kafka
// alone ÷ relay → no-op). OUTBOX_BENCH_ONLY (comma-separated variant names) runs a subset.
//
//	go test ./integration -run '^$' -bench 'ForwarderRatios' -benchtime 1x -timeout 60m
func BenchmarkForwarderRatios(b *testing.B) {
	url := brokertest.RequireRabbitMQ(b)
	n := fwdBenchEnv("OUTBOX_BENCH_EVENTS", 100000)
	keys := fwdBenchEnv("OUTBOX_BENCH_KEYS", 1000)
	rounds := fwdBenchEnv("OUTBOX_BENCH_ROUNDS", 3)
	// rabbit runs f with a fresh durable queue and an amqp publisher with confirms, then
	// checks that the queue holds n messages.
	rabbit := func(f func(b *testing.B, pub *amqp.Publisher, queue string) float64) func(b *testing.B) float64 {
		return func(b *testing.B) float64 {
			queue, pub, held := fwdAMQPQueue(b, url, "ratio")
			rate := f(b, pub, queue)
			if got := held(); got != n {
				b.Fatalf("queue holds %d messages, want %d", got, n)
			}
			return rate
		}
	}
	type variant struct {
		name string
		run  func(b *testing.B) float64
	}
	variants := []variant{
		{"rabbitmq-alone", rabbit(func(b *testing.B, pub *amqp.Publisher, queue string) float64 {
			bs := fwdBenchBatches(queue, n, keys)
			return fwdBenchSend(b, pub, bs)
		})},
		{"relay-rabbitmq", rabbit(func(b *testing.B, pub *amqp.Publisher, queue string) float64 {
			return fwdBenchDrain(b, fwdBenchSeed(b, queue, n, keys), n, pub, 1)
		})},
		{"relay-rabbitmq-subs2", rabbit(func(b *testing.B, pub *amqp.Publisher, queue string) float64 {
			return fwdBenchDrain(b, fwdBenchSeed(b, queue, n, keys), n, pub, 2)
		})},
		{"relay-noop", func(b *testing.B) float64 {
			return fwdBenchDrain(b, fwdBenchSeed(b, "bench", n, keys), n, noopBatchPublisher{}, 1)
		}},
	}
	for _, sarama := range []bool{false, true} {
		suffix := ""
		if sarama {
			suffix = "-sarama"
		}
		kafkaPub := func(b *testing.B) (*kfake.Cluster, forwarder.BatchPublisher) {
			c := brokertest.Kafka(b, kfake.SeedTopics(8, "bench"))
			pub := fwdBenchKafkaPublisher(b, c, sarama)
			b.Cleanup(func() { pub.Close() })
			return c, pub
		}
		variants = append(variants, variant{"kafka-alone" + suffix, func(b *testing.B) float64 {
			c, pub := kafkaPub(b)
			bs := fwdBenchBatches("bench", n, keys)
			rate := fwdBenchSend(b, pub, bs)
			fwdBenchKafkaCheck(b, c, "bench", n, outbox.MetadataOrderingKey)
			return rate
		}}, variant{"relay-kafka" + suffix, func(b *testing.B) float64 {
			c, pub := kafkaPub(b)
			rate := fwdBenchDrain(b, fwdBenchSeed(b, "bench", n, keys), n, pub, 1)
			fwdBenchKafkaCheck(b, c, "bench", n, outbox.MetadataOrderingKey)
			return rate
		}})
	}
	variants = append(variants, []variant{
		{"watermill-forwarder-tuned-kafka", func(b *testing.B) float64 {
			return fwdBenchWatermillOnce(b, n, keys, wmsql.DefaultPostgreSQLSchema{SubscribeBatchSize: 1000}, wmsql.SubscriberConfig{PollInterval: 10 * time.Millisecond})
		}},
	}...)
	if only := os.Getenv("OUTBOX_BENCH_ONLY"); only != "" {
		names := strings.Split(only, ",")
		variants = slices.DeleteFunc(variants, func(v variant) bool { return !slices.Contains(names, v.name) })
	}
	results := map[string][]float64{}
	for r := range rounds {
		order := slices.Clone(variants)
		if r%2 == 1 {
			slices.Reverse(order)
		}
		for _, v := range order {
			var rate float64
			// A sub-benchmark per run, so that each run's cleanups (tables, kfake) happen at
			// its end; with -benchtime 1x it runs once.
			b.Run(fmt.Sprintf("round%d/%s", r+1, v.name), func(b *testing.B) {
				b.StopTimer()
				rate = v.run(b)
				b.ReportMetric(rate, "events/s")
			})
			if rate == 0 {
				b.Fatalf("round %d %s: no result", r+1, v.name)
			}
			results[v.name] = append(results[v.name], rate)
		}
	}
	med := func(name string) float64 {
		xs := slices.Clone(results[name])
		if len(xs) == 0 {
			return 0
		}
		sort.Float64s(xs)
		if len(xs)%2 == 1 {
			return xs[len(xs)/2]
		}
		return (xs[len(xs)/2-1] + xs[len(xs)/2]) / 2
	}
	var t strings.Builder
	fmt.Fprintf(&t, "\nmedians of %d interleaved rounds, %d events over %d keys:\n", rounds, n, keys)
	for _, v := range variants {
		fmt.Fprintf(&t, "%-44s %8.0f events/s  (runs %.0f)\n", v.name, med(v.name), results[v.name])
	}
	for _, r := range []struct {
		name string
		v    float64
	}{
		{"relay-rabbitmq ÷ rabbitmq-alone", med("relay-rabbitmq") / med("rabbitmq-alone")},
		{"relay-rabbitmq-subs2 ÷ rabbitmq-alone", med("relay-rabbitmq-subs2") / med("rabbitmq-alone")},
		{"relay-kafka ÷ kafka-alone", med("relay-kafka") / med("kafka-alone")},
		{"relay-kafka ÷ relay-noop", med("relay-kafka") / med("relay-noop")},
		{"relay-kafka ÷ watermill-tuned", med("relay-kafka") / med("watermill-forwarder-tuned-kafka")},
		// The ceilings of the two ratios above on this machine: a relay can go no faster than
		// its drain to a destination that costs nothing, nor than the destination alone.
		{"relay-noop ÷ watermill-tuned", med("relay-noop") / med("watermill-forwarder-tuned-kafka")},
		{"kafka-alone ÷ relay-noop", med("kafka-alone") / med("relay-noop")},
		{"relay-kafka-sarama ÷ kafka-alone-sarama", med("relay-kafka-sarama") / med("kafka-alone-sarama")},
		{"relay-kafka-sarama ÷ relay-noop", med("relay-kafka-sarama") / med("relay-noop")},
		{"relay-kafka-sarama ÷ watermill-tuned", med("relay-kafka-sarama") / med("watermill-forwarder-tuned-kafka")},
	} {
		if r.v > 0 && !math.IsInf(r.v, 0) { // both variants ran: a missing one gives 0, NaN or +Inf
			fmt.Fprintf(&t, "%-44s %8.2f\n", r.name, r.v)
		}
	}
	fmt.Print(t.String())
}
