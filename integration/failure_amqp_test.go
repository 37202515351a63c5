package integration_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmamqp "github.com/ThreeDotsLabs/watermill-amqp/v2/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/forwarder"
	"github.com/watermill-outbox/outbox/forwarder/amqp"
	"github.com/watermill-outbox/outbox/internal/brokertest"
	"github.com/watermill-outbox/outbox/internal/pgtest"
)

// fwdTypedMarshaler is watermill-amqp's DefaultMarshaler that turns the header "untypable"
// into a value no AMQP field type holds (a custom marshaler's mistake).
type fwdTypedMarshaler struct{ wmamqp.DefaultMarshaler }

func (m fwdTypedMarshaler) Marshal(msg *message.Message) (amqp091.Publishing, error) {
	pub, err := m.DefaultMarshaler.Marshal(msg)
	if _, ok := pub.Headers["untypable"]; ok {
		pub.Headers["untypable"] = struct{}{}
	}
	return pub, err
}

// TestRabbitMQBadHeaderFailsAlone: in batches on one channel, an event whose header table is
// larger than the negotiated frame size, one with a header name over 255 bytes and one with an
// untypable header value are each refused before publishing and dead-lettered at their first
// attempt (permanent); their keys' later events stay pending without an attempt; every other
// event of the batches is confirmed at its first attempt and is in the queue exactly once, in
// per-key order — sent, the oversized frame would have made RabbitMQ close the connection under
// all of them.
func TestRabbitMQBadHeaderFailsAlone(t *testing.T) {
	url := brokertest.RequireRabbitMQ(t)
	e := fwdNewEnv(t)
	q := fwdName("fwd-amqp-bad-header")
	fwdAMQPQueues(t, url, q)
	var good, bad, behind []*fwdEvent
	good = append(good, e.seed(40, 8, func(int) string { return q })...)
	for _, h := range []map[string]string{
		{"pad": strings.Repeat("x", 200_000)},
		{strings.Repeat("n", 300): "v"},
		{"untypable": "1"},
	} {
		key := fwdName("key-bad")
		good = append(good, e.addWithHeaders(q, key, nil))
		bad = append(bad, e.addWithHeaders(q, key, h))
		behind = append(behind, e.addWithHeaders(q, key, nil))
	}
	good = append(good, e.seed(40, 8, func(int) string { return q })...)
	pub := fwdAMQPPublisher(t, amqp.Config{URL: url, Marshaler: fwdTypedMarshaler{}, Channels: 1})
	e.run(e.subscriber(outbox.SubscriberConfig{}), pub, forwarder.Config{})

	e.waitSettled(30*time.Second, len(good), len(bad))
	e.checkDeadAtFirstAttempt(bad, amqp.ErrUnsendable)
	e.checkMarkedOnce(fwdIDs(good))
	e.checkUntouched(behind)

	// Nothing is in flight any more: the queue holds exactly what the broker took.
	st, err := fwdAMQPChannel(t, url).QueueDeclarePassive(q, true, false, false, false, nil)
	if err != nil || st.Messages != len(good) {
		t.Fatalf("queue holds %d messages (%v), want %d", st.Messages, err, len(good))
	}
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
	ch, err := sub.Subscribe(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	go col.consume(q, ch, nil)
	pgtest.Eventually(t, 30*time.Second, "the good events consumed", func() bool { return col.len() >= len(good) })
	// Exactly once each, in per-key order, at attempt 1 (confirmed the first time); no event
	// after a refused one of its key.
	e.checkReceived(col.all(), good, func(s string) string { return s })
	var ids []string
	for _, r := range col.all() {
		ids = append(ids, r.uuid)
	}
	checkWireOrder(t, ids, bad, e.events)
}
