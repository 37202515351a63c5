package outbox

import (
	"context"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
)

// Reserved metadata keys. The publisher stores the ordering and idempotency keys in their own
// columns and drops every reserved key from the stored headers; the subscriber sets them on the
// messages it emits.
const (
	// MetadataOrderingKey carries the ordering key (SetOrderingKey; set on emitted messages).
	MetadataOrderingKey = "outbox-ordering-key"
	// MetadataIdempotencyKey carries the idempotency key (SetIdempotencyKey).
	MetadataIdempotencyKey = "outbox-idempotency-key"
	// MetadataEventID is set on emitted messages to the event id (also msg.UUID).
	MetadataEventID = "outbox-event-id"
	// MetadataTopic is set on emitted messages to the event's topic.
	MetadataTopic = "outbox-topic"
	// MetadataSequence is set on emitted messages to the event's sequence (decimal).
	MetadataSequence = "outbox-sequence"
	// MetadataAttempt is set on emitted messages to the delivery number, 1 for the first:
	// failed attempts plus the deliveries started since the last one, so a delivery repeated
	// after a relay crash or a lease expiry carries a higher number than the try before it
	// (an event released without an attempt — unavailable destination, held back — keeps its
	// number, since that try reached nobody).
	MetadataAttempt = "outbox-attempt"
)

var reservedMetadata = []string{MetadataOrderingKey, MetadataIdempotencyKey, MetadataEventID,
	MetadataTopic, MetadataSequence, MetadataAttempt, MetadataTable, MetadataReplayOf, MetadataReplayID}

func isReservedMetadata(k string) bool {
	for _, r := range reservedMetadata {
		if k == r {
			return true
		}
	}
	return false
}

// SetOrderingKey sets msg's ordering key: events of one key are delivered strictly in sequence
// order; an empty key means unordered. At most MaxTextLength characters (checked on publish).
func SetOrderingKey(msg *message.Message, key string) {
	msg.Metadata.Set(MetadataOrderingKey, key)
}

// SetIdempotencyKey sets msg's idempotency key: at most one event per key is ever stored.
// An empty key means none. At most MaxTextLength characters (checked on publish).
func SetIdempotencyKey(msg *message.Message, key string) {
	msg.Metadata.Set(MetadataIdempotencyKey, key)
}

type extraColumnsKey struct{}

// SetExtraColumns attaches values for user columns (SchemaConfig.ExtraColumns) to msg, through
// msg's context. Values are JSON-encoded with EncodePayload's rules and converted by PostgreSQL
// to the column type (a UUID or timestamp as text, a number as a number). Columns named by no
// message of a Publish call keep their DEFAULT; a message of the call that lacks a column
// named by another stores NULL there.
func SetExtraColumns(msg *message.Message, cols map[string]any) {
	msg.SetContext(context.WithValue(msg.Context(), extraColumnsKey{}, cols))
}

func extraColumnsOf(msg *message.Message) map[string]any {
	m, _ := msg.Context().Value(extraColumnsKey{}).(map[string]any)
	return m
}

// NewMessage returns a Watermill message whose UUID is a fresh UUIDv7 (RFC 9562 §5.7:
// time-ordered, so ids sort roughly by creation time). It panics only if the system's random
// source fails, as uuid.Must does.
func NewMessage(payload message.Payload) *message.Message {
	return message.NewMessage(uuid.Must(uuid.NewV7()).String(), payload)
}

// Event is one row of the outbox table. Publishing returns the stored columns it knows (Sequence,
// ID, Topic, OrderingKey, IdempotencyKey, CreatedAt, Duplicate); the subscriber fills every
// column (Payload, Headers, Attempts …) and puts the Event in each emitted message's context
// (EventFromContext).
type Event struct {
	// Sequence is the database-assigned delivery order (gaps are normal).
	Sequence int64
	// ID is the event id (the Watermill message UUID).
	ID    uuid.UUID
	Topic string
	// Payload is the stored payload bytes (JSON text for JSONB tables).
	Payload []byte
	// Headers are the stored metadata, without reserved keys.
	Headers map[string]string
	// OrderingKey and IdempotencyKey are "" when NULL.
	OrderingKey    string
	IdempotencyKey string
	// CreatedAt is when the event was written (the writing transaction's start, database clock).
	CreatedAt time.Time
	// Attempts counts failed deliveries before this one.
	Attempts int
	// LastError is the error of the last failed delivery, "" if none.
	LastError string
	// DeliveryStarts counts the deliveries started since the event's last recorded outcome
	// (ack, failure, release), this one included: above 1 when a relay stopped or lost its
	// lease while delivering it (see SubscriberConfig.MaxDeliveryStarts).
	DeliveryStarts int
	// Extra holds the SchemaConfig.ExtraColumns values read by the subscriber, by column name
	// (as the driver returns them).
	Extra map[string]any
	// Duplicate is true in a publish result when the idempotency key already existed: the
	// returned columns are the stored event's and nothing was written.
	Duplicate bool
}

type eventKey struct{}

// EventFromContext returns the full Event of a message emitted by the Subscriber
// (msg.Context()), and false for any other context.
func EventFromContext(ctx context.Context) (*Event, bool) {
	e, ok := ctx.Value(eventKey{}).(*Event)
	return e, ok
}

// eventContext is the context of an emitted message: it carries the event (EventFromContext)
// and the error holder of its Nack (SetNackError) in one value instead of two
// context.WithValue layers (a relay builds one per message).
type eventContext struct {
	context.Context
	ev   *Event
	hold *errHolder
}

// Value implements context.Context.
func (c *eventContext) Value(key any) any {
	switch key.(type) {
	case eventKey:
		return c.ev
	case errHolderKey:
		return c.hold
	}
	return c.Context.Value(key)
}

// EventInput is an event to write with Publisher.Enqueue or EnqueueMany.
type EventInput struct {
	// ID is the event id; the zero UUID gets a fresh UUIDv7 (RFC 9562).
	ID uuid.UUID
	// Topic is required, at most MaxTextLength characters.
	Topic string
	// Payload is encoded with EncodePayload (the package's JSON rules). For a BYTEA table a
	// []byte is stored verbatim.
	Payload any
	// Headers become the event's metadata. Names must be non-empty.
	Headers map[string]string
	// OrderingKey and IdempotencyKey: "" means none.
	OrderingKey    string
	IdempotencyKey string
	// ExtraColumns fills SchemaConfig.ExtraColumns (see SetExtraColumns for the encoding).
	ExtraColumns map[string]any
}
