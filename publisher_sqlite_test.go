package outbox_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/internal/pgtest"
)

// TestSQLitePublisher covers the SQLite write path: migrations, commit and rollback with the
// caller's *sql.Tx, validation before SQL, idempotency keys, extra columns, multi-statement
// inserts and the dialect checks. (The relay side runs through the shared behavioural suite.)
func TestSQLitePublisher(t *testing.T) {
	b := sqliteBackend(t)
	schema := outbox.SchemaConfig{Dialect: outbox.DialectSQLite, ExtraColumns: []outbox.Column{{Name: "tenant", Type: "TEXT NULL"}}}
	for range 2 { // idempotent
		if err := outbox.Migrate(ctx, b.db, schema); err != nil {
			t.Fatal(err)
		}
	}
	schema.ExtraColumns = append(schema.ExtraColumns, outbox.Column{Name: "weight", Type: "INTEGER NOT NULL DEFAULT 0"})
	if err := outbox.Migrate(ctx, b.db, schema); err != nil {
		t.Fatalf("migrate adding a column: %v", err)
	}
	if n := b.count(t, `SELECT count(*) FROM pragma_table_info('watermill_outbox') WHERE name IN ('tenant', 'weight')`); n != 2 {
		t.Fatalf("%d extra columns, want 2", n)
	}
	b.exec(t, `CREATE TABLE orders (id INTEGER PRIMARY KEY, total INTEGER NOT NULL)`)

	// Commit: the business row and the event together.
	tx, err := b.raw.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO orders (id, total) VALUES (1, 100)`); err != nil {
		t.Fatal(err)
	}
	pub := mustPublisher(t, tx, outbox.PublisherConfig{Schema: schema})
	msg := outbox.NewMessage([]byte(`{"order":1}`))
	msg.Metadata.Set("trace", "abc")
	outbox.SetOrderingKey(msg, "order-1")
	outbox.SetExtraColumns(msg, map[string]any{"tenant": "acme", "weight": 7})
	evs, err := pub.PublishEvents(ctx, "orders.created", msg)
	if err != nil {
		t.Fatal(err)
	}
	// Bad input is refused before any SQL and the transaction stays usable.
	var ve *outbox.ValidationError
	if _, err := pub.PublishEvents(ctx, "orders.created", outbox.NewMessage([]byte(`{"broken"`))); !errors.As(err, &ve) || ve.Field != "payload" {
		t.Fatalf("invalid JSON: %v", err)
	}
	if _, err := pub.PublishEvents(ctx, "", outbox.NewMessage([]byte(`1`))); !errors.As(err, &ve) || ve.Field != "topic" {
		t.Fatalf("empty topic: %v", err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatalf("commit after refused events: %v", err)
	}
	var (
		id, topic, payload, headers, key, tenant string
		weight                                   int
		created                                  int64
	)
	if err := b.raw.QueryRowContext(ctx, `SELECT id, topic, payload, headers, ordering_key, tenant, weight, created_at FROM watermill_outbox`).
		Scan(&id, &topic, &payload, &headers, &key, &tenant, &weight, &created); err != nil {
		t.Fatal(err)
	}
	if id != msg.UUID || id != evs[0].ID.String() || topic != "orders.created" || payload != `{"order":1}` || headers != `{"trace":"abc"}` ||
		key != "order-1" || tenant != "acme" || weight != 7 || evs[0].Sequence != 1 {
		t.Fatalf("stored %s %s %s %s %s %s %d, event %+v", id, topic, payload, headers, key, tenant, weight, evs[0])
	}
	if age := time.Since(time.UnixMicro(created)); age < 0 || age > time.Minute || !evs[0].CreatedAt.Equal(time.UnixMicro(created)) {
		t.Fatalf("created_at %d (age %s), event says %s", created, age, evs[0].CreatedAt)
	}

	// Rollback: neither the business row nor the event.
	tx, _ = b.raw.BeginTx(ctx, nil)
	tx.ExecContext(ctx, `INSERT INTO orders (id, total) VALUES (2, 200)`)
	if err := mustPublisher(t, tx, outbox.PublisherConfig{Schema: schema}).Publish("orders.created", outbox.NewMessage([]byte(`2`))); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	if n := b.count(t, `SELECT (SELECT count(*) FROM orders) * 10 + (SELECT count(*) FROM watermill_outbox)`); n != 11 {
		t.Fatalf("after rollback: orders*10+events = %d, want 11", n)
	}

	// Idempotency keys: a repeat returns the stored event, in another call and in the same one.
	p := b.publisher(t, outbox.PublisherConfig{Schema: schema})
	first, err := p.Enqueue(ctx, outbox.EventInput{Topic: "pay", Payload: 1, IdempotencyKey: "pay-1"})
	if err != nil || first.Duplicate {
		t.Fatalf("first: %+v %v", first, err)
	}
	again, err := p.EnqueueMany(ctx, []outbox.EventInput{
		{Topic: "pay", Payload: 2, IdempotencyKey: "pay-1"},
		{Topic: "pay", Payload: 3, IdempotencyKey: "pay-2"},
		{Topic: "pay", Payload: 4, IdempotencyKey: "pay-2"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if !again[0].Duplicate || again[0].ID != first.ID || again[0].Sequence != first.Sequence ||
		again[1].Duplicate || !again[2].Duplicate || again[2].ID != again[1].ID {
		t.Fatalf("repeats: %+v", again)
	}
	if n := b.count(t, `SELECT count(*) FROM watermill_outbox WHERE topic = 'pay'`); n != 2 {
		t.Fatalf("%d pay events, want 2", n)
	}

	// More events than one INSERT statement takes: all stored, sequence order = input order.
	ins := make([]outbox.EventInput, 1200)
	for i := range ins {
		ins[i] = outbox.EventInput{Topic: "bulk", Payload: i, OrderingKey: fmt.Sprintf("k%d", i%7)}
	}
	bulk, err := p.EnqueueMany(ctx, ins)
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i < len(bulk); i++ {
		if bulk[i].Sequence != bulk[i-1].Sequence+1 {
			t.Fatalf("event %d: sequence %d after %d", i, bulk[i].Sequence, bulk[i-1].Sequence)
		}
	}
	if n := b.count(t, `SELECT count(*) FROM watermill_outbox WHERE topic = 'bulk' AND CAST(payload AS INTEGER) = sequence - $1`, bulk[0].Sequence); n != 1200 {
		t.Fatalf("%d bulk events in input order, want 1200", n)
	}

	// Dialect checks: each a *ConfigError at construction, before any SQL.
	var ce *outbox.ConfigError
	if _, err := outbox.NewPublisher(b.db, outbox.PublisherConfig{Schema: schema, NotifyChannel: "x"}, nil); !errors.As(err, &ce) {
		t.Fatalf("NotifyChannel on SQLite: %v", err)
	}
	if _, err := outbox.NewPublisher(b.db, outbox.PublisherConfig{}, nil); !errors.As(err, &ce) || !strings.Contains(err.Error(), "DialectSQLite") {
		t.Fatalf("SQLite handle with the PostgreSQL dialect: %v", err)
	}
	if _, err := outbox.NewSubscriber(b.db, outbox.SubscriberConfig{}, nil); !errors.Is(err, outbox.ErrUnsupportedDB) {
		t.Fatalf("subscriber, SQLite handle with the PostgreSQL dialect: %v", err)
	}
	if err := (outbox.SchemaConfig{Dialect: outbox.DialectSQLite, Table: "main.outbox"}).Validate(); !errors.As(err, &ce) {
		t.Fatalf("qualified SQLite table: %v", err)
	}
	if pool := pgtest.Require(t); pool != nil {
		if _, err := outbox.NewPublisher(pool, outbox.PublisherConfig{Schema: schema}, nil); !errors.Is(err, outbox.ErrUnsupportedDB) {
			t.Fatalf("pgx pool with the SQLite dialect: %v", err)
		}
	}
}
