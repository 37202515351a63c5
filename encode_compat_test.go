package outbox_test

import (
	stdjson "encoding/json"
	"fmt"
	"maps"
	"strings"
	"testing"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/internal/pgtest"
)

// TestEncodePayloadLikeEncodingJSON: EncodePayload (Enqueue) encodes like encoding/json where
// The payload rules add none here: an encoding/json.Number stays a number (a payload decoded with
// UseNumber and enqueued again kept its digits only as a string) and omitempty omits false,
// 0, "" as encoding/json does (JSON v2 wrote them).
func TestEncodePayloadLikeEncodingJSON(t *testing.T) {
	type order struct {
		ID       string         `json:"id"`
		Amount   stdjson.Number `json:"amount"`
		Discount int            `json:"discount,omitempty"`
		Gift     bool           `json:"gift,omitempty"`
	}
	in := order{ID: "o-1", Amount: "12.50"}
	got, err := outbox.EncodePayload(in)
	if err != nil {
		t.Fatal(err)
	}
	if want, _ := stdjson.Marshal(in); string(got) != string(want) {
		t.Fatalf("EncodePayload = %s, encoding/json = %s", got, want)
	}
	decoded := map[string]any{}
	dec := stdjson.NewDecoder(strings.NewReader(`{"qty":3,"price":19.99}`))
	dec.UseNumber()
	if err := dec.Decode(&decoded); err != nil {
		t.Fatal(err)
	}
	if got, err := outbox.EncodePayload(decoded); err != nil || string(got) != `{"price":19.99,"qty":3}` {
		t.Fatalf("re-encoded decoded payload = %s (%v), want the numbers kept", got, err)
	}
	if _, err := outbox.EncodePayload(map[string]any{"n": stdjson.Number("12abc")}); err == nil {
		t.Fatal("a json.Number that is not a number was encoded")
	}
}

// TestEnqueueDropsReservedHeaders: reserved outbox-* names in EventInput.Headers are not stored
// (the relay sets them from the columns), as Publish drops them from a message's metadata, and
// the caller's map is left as it was. Stored, the relay emitted an unordered event with
// outbox-ordering-key set, which forwarders use as the Kafka key and to hold back later events.
func TestEnqueueDropsReservedHeaders(t *testing.T) {
	pool := pgtest.Require(t)
	cfg := newTable(t)
	p := mustPublisher(t, pool, outbox.PublisherConfig{Schema: cfg})
	headers := map[string]string{outbox.MetadataOrderingKey: "K", outbox.MetadataIdempotencyKey: "I", outbox.MetadataTable: "other_table", "x-tenant": "t1"}
	before := maps.Clone(headers)
	if _, err := p.Enqueue(ctx, outbox.EventInput{Topic: "t", Payload: 1, Headers: headers}); err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(headers, before) {
		t.Fatalf("the caller's headers map changed: %v, was %v", headers, before)
	}
	var stored string
	if err := pool.QueryRow(ctx, fmt.Sprintf(`SELECT headers::text FROM %q`, cfg.Table)).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	if stored != `{"x-tenant":"t1"}` {
		t.Fatalf("stored headers %s, want only {\"x-tenant\":\"t1\"}", stored)
	}
}
