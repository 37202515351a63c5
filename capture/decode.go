package capture

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// Change is a captured row change as a Go value: the envelope of an event written by the
// capture triggers (see the package doc, "Envelope").
type Change struct {
	// Table is the captured table, schema-qualified ("public.loan"; "main.loan" on SQLite).
	Table string
	// Operation is Inserted, Updated, Deleted or Truncated.
	Operation Operation
	// PK is the row's key: the key column's value, an object of the key columns for a
	// composite key, null without a key or for a truncate.
	PK json.RawMessage
	// Changed lists the carried columns whose value changed (UPDATE), or all carried columns
	// (INSERT, DELETE).
	Changed []string
	// Before and After are the row images the Payload mode carries (nil when absent, the JSON
	// null when null).
	Before, After json.RawMessage
	// OccurredAt is the writing transaction's start time (PostgreSQL now()) or the statement's
	// time (SQLite), in UTC.
	OccurredAt time.Time
	// Extra holds the envelope's other keys (extensions).
	Extra map[string]json.RawMessage
}

// ErrNotCapture is returned (wrapped) by Decode for a payload that is not a capture envelope.
var ErrNotCapture = errors.New("capture: not a capture envelope")

// Decode reads the envelope of msg's payload. Errors wrap ErrNotCapture.
func Decode(msg *message.Message) (Change, error) {
	if msg == nil {
		return Change{}, fmt.Errorf("%w: nil message", ErrNotCapture)
	}
	return DecodePayload(msg.Payload)
}

// DecodePayload is Decode of a raw payload.
func DecodePayload(payload []byte) (Change, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(payload, &raw); err != nil {
		return Change{}, fmt.Errorf("%w: %v", ErrNotCapture, err)
	}
	var ch Change
	if err := json.Unmarshal(raw["table"], &ch.Table); err != nil || ch.Table == "" {
		return Change{}, fmt.Errorf("%w: no \"table\"", ErrNotCapture)
	}
	if err := json.Unmarshal(raw["operation"], &ch.Operation); err != nil {
		return Change{}, fmt.Errorf("%w: no \"operation\"", ErrNotCapture)
	}
	switch ch.Operation {
	case Inserted, Updated, Deleted, Truncated:
	default:
		return Change{}, fmt.Errorf("%w: operation %q", ErrNotCapture, ch.Operation)
	}
	var at string
	if err := json.Unmarshal(raw["occurred_at"], &at); err != nil {
		return Change{}, fmt.Errorf("%w: no \"occurred_at\"", ErrNotCapture)
	}
	t, err := time.Parse(time.RFC3339Nano, at)
	if err != nil {
		return Change{}, fmt.Errorf("%w: occurred_at: %v", ErrNotCapture, err)
	}
	ch.OccurredAt = t.UTC()
	if c, ok := raw["changed"]; ok {
		if err := json.Unmarshal(c, &ch.Changed); err != nil {
			return Change{}, fmt.Errorf("%w: changed: %v", ErrNotCapture, err)
		}
	}
	ch.PK, ch.Before, ch.After = raw["pk"], raw["before"], raw["after"]
	for k, v := range raw {
		switch k {
		case "table", "operation", "pk", "changed", "before", "after", "occurred_at":
		default:
			if ch.Extra == nil {
				ch.Extra = map[string]json.RawMessage{}
			}
			ch.Extra[k] = v
		}
	}
	return ch, nil
}

// Row decodes a row image (Change.Before or Change.After) into a T, typically a struct with
// json tags matching the column names. A missing or null image is ErrNoImage.
func Row[T any](image json.RawMessage) (T, error) {
	var v T
	if len(image) == 0 || string(image) == "null" {
		return v, ErrNoImage
	}
	err := json.Unmarshal(image, &v)
	return v, err
}

// ErrNoImage is returned by Row for an absent or null image.
var ErrNoImage = errors.New("capture: no row image")
