package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	wmamqp "github.com/ThreeDotsLabs/watermill-amqp/v2/pkg/amqp"
	wmkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	wmredis "github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"

	"github.com/watermill-outbox/outbox/webhook"
)

// loopback are the ranges the demo's webhook publisher may reach for the built-in receiver.
var loopback = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}

// demoSink is where the demo's relay delivers, and how the demo learns what arrived.
type demoSink struct {
	// name describes the sink in the report.
	name string
	// pub is the relay's destination.
	pub message.Publisher
	// fixedTopic, when set, is the destination topic of every event (queue, stream, Kafka topic).
	fixedTopic string
	// receiver is true for the built-in signature-checking HTTP receiver.
	receiver bool

	closeOnce sync.Once
	closers   []func()
}

// answeredPublisher counts each message its webhook publisher delivered (a 2xx answer) as an
// arrival, in the order the relay delivered them: the demo cannot read an external webhook
// back.
type answeredPublisher struct {
	message.Publisher
	tr *tracker
}

// Publish publishes msgs and records those that were delivered.
func (p answeredPublisher) Publish(topic string, msgs ...*message.Message) error {
	err := p.Publisher.Publish(topic, msgs...)
	delivered := msgs
	if err != nil {
		delivered = nil
		// The webhook publisher stops at the first failure: the messages before it were delivered.
		var de *webhook.DeliveryError
		if errors.As(err, &de) && de.Index >= 0 && de.Index <= len(msgs) {
			delivered = msgs[:de.Index]
		}
	}
	for _, m := range delivered {
		p.tr.receive(m.UUID, m.Payload, time.Now())
	}
	return err
}

// close stops the consumers and the publisher and removes what the demo created, in reverse
// order of creation. Idempotent.
func (s *demoSink) close() {
	s.closeOnce.Do(func() {
		for i := len(s.closers) - 1; i >= 0; i-- {
			s.closers[i]()
		}
	})
}

// startReceiver starts the built-in HTTP receiver on a loopback port: it verifies each
// request's Outbox-Signature with webhook.VerifyMiddleware (401 when it does not verify),
// refuses a fraction failRate with 500 on purpose (an ordinary failure: a 503 would be an unavailable receiver, which pauses the topic instead), and records the rest.
func startReceiver(tr *tracker, failRate float64) (*demoSink, error) {
	secret := randomHex(32)
	s := &demoSink{receiver: true}
	inner := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tr.verified.Add(1)
		if failRate > 0 && rand.Float64() < failRate {
			tr.refused.Add(1)
			http.Error(w, "refused on purpose by the outbox demo", http.StatusInternalServerError)
			return
		}
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, "read error", http.StatusBadRequest)
			return
		}
		tr.receive(r.Header.Get(webhook.HeaderEventID), body, time.Now())
		w.WriteHeader(http.StatusNoContent)
	})
	h, err := webhook.VerifyMiddleware(inner, webhook.VerifyOptions{
		Keys:     [][]byte{[]byte(secret)},
		OnReject: func(*http.Request, error) { tr.rejected.Add(1) },
	})
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("starting the demo's HTTP receiver on 127.0.0.1: %v", err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	s.closers = append(s.closers, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	})
	url := "http://" + ln.Addr().String() + "/events"
	pub, err := webhook.NewPublisher(webhook.Config{URL: url, Secret: secret, AllowedPrefixes: loopback}, nil)
	if err != nil {
		s.close()
		return nil, err
	}
	s.pub = pub
	s.closers = append(s.closers, func() { _ = pub.Close() })
	s.name = "signed webhook to " + url + " (receiver verifies HMAC-SHA256)"
	return s, nil
}

