package integration_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmamqp "github.com/ThreeDotsLabs/watermill-amqp/v2/pkg/amqp"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/forwarder"
	"github.com/watermill-outbox/outbox/forwarder/amqp"
	"github.com/watermill-outbox/outbox/internal/brokertest"
	"github.com/watermill-outbox/outbox/internal/pgtest"
)

// fwdAMQPChannel returns a channel on a fresh connection, both closed at the end of the test.
func fwdAMQPChannel(t testing.TB, url string) *amqp091.Channel {
	t.Helper()
	conn, err := amqp091.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	return ch
}

// fwdAMQPQueues declares durable queues named after topics and deletes them at the end.
func fwdAMQPQueues(t testing.TB, url string, names ...string) {
	t.Helper()
	ch := fwdAMQPChannel(t, url)
	for _, q := range names {
		if _, err := ch.QueueDeclare(q, true, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		ch := fwdAMQPChannel(t, url)
		for _, q := range names {
			_, _ = ch.QueueDelete(q, false, false, false)
		}
	})
}

func fwdAMQPPublisher(t testing.TB, cfg amqp.Config) *amqp.Publisher {
	t.Helper()
	pub, err := amqp.NewPublisher(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	return pub
}

// fwdAMQPQueue declares a fresh durable queue (deleted at the end of t) and returns its name, an
// amqp publisher with confirms (closed at the end of t) and a function that counts the
// messages the queue holds.
func fwdAMQPQueue(t testing.TB, url, prefix string) (queue string, pub *amqp.Publisher, held func() int) {
	t.Helper()
	queue = fwdName(prefix)
	fwdAMQPQueues(t, url, queue)
	pub = fwdAMQPPublisher(t, amqp.Config{URL: url})
	ch := fwdAMQPChannel(t, url)
	return queue, pub, func() int {
		q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		return q.Messages
	}
}

// fwdName returns a name unique to this test process.
func fwdName(prefix string) string {
	return fmt.Sprintf("%s-%d-%d", prefix, os.Getpid(), time.Now().UnixNano())
}

// TestForwarderRabbitMQ: 1,000 events over 50 keys through the default exchange to queues named
// after their topics, with confirms; the stock watermill-amqp subscriber reads them with id,
// payload, headers and topic intact and in per-key order; each event is marked once.
func TestForwarderRabbitMQ(t *testing.T) {
	url := brokertest.RequireRabbitMQ(t)
	e := fwdNewEnv(t)
	topics := []string{fwdName("fwd-amqp-a"), fwdName("fwd-amqp-b")}
	fwdAMQPQueues(t, url, topics...)
	evs := e.seed(1000, 50, func(k int) string { return topics[k%2] })

	var col fwdCollector
	sub, err := wmamqp.NewSubscriber(wmamqp.NewDurableQueueConfig(url), watermill.NopLogger{})
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
		go col.consume(topic, ch, nil)
	}

	e.run(e.subscriber(outbox.SubscriberConfig{}), fwdAMQPPublisher(t, amqp.Config{URL: url}), forwarder.Config{})
	e.waitSettled(60*time.Second, 1000, 0)
	pgtest.Eventually(t, 30*time.Second, "1000 messages consumed", func() bool { return col.len() >= 1000 })
	e.checkReceived(col.all(), evs, func(s string) string { return s })
	e.checkMarkedOnce(fwdIDs(evs))
}

