package wal_test

import (
	"testing"
	"time"

	"github.com/watermill-outbox/outbox/capture"
	"github.com/watermill-outbox/outbox/capture/wal"
)

// TestUnchangedToast: an UPDATE that leaves a large (TOASTed, uncompressible) value unchanged
// still carries it in "after" (pgoutput sends it as "unchanged"; the old row of REPLICA
// IDENTITY FULL has it), and "changed" does not list it.
func TestUnchangedToast(t *testing.T) {
	_, pool := logicalPG(t)
	exec(t, pool, `CREATE TABLE doc (id int PRIMARY KEY, status text, body text)`, `ALTER TABLE doc ALTER COLUMN body SET STORAGE EXTERNAL`)
	tables := []capture.Table{{Name: "doc"}}
	if err := wal.Setup(ctx, pool, wal.Config{Tables: tables}); err != nil {
		t.Fatal(err)
	}
	rec := &recorder{}
	src, err := wal.New(pool, wal.Config{Tables: tables, Destination: rec})
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, src)
	exec(t, pool, `INSERT INTO doc SELECT 1, 'a', string_agg(md5(g::text), '') FROM generate_series(1, 4000) g`, `UPDATE doc SET status = 'b' WHERE id = 1`)
	waitFor(t, 30*time.Second, "2 changes", func() bool { return len(rec.snapshot()) == 2 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	var body string
	if err := pool.QueryRow(ctx, `SELECT body FROM doc WHERE id = 1`).Scan(&body); err != nil {
		t.Fatal(err)
	}
	ch, err := capture.DecodePayload(rec.snapshot()[1].payload)
	if err != nil {
		t.Fatal(err)
	}
	row, err := capture.Row[struct{ Status, Body string }](ch.After)
	if err != nil || row.Status != "b" || row.Body != body || len(body) != 128000 || len(ch.Changed) != 1 || ch.Changed[0] != "status" {
		t.Fatalf("after: status %q, body of %d bytes (want %d), changed %v, %v", row.Status, len(row.Body), len(body), ch.Changed, err)
	}
}