// startBrokerSink connects the demo to --to: a publisher for the relay and, for brokers, the
// broker's stock Watermill subscriber reading topic back.
func startBrokerSink(ctx context.Context, dest destURL, topic string, f demoFlags, tr *tracker, logger watermill.LoggerAdapter) (_ *demoSink, err error) {
	s := &demoSink{name: dest.kind.String() + " at " + dest.shown}
	defer func() {
		if err != nil {
			s.close() // what was set up before the failure
		}
	}()
	consume := func(sub message.Subscriber) error {
		cctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		msgs, err := sub.Subscribe(cctx, topic)
		if err != nil {
			cancel()
			_ = sub.Close()
			return fmt.Errorf("subscribing to %s on %s: %s", topic, dest.shown, oneLine(err.Error()))
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			for msg := range msgs {
				tr.receive(msg.UUID, msg.Payload, time.Now())
				msg.Ack()
			}
		}()
		s.closers = append(s.closers, func() {
			cancel()
			_ = sub.Close()
			select {
			case <-done:
			case <-time.After(5 * time.Second):
			}
		})
		return nil
	}
	switch dest.kind {
	case destHTTP:
		allow, err := parsePrefixes(f.allow)
		if err != nil {
			return nil, err
		}
		secret := f.secret
		if secret == "" {
			secret = randomHex(32)
		}
		pub, err := openPublisher(ctx, dest, destOptions{secret: secret, allow: allow}, logger)
		if err != nil {
			return nil, err
		}
		s.pub = answeredPublisher{Publisher: pub, tr: tr}
		s.closers = append(s.closers, func() { _ = pub.Close() })
		s.name = "webhook " + dest.shown + " (counted from its 2xx answers to the relay)"
		return s, nil
	case destKafka:
		if err := createKafkaTopic(dest, topic); err != nil {
			return nil, err
		}
		s.closers = append(s.closers, func() { deleteKafkaTopic(dest.brokers, topic) })
		pub, err := openPublisher(ctx, dest, destOptions{}, logger)
		if err != nil {
			return nil, err
		}
		s.closers = append(s.closers, func() { _ = pub.Close() })
		sc := wmkafka.DefaultSaramaSubscriberConfig()
		sc.Consumer.Offsets.Initial = sarama.OffsetOldest
		sub, err := wmkafka.NewSubscriber(wmkafka.SubscriberConfig{
			Brokers: dest.brokers, Unmarshaler: wmkafka.DefaultMarshaler{}, OverwriteSaramaConfig: sc, ConsumerGroup: topic,
		}, logger)
		if err != nil {
			return nil, fmt.Errorf("kafka consumer at %s: %s", dest.shown, oneLine(err.Error()))
		}
		if err := consume(sub); err != nil {
			return nil, err
		}
		s.pub = pub
	case destAMQP:
		// The consumer first: it declares the durable queue named after the topic, which the
		// relay's mandatory messages reach through the default exchange.
		sub, err := wmamqp.NewSubscriber(wmamqp.NewDurableQueueConfig(dest.raw), logger)
		if err != nil {
			return nil, fmt.Errorf("cannot connect to RabbitMQ at %s (%s): check that it runs and that --to %s is right", hostOf(dest.raw), oneLine(err.Error()), dest.shown)
		}
		s.closers = append(s.closers, func() { deleteAMQPQueue(dest.raw, topic) })
		if err := consume(sub); err != nil {
			return nil, err
		}
		pub, err := openPublisher(ctx, dest, destOptions{}, logger)
		if err != nil {
			return nil, err
		}
		s.closers = append(s.closers, func() { _ = pub.Close() })
		s.pub = pub
	case destRedis:
		pub, err := openPublisher(ctx, dest, destOptions{probe: true}, logger)
		if err != nil {
			return nil, err
		}
		s.closers = append(s.closers, func() {
			_ = pub.Close()
			admin := redis.NewClient(dest.redis)
			_ = admin.Del(context.Background(), topic).Err()
			_ = admin.Close()
		})
		sub, err := wmredis.NewSubscriber(wmredis.SubscriberConfig{
			Client: redis.NewClient(dest.redis), ConsumerGroup: "outbox-demo", OldestId: "0", DisableIndefiniteInitialBlock: true,
		}, logger)
		if err != nil {
			return nil, err
		}
		if err := consume(sub); err != nil {
			return nil, err
		}
		s.pub = pub
	default:
		return nil, fmt.Errorf("unsupported sink %s", dest.shown)
	}
	s.fixedTopic = topic
	s.name += " (topic " + topic + ", read back with the stock Watermill subscriber)"
	return s, nil
}

// String names the destination kind.
func (k destKind) String() string { return string(k) }

// kafkaAdminConfig is the Sarama configuration of the demo's topic administration.
func kafkaAdminConfig() *sarama.Config {
	c := sarama.NewConfig()
	c.Version = sarama.V2_1_0_0
	c.Admin.Timeout = 10 * time.Second
	return c
}

// createKafkaTopic creates the demo's topic with 4 partitions.
func createKafkaTopic(dest destURL, topic string) error {
	admin, err := sarama.NewClusterAdmin(dest.brokers, kafkaAdminConfig())
	if err != nil {
		return kafkaConnectError(dest, err)
	}
	defer admin.Close()
	err = admin.CreateTopic(topic, &sarama.TopicDetail{NumPartitions: 4, ReplicationFactor: 1}, false)
	if err != nil && !errors.Is(err, sarama.ErrTopicAlreadyExists) {
		var te *sarama.TopicError
		if !errors.As(err, &te) || te.Err != sarama.ErrTopicAlreadyExists {
			return fmt.Errorf("creating Kafka topic %s: %s", topic, oneLine(err.Error()))
		}
	}
	return nil
}

// deleteKafkaTopic removes the demo's topic, best effort.
func deleteKafkaTopic(brokers []string, topic string) {
	admin, err := sarama.NewClusterAdmin(brokers, kafkaAdminConfig())
	if err != nil {
		return
	}
	_ = admin.DeleteTopic(topic)
	_ = admin.Close()
}

// deleteAMQPQueue removes the demo's queue, best effort.
func deleteAMQPQueue(url, queue string) {
	conn, err := amqp091.Dial(url)
	if err != nil {
		return
	}
	defer conn.Close()
	if ch, err := conn.Channel(); err == nil {
		_, _ = ch.QueueDelete(queue, false, false, false)
	}
}
