package outbox_test

// Regression tests for defects a review found in the first SQLite dialect commit (0b59bf1);
// each failed there.

import (
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-outbox/outbox"
)

func TestSQLitePublishInTxAllOrNothing(t *testing.T) {
	b := sqliteBackend(t)
	schema := b.table(t)
	// An event id that is already stored (a database error).
	dup := outbox.NewMessage([]byte(`1`))
	if err := b.publisher(t, outbox.PublisherConfig{Schema: schema}).Publish("t", dup); err != nil {
		t.Fatal(err)
	}
	tx, err := b.raw.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var msgs []*message.Message
	for i := 0; i < 700; i++ {
		msgs = append(msgs, outbox.NewMessage([]byte(`{}`)))
	}
	msgs[650] = outbox.NewMessage([]byte(`{}`))
	msgs[650].UUID = dup.UUID
	err = mustPublisher(t, tx, outbox.PublisherConfig{Schema: schema}).Publish("t", msgs...)
	t.Logf("Publish error: %v", err)
	if err == nil {
		t.Fatal("no error")
	}
	// The caller's tx is still usable on SQLite; a caller that commits its business write
	// after a failed Publish gets part of the events.
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if n := b.count(t, `SELECT count(*) FROM watermill_outbox`); n != 1 {
		t.Fatalf("Publish of 700 events failed, yet %d of them were committed with the caller's transaction", n-1)
	}
}

func TestSQLiteJSONDepthRefusedBeforeSQL(t *testing.T) {
	b := sqliteBackend(t)
	schema := b.table(t)
	p := b.publisher(t, outbox.PublisherConfig{Schema: schema})
	// PostgreSQL jsonb takes this (checked: depth 5000 is accepted); SQLite's json_valid stops at
	// depth 1000, so the CHECK constraint refuses it with a database error after validation
	// passed.
	payload := strings.Repeat("[", 1001) + strings.Repeat("]", 1001)
	err := p.Publish("t", outbox.NewMessage([]byte(payload)))
	var ve *outbox.ValidationError
	if !errors.As(err, &ve) || ve.Field != "payload" {
		t.Fatalf("payload nested 1001 deep: want a *ValidationError before SQL, got %v", err)
	}
	ok := strings.Repeat("[", 1000) + strings.Repeat("]", 1000)
	if err := p.Publish("t", outbox.NewMessage([]byte(ok))); err != nil {
		t.Fatalf("payload nested 1000 deep: %v", err)
	}
}

func TestSQLiteDSNEscapesPath(t *testing.T) {
	for _, name := range []string{"a#b", "c?d", "e%41f"} {
		dir := filepath.Join(t.TempDir(), name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, "outbox.db")
		db, err := sql.Open("sqlite", outbox.SQLiteDSN(path))
		if err != nil {
			t.Fatal(err)
		}
		var mode string
		var bt int
		err = db.QueryRowContext(ctx, `PRAGMA journal_mode`).Scan(&mode)
		db.QueryRowContext(ctx, `PRAGMA busy_timeout`).Scan(&bt)
		_, statErr := os.Stat(path)
		t.Logf("%s: err=%v journal_mode=%s busy_timeout=%d file at path exists=%v", name, err, mode, bt, statErr == nil)
		if err != nil || statErr != nil || mode != "wal" || bt != 10000 {
			t.Errorf("SQLiteDSN(%q) does not open that file with the outbox settings", path)
		}
		db.Close()
	}
}

func TestSQLiteIdentifiersAndExtraValues(t *testing.T) {
	b := sqliteBackend(t)
	schema := b.table(t, func(c *outbox.SchemaConfig) {
		c.Table = `we"ird tab; --`
		c.ExtraColumns = []outbox.Column{{Name: "meta", Type: "TEXT NULL"}}
	})
	p := b.publisher(t, outbox.PublisherConfig{Schema: schema})
	m := outbox.NewMessage([]byte(`{"x":1}`))
	outbox.SetOrderingKey(m, "k")
	if err := p.Publish("t", m); err != nil {
		t.Fatal(err)
	}
	ch, err := b.newSub(t, fastCfg(schema)).Subscribe(ctx, "t")
	if err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-ch:
		got.Ack()
	case <-time.After(3 * time.Second):
		t.Fatal("nothing delivered from a table with a quote in its name")
	}
	if err := outbox.CheckTable(ctx, b.db, schema); err != nil {
		t.Errorf("CheckTable: %v", err)
	}
	// SQLite identifiers are case-insensitive: Migrate and the relay accept the other case.
	upper := schema
	upper.Table = strings.ToUpper(schema.Table)
	if err := outbox.Migrate(ctx, b.db, upper); err != nil {
		t.Fatal(err)
	}
	if err := outbox.CheckTable(ctx, b.db, upper); err != nil {
		t.Errorf("CheckTable with the other letter case (Migrate accepted it as the same table): %v", err)
	}
	// Extra column values: PostgreSQL JSON-encodes them (EncodePayload rules) and stores them;
	// SQLite binds the Go value as is.
	for _, v := range []any{map[string]int{"a": 1}, []string{"x"}, time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC)} {
		m := outbox.NewMessage([]byte(`1`))
		outbox.SetExtraColumns(m, map[string]any{"meta": v})
		err := p.Publish("t", m)
		var stored sql.NullString
		if err == nil {
			b.raw.QueryRowContext(ctx, fmt.Sprintf(`SELECT meta FROM %s WHERE id = $1`, `"we""ird tab; --"`), m.UUID).Scan(&stored)
		}
		t.Logf("extra %T: err=%v stored=%q", v, err, stored.String)
		if err != nil {
			t.Errorf("extra column value %T: %v (PostgreSQL stores it JSON-encoded)", v, err)
		} else if tm, ok := v.(time.Time); ok && stored.String != tm.Format(time.RFC3339) {
			t.Errorf("extra column time stored as %q, EncodePayload rules give %q", stored.String, tm.Format(time.RFC3339))
		}
	}
}
