package main

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/watermill-outbox/outbox/internal/privatepg"
)

// TestCaptureWAL: "outbox capture wal setup|status|drop" on a private server with wal_level =
// logical: setup creates the publication and the slot (twice: idempotent), status shows them
// (exit 0) and fails beyond --max-retained-bytes, --print-sql prints the statements, drop
// removes the slot and status then fails; setup on a server without wal_level = logical is
// refused with the fix.
func TestCaptureWAL(t *testing.T) {
	ctx := context.Background()
	srv := privatepg.Start(t)
	dsn := srv.DSN()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE loan (id int PRIMARY KEY, status text)`); err != nil {
		t.Fatal(err)
	}
	if r := cli(t, nil, "migrate", "--db", dsn); r.code != 0 {
		t.Fatalf("migrate: %+v", r)
	}
	if r := cli(t, nil, "capture", "wal", "setup", "--db", dsn, "--table", "loan"); r.code == 0 || !strings.Contains(r.stderr, "wal_level = logical") {
		t.Fatalf("setup with wal_level replica: %+v", r)
	}
	if _, err := pool.Exec(ctx, `ALTER SYSTEM SET wal_level = logical`); err != nil {
		t.Fatal(err)
	}
	pool.Close()
	srv.Stop(t)
	srv.Restart(t)
	for range 2 {
		if r := cli(t, nil, "capture", "wal", "setup", "--db", dsn, "--table", "loan"); r.code != 0 || !strings.Contains(r.stdout, "publication outbox_wal (loan) and slot outbox_wal ready") {
			t.Fatalf("setup: %+v", r)
		}
	}
	if r := cli(t, nil, "capture", "wal", "status", "--db", dsn); r.code != 0 || !strings.Contains(r.stdout, "slot outbox_wal: active false, wal_status reserved") {
		t.Fatalf("status: %+v", r)
	}
	if r := cli(t, nil, "capture", "wal", "status", "--db", dsn, "--max-retained-bytes", "1"); r.code != 1 || !strings.Contains(r.stderr, "more than --max-retained-bytes 1") {
		t.Fatalf("status over the bound: %+v", r)
	}
	want := "ALTER TABLE \"loan\" REPLICA IDENTITY FULL;\nCREATE PUBLICATION \"p2\" FOR TABLE \"loan\" WITH (publish_via_partition_root = true);\nSELECT pg_create_logical_replication_slot('s2', 'pgoutput');\n"
	if r := cli(t, nil, "capture", "wal", "setup", "--db", dsn, "--table", "loan", "--slot", "s2", "--publication", "p2", "--print-sql"); r.code != 0 || r.stdout != want {
		t.Fatalf("setup --print-sql: %+v", r)
	}
	// The outbox-table mode's publication and slot.
	for range 2 {
		if r := cli(t, nil, "capture", "wal", "setup-outbox", "--db", dsn); r.code != 0 || !strings.Contains(r.stdout, "publication outbox_wal_table (inserts of watermill_outbox) and slot outbox_wal_table ready") {
			t.Fatalf("setup-outbox: %+v", r)
		}
	}
	if r := cli(t, nil, "capture", "wal", "status", "--db", dsn, "--slot", "outbox_wal_table"); r.code != 0 || !strings.Contains(r.stdout, "slot outbox_wal_table: active false, wal_status reserved") {
		t.Fatalf("status of the outbox slot: %+v", r)
	}
	want = "CREATE PUBLICATION \"p3\" FOR TABLE \"watermill_outbox\" WITH (publish = 'insert');\nSELECT pg_create_logical_replication_slot('s3', 'pgoutput');\n"
	if r := cli(t, nil, "capture", "wal", "setup-outbox", "--db", dsn, "--slot", "s3", "--publication", "p3", "--print-sql"); r.code != 0 || r.stdout != want {
		t.Fatalf("setup-outbox --print-sql: %+v", r)
	}
	if r := cli(t, nil, "capture", "wal", "drop", "--db", dsn, "--slot", "outbox_wal_table", "--publication", "outbox_wal_table"); r.code != 0 || !strings.Contains(r.stdout, "slot outbox_wal_table and publication outbox_wal_table dropped") {
		t.Fatalf("drop of the outbox slot: %+v", r)
	}
	if r := cli(t, nil, "capture", "wal", "drop", "--db", dsn); r.code != 0 || !strings.Contains(r.stdout, "slot outbox_wal and publication outbox_wal dropped") {
		t.Fatalf("drop: %+v", r)
	}
	if r := cli(t, nil, "capture", "wal", "status", "--db", dsn); r.code != 1 || !strings.Contains(r.stderr, "slot outbox_wal does not exist") {
		t.Fatalf("status after drop: %+v", r)
	}
}
