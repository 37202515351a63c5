// Package kafkakey gives inbox.Config.Key for messages consumed with watermill-kafka: the
// record's position "topic/partition/offset", which a redelivery of the same record repeats
// even when the producer gave the message no stable id.
//
// A record produced twice (a producer retry, an outbox relay redelivering an event) has two
// positions and so two keys: for those, key by the event id instead (inbox.KeyFromMetadata
// with "outbox-event-id", or the default msg.UUID, which the outbox sets to the event id).
package kafkakey

import (
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
)

// ErrNoPosition is returned by Key for a message whose context lacks the topic (set by the
// Watermill router), the partition or the offset (set by watermill-kafka's subscriber).
var ErrNoPosition = errors.New("kafkakey: message context has no Kafka topic, partition and offset")

// Key returns "topic/partition/offset" of a message a Watermill router received from
// watermill-kafka's subscriber. Errors: ErrNoPosition.
func Key(msg *message.Message) (string, error) {
	ctx := msg.Context()
	topic := message.SubscribeTopicFromCtx(ctx)
	partition, okP := kafka.MessagePartitionFromCtx(ctx)
	offset, okO := kafka.MessagePartitionOffsetFromCtx(ctx)
	if topic == "" || !okP || !okO {
		return "", ErrNoPosition
	}
	return fmt.Sprintf("%s/%d/%d", topic, partition, offset), nil
}
