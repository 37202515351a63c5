package wal_test

import (
	"sort"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/capture"
	"github.com/watermill-outbox/outbox/capture/wal"
)

// TestParity: for a table with every type the WAL source supports, the envelope it delivers
// equals the one the capture trigger writes for the same writes (occurred_at aside: the
// trigger writes the transaction's start, the WAL source its commit), and capture.Decode reads
// it. Same topics, ordering keys, "changed" lists, no event for an UPDATE that changes
// nothing, the old key in "before" after a key change.
func TestParity(t *testing.T) {
	_, pool := logicalPG(t)
	exec(t, pool, `CREATE TYPE mood AS ENUM ('sad', 'happy')`, `CREATE DOMAIN posint AS int4 CHECK (VALUE > 0)`,
		`CREATE TABLE loan (id int8 PRIMARY KEY, n int4, small int2, f float8, r float4, amount numeric(10,2), ok bool, name text, code char(5), vc varchar(10),
  at timestamptz, local timestamp, day date, tod time, u uuid, raw bytea, doc jsonb, j json, m mood, p posint, addr inet, tok text)`)
	if err := outbox.Migrate(ctx, pool, outboxSchema); err != nil {
		t.Fatal(err)
	}
	tables := []capture.Table{{Name: "loan", Payload: capture.PayloadBeforeAndAfter, Exclude: []string{"tok"}}}
	for i := range tables {
		if err := capture.Install(ctx, pool, outboxSchema, tables[i]); err != nil {
			t.Fatal(err)
		}
	}
	if err := wal.Setup(ctx, pool, wal.Config{Tables: tables}); err != nil {
		t.Fatal(err)
	}
	rec := &recorder{}
	src, err := wal.New(pool, wal.Config{Tables: tables, Destination: rec})
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, src)
	exec(t, pool,
		`INSERT INTO loan VALUES (1, 7, -3, 'NaN', 1.5, 12.50, true, 'a"b\', 'ab', 'x', '2024-01-02 03:04:05.123456+02', '2024-01-02 03:04:05.5', '2024-01-02', '03:04:05',
  'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '\x00ff10', '{"b": [1, 2], "a": null}', '{"z": 1}', 'happy', 5, '127.0.0.1/32', 'secret')`,
		`INSERT INTO loan (id) VALUES (2)`,
		`UPDATE loan SET n = 8, at = 'infinity', f = 1e300 WHERE id = 1`,
		`UPDATE loan SET tok = 'other' WHERE id = 1`, // no carried column changes: no event
		`UPDATE loan SET id = 3 WHERE id = 2`,
		`DELETE FROM loan WHERE id = 1`)
	want := triggerEvents(t, pool)
	if len(want) != 5 {
		t.Fatalf("trigger wrote %d events, want 5", len(want))
	}
	waitFor(t, 30*time.Second, "5 WAL events", func() bool { return len(rec.snapshot()) >= 5 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	got := rec.snapshot()
	if len(got) != 5 {
		t.Fatalf("%d WAL events, want 5", len(got))
	}
	// Order holds per row key (the source delivers keys in parallel lanes): compare key by key,
	// each key's events in their order.
	sort.SliceStable(got, func(i, j int) bool { return got[i].key < got[j].key })
	sort.SliceStable(want, func(i, j int) bool { return want[i].key < want[j].key })
	for i, g := range got {
		w := want[i]
		if g.topic != w.topic || g.key != w.key {
			t.Fatalf("event %d: topic %q key %q, want %q %q", i, g.topic, g.key, w.topic, w.key)
		}
		if a, b := envelope(t, g.payload), envelope(t, w.payload); !sameJSON(a, b) {
			t.Fatalf("event %d:\nWAL     %s\ntrigger %s", i, fmtEnv(a), fmtEnv(b))
		}
		ch, err := capture.DecodePayload(g.payload)
		if err != nil || time.Since(ch.OccurredAt) > time.Minute {
			t.Fatalf("event %d: %+v %v", i, ch, err)
		}
	}
}

// triggerEvents reads the events the capture triggers wrote into trigger_outbox, in
// sequence order.
func triggerEvents(t *testing.T, pool *pgxpool.Pool) []received {
	t.Helper()
	rows, err := pool.Query(ctx, `SELECT topic, coalesce(ordering_key, ''), id::text, payload::text FROM trigger_outbox ORDER BY sequence`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []received
	for rows.Next() {
		var r received
		var p string
		if err := rows.Scan(&r.topic, &r.key, &r.id, &p); err != nil {
			t.Fatal(err)
		}
		r.payload = []byte(p)
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// outboxSchema is the trigger path's outbox table in TestParity (not the WAL source's, whose
// unpublished keys would hold the WAL source's changes).
var outboxSchema = outbox.SchemaConfig{Table: "trigger_outbox"}
