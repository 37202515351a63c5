package forwarder

import (
	"context"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-outbox/outbox"
)

// Outgoing is one message of a batch for a BatchPublisher: the destination topic and the
// message (event id as UUID, payload, headers plus outbox-* metadata).
type Outgoing struct {
	Topic   string
	Message *message.Message
}

// BatchPublisher is a destination that takes many messages per call: the Forwarder hands it
// each claimed batch whole instead of one message per round trip.
//
// PublishBatch publishes batch and returns one result per message, in the same order (a
// shorter slice fails the missing ones with ErrMissingResult): nil only when the broker
// acknowledged that message, so that only acknowledged events are marked published. It must
// publish the messages of one ordering key (metadata outbox-ordering-key) in slice order, and
// when it knows before sending that a message fails, not send that key's later messages of the
// batch (result ErrHeldBack). Results must be final when it returns. ctx bounds the whole call:
// the Forwarder's ctx ends when it stops or when the batch's DeliveryTimeout (of the outbox
// Subscriber) passes. Implementations must be safe for concurrent use (one call per
// subscription runs at a time).
type BatchPublisher interface {
	message.Publisher
	PublishBatch(ctx context.Context, batch []Outgoing) []error
}

// PublishViaBatch implements message.Publisher's Publish for a destination that has
// PublishBatch: it sends msgs to topic as one batch (with the first message's context) and
// returns nil when every message succeeded, otherwise the per-message errors joined
// (errors.Join), each naming its message UUID. No messages is a no-op.
func PublishViaBatch(publishBatch func(ctx context.Context, batch []Outgoing) []error, topic string, msgs ...*message.Message) error {
	if len(msgs) == 0 {
		return nil
	}
	batch := make([]Outgoing, len(msgs))
	for i, m := range msgs {
		batch[i] = Outgoing{Topic: topic, Message: m}
	}
	var errs []error
	for i, err := range publishBatch(msgs[0].Context(), batch) {
		if err != nil {
			errs = append(errs, fmt.Errorf("message %s: %w", msgs[i].UUID, err))
		}
	}
	return errors.Join(errs...)
}

// Handler returns the forwarding handler, for adding to your own Watermill router with your own
// middlewares:
//
//	router.AddMiddleware(outbox.RecordError, myMiddlewares...) // RecordError outermost
//	router.AddConsumerHandler("relay", "*", outboxSubscriber, forwarder.Handler(pub, forwarder.Config{}))
//
// For each outbox message it publishes a copy (same UUID, payload and metadata, the message's
// context) to pub on the event's topic, or on cfg.Topic's mapping of it, and returns nil once
// pub.Publish returned nil; otherwise a *PublishError, which the router turns into a Nack: the
// event is retried with the outbox's backoff and dead-lettered at MaxAttempts. It records the
// error with outbox.SetNackError itself; outbox.RecordError, when outermost, records the final
// error after your middlewares. Do not add Watermill's Retry middleware. Only cfg.Topic is
// used from cfg. The handler is safe for concurrent use if pub and cfg.Topic are.
func Handler(pub message.Publisher, cfg Config) message.NoPublishHandlerFunc {
	return func(msg *message.Message) error {
		topic, out, err := prepare(cfg.Topic, msg)
		if err == nil {
			if perr := pub.Publish(topic, out); perr != nil {
				err = &PublishError{EventID: msg.UUID, Topic: topic, Err: perr}
			}
		}
		if err != nil {
			outbox.SetNackError(msg, err)
		}
		return err
	}
}

// prepare returns the destination topic and the message to publish for an outbox message.
func prepare(mapTopic func(string, *message.Message) string, msg *message.Message) (string, *message.Message, error) {
	topic := sourceTopic(msg)
	if topic != "" && mapTopic != nil {
		topic = mapTopic(topic, msg)
	}
	if topic == "" {
		return "", nil, &PublishError{EventID: msg.UUID, Topic: topic, Err: ErrNoTopic}
	}
	out := message.NewMessage(msg.UUID, msg.Payload)
	out.Metadata = make(message.Metadata, len(msg.Metadata))
	for k, v := range msg.Metadata {
		out.Metadata[k] = v
	}
	out.SetContext(msg.Context())
	return topic, out, nil
}

// sourceTopic is the outbox topic of msg: its outbox-topic metadata, or its Event's topic.
func sourceTopic(msg *message.Message) string {
	if t := msg.Metadata.Get(outbox.MetadataTopic); t != "" {
		return t
	}
	if ev, ok := outbox.EventFromContext(msg.Context()); ok {
		return ev.Topic
	}
	return ""
}

type topicKey struct{}

// ContextWithTopic returns ctx carrying the destination topic, as Func passes it to its
// function.
func ContextWithTopic(ctx context.Context, topic string) context.Context {
	return context.WithValue(ctx, topicKey{}, topic)
}

// TopicFromContext returns the destination topic that Func (or ContextWithTopic) put in ctx,
// and false when there is none.
func TopicFromContext(ctx context.Context) (string, bool) {
	t, ok := ctx.Value(topicKey{}).(string)
	return t, ok
}

// Func is a destination that is a plain Go function: Publish calls it once per message, with
// the message's context carrying the destination topic (TopicFromContext). A nil return means
// delivered; an error fails the message (retry with backoff, then dead letter), unless it is
// outbox.Unavailable(err) (no attempt counted, the destination paused) or
// outbox.Permanent(err) (dead letter at once). The function
// must be safe for concurrent use: the Forwarder calls it for different ordering keys at once.
type Func func(ctx context.Context, msg *message.Message) error

// Publish calls f for each message in order and returns the first error unchanged (the
// Forwarder wraps it in a *PublishError); the later messages are not passed to f. A nil f
// panics.
func (f Func) Publish(topic string, msgs ...*message.Message) error {
	for _, msg := range msgs {
		if err := f(ContextWithTopic(msg.Context(), topic), msg); err != nil {
			return err
		}
	}
	return nil
}

// Close does nothing and returns nil.
func (f Func) Close() error { return nil }