// TestForwarderRabbitMQUnroutable: through a direct exchange, events whose routing key no queue
// is bound to come back as basic.return (mandatory): they are failures, retried with backoff
// and dead-lettered, never marked published; the routed keys are delivered in order, once.
// A missing exchange fails the same way (the broker closes the channel).
func TestForwarderRabbitMQUnroutable(t *testing.T) {
	url := brokertest.RequireRabbitMQ(t)
	e := fwdNewEnv(t)
	exchange, queue := fwdName("fwd-ex"), fwdName("fwd-q")
	okTopic, lostTopic := fwdName("fwd-ok"), fwdName("fwd-nowhere")
	ch := fwdAMQPChannel(t, url)
	if err := ch.ExchangeDeclare(exchange, "direct", false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(queue, false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(queue, okTopic, exchange, false, nil); err != nil {
		t.Fatal(err)
	}
	deliveries, err := ch.Consume(queue, "", true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	var col fwdCollector
	go func() {
		for d := range deliveries {
			msg, err := wmamqp.DefaultMarshaler{}.Unmarshal(d)
			if err != nil {
				t.Error(err)
				continue
			}
			col.add(fwdReceived{uuid: msg.UUID, topic: d.RoutingKey, payload: msg.Payload, metadata: msg.Metadata, partition: -1})
		}
	}()

	okEvs := e.seed(100, 10, func(int) string { return okTopic })
	lost := []*fwdEvent{e.add(lostTopic, "", nil), e.add(lostTopic, "", nil), e.add(lostTopic, "key-lost", nil)}
	behind := e.add(lostTopic, "key-lost", nil) // held behind its key's dead letter
	pub := fwdAMQPPublisher(t, amqp.Config{URL: url, Exchange: exchange})
	e.run(e.subscriber(outbox.SubscriberConfig{}), pub, forwarder.Config{})

	e.waitSettled(30*time.Second, len(okEvs), len(lost))
	e.checkDeadLettered(lost, 3, amqp.ErrUnroutable)
	e.checkMarkedOnce(fwdIDs(okEvs))
	if n := e.count(fmt.Sprintf("id = '%s' AND published_at IS NULL AND dead_lettered_at IS NULL AND attempts = 0", behind.id)); n != 1 {
		t.Errorf("event behind the dead letter not pending untouched")
	}
	pgtest.Eventually(t, 10*time.Second, "routed events consumed", func() bool { return col.len() >= len(okEvs) })
	e.checkReceived(col.all(), okEvs, func(s string) string { return s })

	// A missing exchange: the broker closes the channel; the publish fails, never "delivered".
	bad := fwdAMQPPublisher(t, amqp.Config{URL: url, Exchange: fwdName("fwd-no-such-exchange")})
	msg := outbox.NewMessage([]byte(`{}`))
	if err := bad.Publish(okTopic, msg); !errors.Is(err, amqp.ErrChannelClosed) {
		t.Errorf("publish through a missing exchange: %v, want ErrChannelClosed", err)
	}
	// The publisher recovers: the next publish opens a new channel.
	if err := pub.Publish(okTopic, outbox.NewMessage([]byte(`{}`))); err != nil {
		t.Errorf("publish after a failure: %v", err)
	}
}

// TestForwarderRabbitMQOwnConnection: a Connection passed in is used and not closed by Close.
func TestForwarderRabbitMQOwnConnection(t *testing.T) {
	url := brokertest.RequireRabbitMQ(t)
	q := fwdName("fwd-own")
	fwdAMQPQueues(t, url, q)
	conn, err := amqp091.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	pub, err := amqp.NewPublisher(amqp.Config{Connection: conn}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish(q, outbox.NewMessage([]byte(`{"a":1}`))); err != nil {
		t.Fatal(err)
	}
	if err := pub.Close(); err != nil {
		t.Fatal(err)
	}
	if conn.IsClosed() {
		t.Fatal("Close closed the caller's connection")
	}
	if err := pub.Publish(q, outbox.NewMessage([]byte(`{}`))); !errors.Is(err, amqp.ErrClosed) {
		t.Errorf("publish after Close: %v, want ErrClosed", err)
	}
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	d, ok, err := ch.Get(q, true)
	if err != nil || !ok || d.DeliveryMode != amqp091.Persistent || string(d.Body) != `{"a":1}` {
		t.Errorf("queued message: ok=%v err=%v mode=%d body=%s", ok, err, d.DeliveryMode, d.Body)
	}
}
