package amqp

import (
	"errors"
	"fmt"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
)

// DefaultMaxMessageBytes is Config.MaxMessageBytes' default: RabbitMQ 4's default
// max_message_size (16 MiB; RabbitMQ 3.8–3.13 default to 128 MiB).
const DefaultMaxMessageBytes = 16 << 20

// ErrUnsendable is matched (errors.Is) by every *UnsendableError.
var ErrUnsendable = errors.New("outbox amqp: message cannot be sent as it is")

// UnsendableError is the cause of a message refused before publishing because AMQP cannot
// carry it (see Publisher.PublishBatch): a header value of a type an AMQP field table cannot
// hold, a header name or short-string property longer than 255 bytes, a header frame larger
// than the connection's negotiated frame size, or a body above Config.MaxMessageBytes. Sent
// anyway, the broker or the client would close the whole connection (RabbitMQ answers an
// oversized frame with 501 FRAME_ERROR) or channel (406 for a body over max_message_size),
// failing the other messages in flight. It matches ErrUnsendable; the Publisher returns it
// inside an *outbox.PermanentError.
type UnsendableError struct {
	// Reason says what does not fit, e.g. "header frame of 140012 bytes exceeds the negotiated
	// frame size 131072".
	Reason string
}

// Error returns the reason.
func (e *UnsendableError) Error() string { return "outbox amqp: cannot send message: " + e.Reason }

// Is reports whether target is ErrUnsendable.
func (e *UnsendableError) Is(target error) bool { return target == ErrUnsendable }

// frameOverhead is a frame's type, channel and size fields and its frame-end octet (AMQP 0-9-1
// §2.3.5), counted by the broker against frame_max.
const frameOverhead = 1 + 2 + 4 + 1

// preflight returns an *UnsendableError when pub cannot be published with routing key rk on
// a connection whose negotiated frame size is frameMax (0: unlimited), or nil.
func preflight(pub *amqp091.Publishing, exchange, rk string, frameMax, maxBody int) error {
	bad := func(format string, args ...any) error { return &UnsendableError{Reason: fmt.Sprintf(format, args...)} }
	if err := pub.Headers.Validate(); err != nil {
		return bad("header %v", err)
	}
	for name, s := range map[string]string{"exchange": exchange, "routing key": rk, "content type": pub.ContentType,
		"content encoding": pub.ContentEncoding, "correlation id": pub.CorrelationId, "reply-to": pub.ReplyTo,
		"expiration": pub.Expiration, "message id": pub.MessageId, "type": pub.Type, "user id": pub.UserId, "app id": pub.AppId} {
		if len(s) > 255 {
			return bad("%s of %d bytes exceeds AMQP's 255-byte short string", name, len(s))
		}
	}
	if len(pub.Body) > maxBody {
		return bad("body of %d bytes exceeds Config.MaxMessageBytes %d", len(pub.Body), maxBody)
	}
	size, err := headerFrameSize(pub)
	if err != nil {
		return bad("%v", err)
	}
	if frameMax > 0 && size > frameMax {
		return bad("header frame of %d bytes (mostly headers) exceeds the negotiated frame size %d", size, frameMax)
	}
	return nil
}

// headerFrameSize is the encoded size of pub's content header frame, as amqp091 writes it
// (write.go, headerFrame.write), frame overhead included.
func headerFrameSize(pub *amqp091.Publishing) (int, error) {
	n := frameOverhead + 2 + 2 + 8 + 2 // class id, weight, body size, property flags
	for _, s := range []string{pub.ContentType, pub.ContentEncoding, pub.CorrelationId, pub.ReplyTo,
		pub.Expiration, pub.MessageId, pub.Type, pub.UserId, pub.AppId} {
		if s != "" {
			n += 1 + len(s)
		}
	}
	if pub.DeliveryMode > 0 {
		n++
	}
	if pub.Priority > 0 {
		n++
	}
	if !pub.Timestamp.IsZero() {
		n += 8
	}
	if len(pub.Headers) > 0 {
		t, err := tableSize(pub.Headers)
		if err != nil {
			return 0, err
		}
		n += t
	}
	return n, nil
}

// tableSize is the encoded size of a field table: its 4-byte length and each name (short
// string) and value.
func tableSize(t amqp091.Table) (int, error) {
	n := 4
	for k, v := range t {
		if len(k) > 255 {
			return 0, fmt.Errorf("header name of %d bytes exceeds AMQP's 255-byte short string", len(k))
		}
		f, err := fieldSize(v)
		if err != nil {
			return 0, fmt.Errorf("header %.40q: %w", k, err)
		}
		n += 1 + len(k) + f
	}
	return n, nil
}

// fieldSize is the encoded size of one field value, type octet included (amqp091 writeField).
func fieldSize(v any) (int, error) {
	switch v := v.(type) {
	case nil:
		return 1, nil
	case bool, byte, int8:
		return 2, nil
	case int16, uint16:
		return 3, nil
	case int, int32, uint32, float32:
		return 5, nil
	case amqp091.Decimal:
		return 6, nil
	case int64, float64, time.Time:
		return 9, nil
	case string:
		return 5 + len(v), nil
	case []byte:
		return 5 + len(v), nil
	case []any:
		n := 5
		for _, e := range v {
			f, err := fieldSize(e)
			if err != nil {
				return 0, err
			}
			n += f
		}
		return n, nil
	case amqp091.Table:
		t, err := tableSize(v)
		return 1 + t, err
	}
	return 0, fmt.Errorf("value %T not supported", v)
}
