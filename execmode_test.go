package outbox_test

import (
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/internal/pgtest"
	"github.com/watermill-outbox/outbox/internal/privatepgbouncer"
)

// allExecModes are pgx's five query exec modes.
var allExecModes = []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe,
	pgx.QueryExecModeDescribeExec, pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol}

// bouncerExecModes are the modes that work through PgBouncer 1.18 in transaction mode: all but
// cache_statement, whose named prepared statements live on one server connection (PgBouncer
// 1.21+ can track them with max_prepared_statements).
var bouncerExecModes = allExecModes[1:]

var payloadTypes = map[string]outbox.PayloadType{"jsonb": outbox.PayloadJSONB, "json": outbox.PayloadJSON, "bytea": outbox.PayloadBytea}

// modeDSN is dsn with pgx's default_query_exec_mode parameter set to mode.
func modeDSN(dsn string, mode pgx.QueryExecMode) string {
	name := map[pgx.QueryExecMode]string{pgx.QueryExecModeCacheStatement: "cache_statement", pgx.QueryExecModeCacheDescribe: "cache_describe",
		pgx.QueryExecModeDescribeExec: "describe_exec", pgx.QueryExecModeExec: "exec", pgx.QueryExecModeSimpleProtocol: "simple_protocol"}[mode]
	return dsn + "&default_query_exec_mode=" + name
}

// modePool opens a pool on dsn whose default exec mode is mode, closed when t ends.
func modePool(t *testing.T, dsn string, mode pgx.QueryExecMode) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(modeDSN(dsn, mode))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 8
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// modeStdDB opens a database/sql handle (pgx stdlib driver) on dsn with mode, closed when t
// ends.
func modeStdDB(t *testing.T, dsn string, mode pgx.QueryExecMode) *sql.DB {
	t.Helper()
	cc, err := pgx.ParseConfig(modeDSN(dsn, mode))
	if err != nil {
		t.Fatal(err)
	}
	db := stdlib.OpenDB(*cc)
	db.SetMaxOpenConns(8)
	t.Cleanup(func() { db.Close() })
	return db
}

// TestEveryExecMode runs one end-to-end pass of the behavioural suite (Migrate, CheckTable,
// Publisher at pool level and in a transaction, Enqueue with idempotency key, headers and an
// extra column, a Subscriber with a retry, an ordered key and a dead letter, and every
// operation) per pgx exec mode x payload type: on a direct pgx pool, on database/sql (pgx
// stdlib), and through PgBouncer in transaction mode (each mode it supports).
func TestEveryExecMode(t *testing.T) {
	pgtest.Require(t)
	for _, mode := range allExecModes {
		for pname, pt := range payloadTypes {
			t.Run(fmt.Sprintf("pool/%s/%s", mode, pname), func(t *testing.T) {
				endToEnd(t, modePool(t, pgtest.DSN(), mode), pt)
			})
			t.Run(fmt.Sprintf("stdlib/%s/%s", mode, pname), func(t *testing.T) {
				endToEnd(t, modeStdDB(t, pgtest.DSN(), mode), pt)
			})
		}
	}
	t.Run("pgbouncer", func(t *testing.T) {
		b := privatepgbouncer.Start(t, pgtest.DSN())
		for _, mode := range bouncerExecModes {
			for pname, pt := range payloadTypes {
				t.Run(fmt.Sprintf("%s/%s", mode, pname), func(t *testing.T) {
					endToEnd(t, modePool(t, b.DSN(""), mode), pt)
				})
			}
		}
		t.Run("stdlib/exec/jsonb", func(t *testing.T) {
			endToEnd(t, modeStdDB(t, b.DSN(""), pgx.QueryExecModeExec), outbox.PayloadJSONB)
		})
	})
}

