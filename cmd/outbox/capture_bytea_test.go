package main

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/internal/pgtest"
)

// TestCaptureCLIByteaOutbox: "outbox capture install" into an outbox the library migrated with
// PayloadType BYTEA writes the payload the column's way: the command builds its SchemaConfig
// from --db and --outbox-table only, so it generated a jsonb payload for the bytea column, and
// every write to the captured table failed.
func TestCaptureCLIByteaOutbox(t *testing.T) {
	pool := pgtest.Require(t)
	ctx := context.Background()
	dsn := pgtest.DSN()
	ob, tb := pgtest.Table(t), pgtest.Table(t)
	if err := outbox.Migrate(ctx, pgtest.StdDB(t), outbox.SchemaConfig{Table: ob, PayloadType: outbox.PayloadBytea}); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE %s (id int PRIMARY KEY, status text)`, tb)); err != nil {
		t.Fatal(err)
	}
	if r := cli(t, nil, "capture", "install", "--db", dsn, "--outbox-table", ob, "--table", tb); r.code != 0 || !strings.Contains(r.stdout, "capture triggers installed") {
		t.Fatalf("capture install: %+v", r)
	}
	if _, err := pool.Exec(ctx, fmt.Sprintf(`INSERT INTO %s VALUES (1, 'a')`, tb)); err != nil {
		t.Fatalf("write to the table captured by the CLI into a BYTEA outbox: %v", err)
	}
}
