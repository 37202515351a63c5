package integration_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	wmkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/forwarder"
	"github.com/watermill-outbox/outbox/forwarder/kafka"
	"github.com/watermill-outbox/outbox/internal/brokertest"
	"github.com/watermill-outbox/outbox/internal/pgtest"
)

// fwdKafkaPublisher returns our Kafka publisher on c with the extra kgo options, closed at the
// end of the test.
func fwdKafkaPublisher(t *testing.T, c *kfake.Cluster, opts ...kgo.Opt) *kafka.Publisher {
	t.Helper()
	pub, err := kafka.NewPublisher(kafka.Config{Brokers: c.ListenAddrs(), ClientOptions: opts}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	return pub
}

// fwdKafkaConsume reads topics from the beginning with the stock watermill-kafka subscriber
// (no consumer group, DefaultMarshaler) into col until the test ends.
func fwdKafkaConsume(t *testing.T, c *kfake.Cluster, col *fwdCollector, topics ...string) {
	t.Helper()
	sc := wmkafka.DefaultSaramaSubscriberConfig()
	sc.Consumer.Offsets.Initial = sarama.OffsetOldest
	sub, err := wmkafka.NewSubscriber(wmkafka.SubscriberConfig{
		Brokers: c.ListenAddrs(), Unmarshaler: wmkafka.DefaultMarshaler{}, OverwriteSaramaConfig: sc,
	}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() {
		cancel()
		_ = sub.Close()
	})
	for _, topic := range topics {
		ch, err := sub.Subscribe(ctx, topic)
		if err != nil {
			t.Fatal(err)
		}
		go col.consume(topic, ch, func(m *message.Message) int32 {
			p, _ := wmkafka.MessagePartitionFromCtx(m.Context())
			return p
		})
	}
}

// fwdKafkaTopicConfig sets a topic config through Sarama's admin client.
func fwdKafkaTopicConfig(t *testing.T, c *kfake.Cluster, topic, name, value string) {
	t.Helper()
	admin, err := sarama.NewClusterAdmin(c.ListenAddrs(), sarama.NewConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	if err := admin.AlterConfig(sarama.TopicResource, topic, map[string]*string{name: &value}, false); err != nil {
		t.Fatal(err)
	}
}

// TestForwarderKafka: 1,000 events over 50 keys to kfake through the real kgo producer in
// batches; the stock watermill-kafka subscriber reads them with id, payload, headers and topic
// intact, each key in one partition and in order; each event is marked published once.
func TestForwarderKafka(t *testing.T) {
	e := fwdNewEnv(t)
	topics := []string{"fwd.kafka.a", "fwd.kafka.b"}
	c := brokertest.Kafka(t, kfake.SeedTopics(4, topics...))
	evs := e.seed(1000, 50, func(k int) string { return topics[k%2] })
	e.run(e.subscriber(outbox.SubscriberConfig{}), fwdKafkaPublisher(t, c), forwarder.Config{})
	e.waitSettled(60*time.Second, 1000, 0)

	var col fwdCollector
	fwdKafkaConsume(t, c, &col, topics...)
	pgtest.Eventually(t, 30*time.Second, "1000 messages consumed", func() bool { return col.len() >= 1000 })
	e.checkReceived(col.all(), evs, func(s string) string { return s })
	e.checkMarkedOnce(fwdIDs(evs))
	// Every partition of both topics got some keys (the key spreads them).
	parts := map[string]bool{}
	for _, r := range col.all() {
		parts[fmt.Sprintf("%s/%d", r.topic, r.partition)] = true
	}
	if len(parts) != 8 {
		t.Errorf("messages landed in %d of 8 partitions", len(parts))
	}
}

// TestForwarderKafkaFailures: an event on a topic the broker does not have (auto-create off)
// is retried with backoff and dead-lettered at MaxAttempts; an event above the broker's
// max.message.bytes is permanent and dead-lettered at its first attempt; the oversized event's
// later events stay pending behind it; every other event
// is delivered once without a failed attempt (other keys unaffected), and nothing is marked
// published that Kafka did not acknowledge. With the topic's limit known (looked up, or
// configured as Producer.MaxMessageBytes) the oversized event is refused before sending and
// Kafka holds exactly the published events, in order. With the lookup off and the producer's
// limit above the broker's, Kafka refuses whole record batches and kgo fails the partition's
// later records with them: the refused events are sent again one by one, so still only the
// oversized one fails, and Kafka again holds exactly the published events, in order.
func TestForwarderKafkaFailures(t *testing.T) {
	for _, tc := range []struct {
		name       string
		clientMax  int // kafka.Config.MaxMessageBytes; 0 = the default (above the broker's)
		noLookup   bool
		tooLargeIs error
		exact      bool // Kafka holds exactly the published events
	}{
		{"topic-limit-looked-up", 0, false, kafka.ErrMessageTooLarge, true},
		{"client-limit", 8000, true, kafka.ErrMessageTooLarge, true},
		{"broker-refuses-batches", 0, true, kerr.MessageTooLarge, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := fwdNewEnv(t)
			const ok, missing = "fwd.kafka.ok", "fwd.kafka.missing"
			c := brokertest.Kafka(t, kfake.SeedTopics(2, ok))
			fwdKafkaTopicConfig(t, c, ok, "max.message.bytes", "8192")
			pad := strings.Repeat("x", 200)
			evs := e.seed(30, 10, func(int) string { return ok }) // positions 0..2 of each key
			big := e.add(ok, "key-03", map[string]any{"pad": strings.Repeat("y", 16*1024)})
			for range 17 {
				for k := range 10 {
					evs = append(evs, e.add(ok, fmt.Sprintf("key-%02d", k), map[string]any{"pad": pad}))
				}
			}
			var lost []*fwdEvent
			for range 3 {
				lost = append(lost, e.add(missing, "", nil))
			}
			pub, err := kafka.NewPublisher(kafka.Config{Brokers: c.ListenAddrs(), MaxMessageBytes: tc.clientMax, DisableTopicLimits: tc.noLookup,
				ClientOptions: []kgo.Opt{kgo.MetadataMinAge(50 * time.Millisecond)}}, nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = pub.Close() })
			e.run(e.subscriber(outbox.SubscriberConfig{}), pub, forwarder.Config{})

			delivered, behind := fwdSplit(evs, func(ev *fwdEvent) bool { return ev.key != "key-03" || ev.pos < 3 })
			e.waitSettled(60*time.Second, len(delivered), 4)
			e.checkMarkedOnce(fwdIDs(delivered))
			// Too large is permanent (dead letter at the first attempt); an unknown topic is an
			// ordinary failure (MaxAttempts).
			want := map[*fwdEvent]int{big: 1}
			for _, ev := range lost {
				want[ev] = 3
			}
			e.checkDeadAfter(want, tc.tooLargeIs)
			e.mu.Lock()
			if f := e.dead[big.id]; !errors.Is(f.Err, tc.tooLargeIs) || !errors.Is(f.Err, outbox.ErrPermanent) {
				t.Errorf("oversized event dead-lettered with %v, want %v", f.Err, tc.tooLargeIs)
			}
			for _, ev := range lost {
				if f := e.dead[ev.id]; !errors.Is(f.Err, kerr.UnknownTopicOrPartition) {
					t.Errorf("unknown-topic event dead-lettered with %v", f.Err)
				}
			}
			e.mu.Unlock()
			if n := e.count("published_at IS NULL AND dead_lettered_at IS NULL AND attempts = 0 AND ordering_key = 'key-03'"); n != len(behind) {
				t.Errorf("%d events of key-03 pending behind the dead letter, want %d", n, len(behind))
			}
			held := map[string]bool{}
			for _, ev := range behind {
				held[ev.id] = true
			}
			// Kafka holds every published event once, plus (lookup off) possibly some held ones.
			unheld := func(all []fwdReceived) (got []fwdReceived) {
				for _, r := range all {
					if !held[r.uuid] {
						got = append(got, r)
					}
				}
				return got
			}
			var col fwdCollector
			fwdKafkaConsume(t, c, &col, ok)
			pgtest.Eventually(t, 30*time.Second, "delivered events consumed", func() bool { return len(unheld(col.all())) >= len(delivered) })
			if tc.exact {
				e.checkReceived(col.all(), delivered, func(s string) string { return s })
				return
			}
			got := unheld(col.all())
			e.checkReceivedSet(got, delivered)
		})
	}
}