// endToEnd is the exec-mode pass of the behavioural suite on db (a *pgxpool.Pool or *sql.DB).
func endToEnd(t *testing.T, db any, pt outbox.PayloadType) {
	raw := pgtest.StdDB(t) // checks go straight to the server
	schema := outbox.SchemaConfig{Table: pgtest.Table(t), PayloadType: pt, ExtraColumns: []outbox.Column{{Name: "tenant", Type: "TEXT NULL"}}}
	for range 2 { // idempotent
		if err := outbox.Migrate(ctx, db, schema); err != nil {
			t.Fatal(err)
		}
	}
	if err := outbox.CheckTable(ctx, db, schema); err != nil {
		t.Fatal(err)
	}
	// Payloads as written, and as stored and delivered: JSONB normalises, JSON and BYTEA keep
	// the bytes.
	written := [][]byte{[]byte(`{"b":1,  "a":[1,2]}`), []byte(`1`), []byte(`2`), []byte(`3`), []byte(`"tx"`)}
	if pt == outbox.PayloadBytea {
		written[0] = []byte{0, 0xff, '{', '\\', 'x', '\''}
	}
	stored := func(b []byte) []byte {
		if pt != outbox.PayloadJSONB {
			return b
		}
		var s string
		if err := raw.QueryRowContext(ctx, `SELECT $1::jsonb::text`, string(b)).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return []byte(s)
	}
	pub := mustPublisher(t, db, outbox.PublisherConfig{Schema: schema})
	first := outbox.NewMessage(written[0])
	first.Metadata.Set("h", "v ' \" \\")
	if err := pub.Publish("orders", first); err != nil {
		t.Fatal(err)
	}
	var keyed []*message.Message
	for _, p := range written[1:4] {
		m := outbox.NewMessage(p)
		outbox.SetOrderingKey(m, "k")
		keyed = append(keyed, m)
	}
	if err := pub.Publish("orders", keyed...); err != nil {
		t.Fatal(err)
	}
	in := outbox.EventInput{Topic: "orders", Payload: map[string]any{"enqueued": true}, Headers: map[string]string{"x": "y"},
		IdempotencyKey: "idem-1", ExtraColumns: map[string]any{"tenant": "t'1"}}
	ev, err := pub.Enqueue(ctx, in)
	if err != nil {
		t.Fatal(err)
	}
	again, err := pub.Enqueue(ctx, in)
	if err != nil {
		t.Fatal(err)
	}
	if !again.Duplicate || again.Sequence != ev.Sequence || ev.Duplicate {
		t.Fatalf("idempotent enqueue: first %+v, again %+v", ev, again)
	}
	// The caller's transaction: one committed, one rolled back.
	txPublish := func(payload []byte, commit bool) {
		switch h := db.(type) {
		case *pgxpool.Pool:
			tx, err := h.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx)
			if err := mustPublisher(t, tx, outbox.PublisherConfig{Schema: schema}).Publish("orders", outbox.NewMessage(payload)); err != nil {
				t.Fatal(err)
			}
			if commit {
				if err := tx.Commit(ctx); err != nil {
					t.Fatal(err)
				}
			}
		case *sql.DB:
			tx, err := h.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback()
			if err := mustPublisher(t, tx, outbox.PublisherConfig{Schema: schema}).Publish("orders", outbox.NewMessage(payload)); err != nil {
				t.Fatal(err)
			}
			if commit {
				if err := tx.Commit(); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	txPublish(written[4], true)
	txPublish([]byte(`"rolled back"`), false)
	poison := outbox.NewMessage([]byte(`{"poison":true}`))
	if err := pub.Publish("poison", poison); err != nil {
		t.Fatal(err)
	}
	var got []byte
	if err := raw.QueryRowContext(ctx, fmt.Sprintf(`SELECT "payload"::text FROM %q WHERE "id" = $1`, schema.Table), first.UUID).Scan(&got); err != nil {
		t.Fatal(err)
	}
	if pt == outbox.PayloadBytea {
		if err := raw.QueryRowContext(ctx, fmt.Sprintf(`SELECT "payload" FROM %q WHERE "id" = $1`, schema.Table), first.UUID).Scan(&got); err != nil {
			t.Fatal(err)
		}
	}
	if string(got) != string(stored(written[0])) {
		t.Fatalf("stored payload %q, want %q", got, stored(written[0]))
	}
	var tenant, hdr string
	if err := raw.QueryRowContext(ctx, fmt.Sprintf(`SELECT "tenant", "headers"->>'x' FROM %q WHERE "idempotency_key" = 'idem-1'`, schema.Table)).Scan(&tenant, &hdr); err != nil {
		t.Fatal(err)
	}
	if tenant != "t'1" || hdr != "y" {
		t.Fatalf("extra column %q, header %q", tenant, hdr)
	}
	if n := pgCount(t, raw, fmt.Sprintf(`SELECT count(*) FROM %q`, schema.Table)); n != 7 {
		t.Fatalf("%d rows stored, want 7 (the rolled-back one absent)", n)
	}

	cfg := fastCfg(schema)
	cfg.MaxAttempts = 2
	cfg.RetryBase, cfg.RetryMax = 50*time.Millisecond, 50*time.Millisecond
	sub, err := outbox.NewSubscriber(db, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	var (
		mu       sync.Mutex
		order    []string // payloads of topic orders' key k, in delivery order, with attempt
		payloads = map[string][]byte{}
		heal     atomic.Bool
	)
	for _, topic := range []string{"orders", "poison"} {
		ch, err := sub.Subscribe(ctx, topic)
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			for m := range ch {
				att := m.Metadata.Get(outbox.MetadataAttempt)
				mu.Lock()
				payloads[m.UUID] = m.Payload
				if m.Metadata.Get(outbox.MetadataOrderingKey) == "k" {
					order = append(order, string(m.Payload)+"#"+att)
				}
				mu.Unlock()
				switch {
				case topic == "poison" && !heal.Load(),
					topic == "orders" && string(m.Payload) == "1" && att == "1":
					outbox.SetNackError(m, fmt.Errorf("refused ' \\ attempt %s", att))
					m.Nack()
				default:
					m.Ack()
				}
			}
		}()
	}
	pending := func() int {
		return pgCount(t, raw, fmt.Sprintf(`SELECT count(*) FROM %q WHERE "published_at" IS NULL AND "dead_lettered_at" IS NULL`, schema.Table))
	}
	pgtest.Eventually(t, 30*time.Second, "every event published or dead-lettered", func() bool { return pending() == 0 })
	mu.Lock()
	wantOrder := []string{"1#1", "1#2", "2#1", "3#1"}
	if !slices.Equal(order, wantOrder) {
		t.Fatalf("key k delivered %q, want %q", order, wantOrder)
	}
	if string(payloads[first.UUID]) != string(stored(written[0])) || len(payloads) != 7 {
		t.Fatalf("delivered payload %q, want %q (%d events delivered, want 7)", payloads[first.UUID], stored(written[0]), len(payloads))
	}
	mu.Unlock()

	bl, err := sub.Backlog(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if bl.Pending != 0 || bl.DeadLettered != 1 {
		t.Fatalf("backlog %+v, want 0 pending, 1 dead-lettered", bl)
	}
	if _, err := sub.BacklogByTopic(ctx); err != nil {
		t.Fatal(err)
	}
	dls, err := sub.ListDeadLettered(ctx, outbox.DeadLetterFilter{Topics: []string{"pois*"}}, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(dls) != 1 || dls[0].ID.String() != poison.UUID || string(dls[0].Payload) != string(stored([]byte(`{"poison":true}`))) ||
		dls[0].Attempts != 2 || dls[0].LastError != "refused ' \\ attempt 2" {
		t.Fatalf("dead letters %+v", dls)
	}
	if n, err := sub.RetryDeadLettered(ctx, outbox.RetryFilter{IDs: []uuid.UUID{dls[0].ID}}); err != nil || n != 1 {
		t.Fatalf("retried %d, %v; want 1", n, err)
	}
	pgtest.Eventually(t, 30*time.Second, "the retried dead letter dead-lettered again", func() bool {
		return pgCount(t, raw, fmt.Sprintf(`SELECT count(*) FROM %q WHERE "dead_lettered_at" IS NOT NULL AND "attempts" = 2`, schema.Table)) == 1 && pending() == 0
	})
	if n, err := sub.PurgeDeadLettered(ctx, outbox.DeadLetterFilter{Topics: []string{"*"}}); err != nil || n != 1 {
		t.Fatalf("purged %d, %v; want 1", n, err)
	}
	if n, err := sub.CleanupDeadLettered(ctx, 0); err != nil || n != 0 {
		t.Fatalf("cleanup dead letters: %d, %v; want 0 (purged)", n, err)
	}
	if n, err := sub.CleanupPublished(ctx, 0); err != nil || n != 6 {
		t.Fatalf("cleanup published: %d, %v; want 6", n, err)
	}
}

// pgCount runs a query returning one integer on db.
func pgCount(t *testing.T, db *sql.DB, q string, args ...any) int {
	t.Helper()
	var n int
	if err := db.QueryRowContext(ctx, q, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return n
}

// TestPayloadJSON: the default schema and an explicit PayloadJSON store and deliver the bytes
// written (unsorted keys, spaces, 1e3, a repeated key, a \u escape) through a Subscriber on
// every backend (PostgreSQL through pgx and through database/sql, PgBouncer, SQLite, MariaDB),
// and refuse invalid JSON before any SQL. On PostgreSQL both columns are json.
func TestPayloadJSON(t *testing.T) {
	run := func(t *testing.T, b *backend) {
		for name, mod := range map[string]func(*outbox.SchemaConfig){
			"default": func(*outbox.SchemaConfig) {},
			"json":    func(c *outbox.SchemaConfig) { c.PayloadType = outbox.PayloadJSON },
		} {
			t.Run(name, func(t *testing.T) {
				payloadKept(t, b, b.table(t, func(c *outbox.SchemaConfig) { c.Table = b.tableName(t, "outbox_"+name) }, mod))
			})
		}
	}
	eachBackend(t, run)
	t.Run("postgresql-stdlib", func(t *testing.T) {
		pgtest.Require(t)
		run(t, &backend{dialect: outbox.DialectPostgreSQL, db: modeStdDB(t, pgtest.DSN(), pgx.QueryExecModeCacheStatement), raw: pgtest.StdDB(t)})
	})
}

// payloadKept publishes a JSON payload in an unusual spelling on schema and checks that the
// relay delivers it byte for byte with its headers, and that an invalid one never reaches SQL.
func payloadKept(t *testing.T, b *backend, schema outbox.SchemaConfig) {
	t.Helper()
	if b.dialect == outbox.DialectPostgreSQL {
		if n := b.count(t, `SELECT count(*) FROM pg_attribute WHERE attrelid = $1::regclass AND attname IN ('payload', 'headers') AND atttypid = 'json'::regtype`, fmt.Sprintf("%q", schema.Table)); n != 2 {
			t.Fatalf("%d of payload and headers are json columns, want 2", n)
		}
	}
	var ve *outbox.ValidationError
	if err := b.publisher(t, outbox.PublisherConfig{Schema: schema}).Publish("orders", outbox.NewMessage([]byte(`{"broken"`))); !errors.As(err, &ve) || ve.Field != "payload" {
		t.Fatalf("invalid JSON: %v, want a ValidationError on payload", err)
	}
	const body = `{ "z" : 1,"a":[1e3, 1.50E-2, "\u00e9"],  "z":2 ,"b":{"y":true,"x":null}}`
	msg := outbox.NewMessage([]byte(body))
	msg.Metadata.Set("trace", `{"b": 1, "a": "x"}`)
	if m := publishAndDeliver(t, b, schema, msg); m.UUID != msg.UUID || string(m.Payload) != body || m.Metadata.Get("trace") != `{"b": 1, "a": "x"}` {
		t.Fatalf("delivered %s %q (trace %q), want %s %q", m.UUID, m.Payload, m.Metadata.Get("trace"), msg.UUID, body)
	}
	if n := b.count(t, fmt.Sprintf(`SELECT count(*) FROM %q`, schema.Table)); n != 1 {
		t.Fatalf("%d rows, want 1 (the invalid payload never reached SQL)", n)
	}
}

// TestMigrateKeepsJSONB: a table created with JSONB payload and headers (the default before
// JSON) keeps both column types through Migrate with today's default config, and a publisher
// and relay with that config still write and deliver through it (the payload in jsonb's
// spelling, as before).
func TestMigrateKeepsJSONB(t *testing.T) {
	b := pgBackend(t)
	legacy := b.table(t, func(c *outbox.SchemaConfig) { c.PayloadType = outbox.PayloadJSONB })
	b.exec(t, fmt.Sprintf(`ALTER TABLE %q ALTER COLUMN headers TYPE jsonb`, legacy.Table))
	schema := outbox.SchemaConfig{Table: legacy.Table}
	if err := outbox.Migrate(ctx, b.db, schema); err != nil {
		t.Fatal(err)
	}
	if n := b.count(t, `SELECT count(*) FROM pg_attribute WHERE attrelid = $1::regclass AND attname IN ('payload', 'headers') AND atttypid = 'jsonb'::regtype`, fmt.Sprintf("%q", schema.Table)); n != 2 {
		t.Fatalf("after Migrate %d of payload and headers are jsonb, want 2", n)
	}
	msg := outbox.NewMessage([]byte(`{"b":1e3,  "a":1,"a":2}`))
	msg.Metadata.Set("h", "v")
	if m := publishAndDeliver(t, b, schema, msg); m.UUID != msg.UUID || string(m.Payload) != `{"a": 2, "b": 1000}` || m.Metadata.Get("h") != "v" {
		t.Fatalf("delivered %s %q %v, want %s jsonb's {\"a\": 2, \"b\": 1000} with h=v", m.UUID, m.Payload, m.Metadata, msg.UUID)
	}
}

// publishAndDeliver publishes msg on topic "orders" of schema at pool level, subscribes, and
// returns the first message delivered (acked); it fails t after 30 s without one.
func publishAndDeliver(t *testing.T, b *backend, schema outbox.SchemaConfig, msg *message.Message) *message.Message {
	t.Helper()
	if err := b.publisher(t, outbox.PublisherConfig{Schema: schema}).Publish("orders", msg); err != nil {
		t.Fatal(err)
	}
	ch, err := b.newSub(t, fastCfg(schema)).Subscribe(ctx, "orders")
	if err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-ch:
		m.Ack()
		return m
	case <-time.After(30 * time.Second):
		t.Fatal("nothing delivered within 30 s")
	}
	return nil
}
