package capture_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/capture"
)

// TestRelayAndBytea: captured events written into an outbox whose payload column is BYTEA
// (BLOB on SQLite) reach a Watermill handler through the outbox Subscriber like published
// ones: the message UUID is the event id, the ordering key and topic are in the metadata,
// and capture.Decode reads the envelope.
func TestRelayAndBytea(t *testing.T) {
	bytea := func(s *outbox.SchemaConfig) { s.PayloadType = outbox.PayloadBytea }
	for name, open := range map[string]func(*testing.T, func(*outbox.SchemaConfig)) *harness{"postgresql": pgHarness, "sqlite": sqliteHarness} {
		t.Run(name, func(t *testing.T) {
			h := open(t, bytea)
			tb := h.table()
			h.exec(fmt.Sprintf(`CREATE TABLE %s (id INTEGER PRIMARY KEY, status TEXT)`, tb))
			h.install(capture.Table{Name: tb, Payload: capture.PayloadBeforeAndAfter})
			h.exec(fmt.Sprintf(`INSERT INTO %s VALUES (1, 'a')`, tb), fmt.Sprintf(`UPDATE %s SET status = 'b' WHERE id = 1`, tb), fmt.Sprintf(`DELETE FROM %s WHERE id = 1`, tb))
			stored := h.events(0)
			if len(stored) != 3 {
				t.Fatalf("%d events, want 3", len(stored))
			}
			sub, err := outbox.NewSubscriber(h.db, outbox.SubscriberConfig{Schema: h.schema, PollInterval: 20 * time.Millisecond}, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer sub.Close()
			sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			msgs, err := sub.Subscribe(sctx, tb+".*")
			if err != nil {
				t.Fatal(err)
			}
			wantOps := []capture.Operation{capture.Inserted, capture.Updated, capture.Deleted}
			for i, ev := range stored {
				var msg *message.Message
				select {
				case msg = <-msgs:
				case <-sctx.Done():
					t.Fatalf("event %d not delivered", i)
				}
				ch, err := capture.Decode(msg)
				if err != nil {
					t.Fatal(err)
				}
				if msg.UUID != ev.ID || msg.Metadata.Get(outbox.MetadataOrderingKey) != tb+":1" || msg.Metadata.Get(outbox.MetadataTopic) != ev.Topic ||
					ch.Operation != wantOps[i] || ch.Table != h.prefix+"."+tb || string(ch.PK) != "1" {
					t.Fatalf("message %d: uuid %s (want %s), metadata %v, change %+v", i, msg.UUID, ev.ID, msg.Metadata, ch)
				}
				type row struct {
					ID     int    `json:"id"`
					Status string `json:"status"`
				}
				switch ch.Operation {
				case capture.Inserted:
					if r, err := capture.Row[row](ch.After); err != nil || r != (row{1, "a"}) {
						t.Fatalf("after: %+v %v", r, err)
					}
					if _, err := capture.Row[row](ch.Before); !errors.Is(err, capture.ErrNoImage) {
						t.Fatalf("before of an insert: %v, want ErrNoImage", err)
					}
				case capture.Updated:
					b, _ := capture.Row[row](ch.Before)
					a, _ := capture.Row[row](ch.After)
					if b != (row{1, "a"}) || a != (row{1, "b"}) || fmt.Sprint(ch.Changed) != "[status]" {
						t.Fatalf("update: before %+v after %+v changed %v", b, a, ch.Changed)
					}
				}
				if time.Since(ch.OccurredAt) > time.Minute || ch.OccurredAt.Location() != time.UTC {
					t.Fatalf("occurred_at %v", ch.OccurredAt)
				}
				msg.Ack()
			}
		})
	}
}

// TestDecode: envelopes and what is not one.
func TestDecode(t *testing.T) {
	ch, err := capture.DecodePayload([]byte(`{"table":"public.t","operation":"truncated","occurred_at":"2026-12-01T10:00:00.000001+00:00","author":"ann"}`))
	if err != nil || ch.Operation != capture.Truncated || ch.PK != nil || ch.OccurredAt != time.Date(2026, 12, 1, 10, 0, 0, 1000, time.UTC) || string(ch.Extra["author"]) != `"ann"` {
		t.Fatalf("%+v %v", ch, err)
	}
	for _, bad := range []string{`[]`, `{}`, `{"table":"t"}`, `{"table":"t","operation":"moved","occurred_at":"2026-12-01T10:00:00Z"}`,
		`{"table":"t","operation":"inserted"}`, `{"table":"t","operation":"inserted","occurred_at":"yesterday"}`, `not json`} {
		if _, err := capture.DecodePayload([]byte(bad)); !errors.Is(err, capture.ErrNotCapture) {
			t.Fatalf("%s: %v, want ErrNotCapture", bad, err)
		}
	}
	if _, err := capture.Decode(nil); !errors.Is(err, capture.ErrNotCapture) {
		t.Fatal(err)
	}
}
