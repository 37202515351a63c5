package outbox

import (
	"testing"

	"github.com/watermill-outbox/outbox/internal/dialect"
)

// TestEventOfHeaders: an event without headers (the column's '{}') gets an empty map, not nil,
// like every other decoded headers object; 'null' gets none; an undecodable value gets the
// outbox-headers-error header.
func TestEventOfHeaders(t *testing.T) {
	const id = "0193a8a2-7c1e-7000-8000-000000000001"
	conv := eventOf(&schema{})
	var items []struct {
		ev *Event
		id string
	}
	for _, c := range []dialect.Claimed{
		{Sequence: 1, ID: id, Headers: "{}"},
		{Sequence: 2, ID: id, Headers: "null"},
		{Sequence: 3, ID: id, Headers: `{"a":"b"}`},
		{Sequence: 4, ID: id, Headers: ""},
	} {
		ev, id := conv(&c)
		items = append(items, struct {
			ev *Event
			id string
		}{ev.(*Event), id})
	}
	if h := items[0].ev.Headers; h == nil || len(h) != 0 {
		t.Errorf("'{}' gave %#v, want an empty map", h)
	}
	if h := items[1].ev.Headers; h != nil {
		t.Errorf("'null' gave %#v, want nil", h)
	}
	if h := items[2].ev.Headers; len(h) != 1 || h["a"] != "b" {
		t.Errorf(`'{"a":"b"}' gave %#v`, h)
	}
	if h := items[3].ev.Headers; len(h) != 1 || h["outbox-headers-error"] == "" {
		t.Errorf("'' gave %#v, want the outbox-headers-error header", h)
	}
	for _, it := range items {
		if it.id != id {
			t.Errorf("item id %q, want %q", it.id, id)
		}
	}
}
