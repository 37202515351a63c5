package outbox

import (
	"encoding/json"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
)

// row is one validated event ready for the INSERT.
type row struct {
	id      uuid.UUID
	topic   string
	payload []byte
	headers []byte
	okey    *string
	ikey    *string
	extra   map[string]any
}

func (p *Publisher) rowFromMessage(i int, topic string, msg *message.Message) (row, error) {
	r := row{topic: topic}
	if msg == nil {
		return r, &ValidationError{Index: i, Field: "message", Reason: "nil message"}
	}
	if msg.UUID != "" {
		id, err := uuid.Parse(msg.UUID)
		if err != nil {
			return r, &ValidationError{Index: i, Field: "uuid", Reason: fmt.Sprintf("%q is not a UUID (use outbox.NewMessage or watermill.NewUUID)", msg.UUID)}
		}
		r.id = id
	}
	okey := msg.Metadata.Get(MetadataOrderingKey)
	if okey == "" && p.cfg.OrderingKey != nil {
		okey = p.cfg.OrderingKey(topic, msg)
	}
	ikey := msg.Metadata.Get(MetadataIdempotencyKey)
	if ikey == "" && p.cfg.IdempotencyKey != nil {
		ikey = p.cfg.IdempotencyKey(topic, msg)
	}
	var headers map[string]string
	for k, v := range msg.Metadata {
		if isReservedMetadata(k) {
			continue
		}
		if headers == nil {
			headers = make(map[string]string, len(msg.Metadata))
		}
		headers[k] = v
	}
	return p.finishRow(i, r, msg.Payload, p.injectHeaders(msg.Context(), headers), okey, ikey, extraColumnsOf(msg))
}

func (p *Publisher) rowFromInput(i int, in EventInput) (row, error) {
	r := row{id: in.ID, topic: in.Topic}
	var payload []byte
	raw, isBytes := in.Payload.([]byte)
	if p.s.cfg.PayloadType == PayloadBytea && isBytes {
		payload = raw
	} else {
		b, err := EncodePayload(in.Payload)
		if err != nil {
			return r, &ValidationError{Index: i, Field: "payload", Reason: err.Error()}
		}
		payload = b
	}
	return p.finishRow(i, r, payload, in.Headers, in.OrderingKey, in.IdempotencyKey, in.ExtraColumns)
}

// finishRow runs the validation checks and encodes headers.
func (p *Publisher) finishRow(i int, r row, payload []byte, headers map[string]string, okey, ikey string, extra map[string]any) (row, error) {
	if r.topic == "" {
		return r, &ValidationError{Index: i, Field: "topic", Reason: "empty"}
	}
	if reason := checkText(r.topic); reason != "" {
		return r, &ValidationError{Index: i, Field: "topic", Reason: reason}
	}
	if okey != "" {
		if reason := checkText(okey); reason != "" {
			return r, &ValidationError{Index: i, Field: "ordering_key", Reason: reason}
		}
		r.okey = &okey
	}
	if ikey != "" {
		if reason := checkText(ikey); reason != "" {
			return r, &ValidationError{Index: i, Field: "idempotency_key", Reason: reason}
		}
		r.ikey = &ikey
	}
	if p.s.cfg.PayloadType.isJSON() {
		if reason := ValidatePayload(payload); reason != "" {
			return r, &ValidationError{Index: i, Field: "payload", Reason: reason}
		}
		if max := p.s.caps.MaxJSONDepth; max > 0 && jsonDepth(payload) > max {
			return r, &ValidationError{Index: i, Field: "payload", Reason: fmt.Sprintf("nested deeper than %d levels, which %s refuses", max, p.s.caps.JSONDepthRule)}
		}
	} else if payload == nil {
		payload = []byte{}
	}
	r.payload = payload
	for k := range headers {
		if isReservedMetadata(k) {
			// The relay sets the reserved keys from the columns; stored (EventInput.Headers,
			// InjectHeaders) they were emitted as if the event had that ordering key, table …
			// They are dropped, as Publish drops them from a message's metadata. The caller's
			// map is not modified.
			kept := make(map[string]string, len(headers))
			for k, v := range headers {
				if !isReservedMetadata(k) {
					kept[k] = v
				}
			}
			headers = kept
			break
		}
	}
	for k, v := range headers {
		if k == "" {
			return r, &ValidationError{Index: i, Field: "headers", Reason: "empty header name"}
		}
		if reason := checkHeaderName(k); reason != "" {
			return r, &ValidationError{Index: i, Field: "headers", Reason: fmt.Sprintf("name %q: %s", k, reason)}
		}
		if reason := checkHeader(v); reason != "" {
			return r, &ValidationError{Index: i, Field: "headers", Reason: fmt.Sprintf("value of %q: %s", k, reason)}
		}
	}
	if len(headers) == 0 {
		r.headers = []byte("{}")
	} else {
		b, err := json.Marshal(headers)
		if err != nil {
			return r, &ValidationError{Index: i, Field: "headers", Reason: err.Error()}
		}
		r.headers = b
	}
	for name := range extra {
		switch {
		case isRelayOwned(name):
			return r, &ValidationError{Index: i, Field: "extra_columns", Reason: fmt.Sprintf("column %q is written by the relay or the database", name)}
		case !p.s.extra[name]:
			return r, &ValidationError{Index: i, Field: "extra_columns", Reason: fmt.Sprintf("unknown column %q (declare it in SchemaConfig.ExtraColumns)", name)}
		}
	}
	if err := p.s.checkScope(i, r.ikey, extra); err != nil {
		return r, err
	}
	r.extra = extra
	if r.id == uuid.Nil {
		id, err := uuid.NewV7()
		if err != nil {
			return r, fmt.Errorf("outbox: new UUIDv7: %w", err)
		}
		r.id = id
	}
	return r, nil
}
