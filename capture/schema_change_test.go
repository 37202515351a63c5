package capture_test

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/watermill-outbox/outbox/capture"
)

// TestColumnNamedLikeTriggerVariable: a captured table may have a column named like one of the
// trigger function's variables (occurred_at, ext, ms, uuid_prefix): they are qualified by the
// function's block label. Unqualified, every write failed with "column reference … is
// ambiguous".
func TestColumnNamedLikeTriggerVariable(t *testing.T) {
	for _, col := range []string{"occurred_at", "ext", "ms", "uuid_prefix"} {
		t.Run(col, func(t *testing.T) {
			h := pgHarness(t, nil)
			tb := h.table()
			h.exec(fmt.Sprintf(`CREATE TABLE %s (id int PRIMARY KEY, %s text)`, tb, col))
			h.install(capture.Table{Name: tb})
			since := h.lastSeq()
			if _, err := h.db.ExecContext(ctx, fmt.Sprintf(`INSERT INTO %s VALUES (1, 'x')`, tb)); err != nil {
				t.Fatalf("write to a captured table with a column %q: %v", col, err)
			}
			if n := len(h.events(since)); n != 1 {
				t.Fatalf("%d events, want 1", n)
			}
		})
	}
}

// TestKeyChangeCapturedWhenKeyNotCarried: a primary-key change is captured under the new key
// also when Fields does not name the key (no carried column changed: no event was written).
func TestKeyChangeCapturedWhenKeyNotCarried(t *testing.T) {
	eachDialect(t, func(t *testing.T, h *harness) {
		tb := h.table()
		h.exec(fmt.Sprintf(`CREATE TABLE %s (id INTEGER PRIMARY KEY, status TEXT)`, tb))
		h.install(capture.Table{Name: tb, Fields: []string{"status"}})
		h.exec(fmt.Sprintf(`INSERT INTO %s VALUES (7, 'a')`, tb))
		h.expect([]want{h.w(tb, "updated", tb+":8", `{"table":"{q}","operation":"updated","pk":8,"changed":[],"after":{"status":"a"},"before":{"id":7}}`)},
			fmt.Sprintf(`UPDATE %s SET id = 8 WHERE id = 7`, tb))
	})
}

// TestInfinityTimestamptz: timestamptz 'infinity' renders as "infinity" (it rendered as null,
// the same as a NULL value).
func TestInfinityTimestamptz(t *testing.T) {
	h := pgHarness(t, nil)
	tb := h.table()
	h.exec(fmt.Sprintf(`CREATE TABLE %s (id int PRIMARY KEY, until timestamptz)`, tb))
	h.install(capture.Table{Name: tb})
	h.expect([]want{h.w(tb, "inserted", tb+":1", `{"table":"{q}","operation":"inserted","pk":1,"changed":["id","until"],"after":{"id":1,"until":"infinity"}}`)},
		fmt.Sprintf(`INSERT INTO %s VALUES (1, 'infinity')`, tb))
}

// TestSQLiteBlobInTextColumn: SQLite: a TEXT column holding a BLOB (what database/sql writes
// for a []byte argument) is read as text; json_object refused it and failed the user's write.
func TestSQLiteBlobInTextColumn(t *testing.T) {
	h := sqliteHarness(t, nil)
	tb := h.table()
	h.exec(fmt.Sprintf(`CREATE TABLE %s (id INTEGER PRIMARY KEY, note TEXT)`, tb))
	h.install(capture.Table{Name: tb})
	if _, err := h.db.ExecContext(ctx, fmt.Sprintf(`INSERT INTO %s VALUES (1, ?)`, tb), []byte("hello")); err != nil {
		t.Fatalf("write of a []byte into a TEXT column of a captured table: %v", err)
	}
}

// TestAddedColumnNotCarried: a column added after Install is not carried until Install runs
// again, past a Fields whitelist too. The whole-row image (to_jsonb(row) minus the columns known
// at install) carried it, in "after" and "before".
func TestAddedColumnNotCarried(t *testing.T) {
	h := pgHarness(t, nil)
	tb := h.table()
	h.exec(fmt.Sprintf(`CREATE TABLE %s (id int PRIMARY KEY, status text, amount int, note text)`, tb))
	h.install(capture.Table{Name: tb, Fields: []string{"id", "status", "amount"}})
	h.exec(fmt.Sprintf(`ALTER TABLE %s ADD COLUMN password_hash text`, tb))
	h.expect([]want{h.w(tb, "inserted", tb+":1", `{"table":"{q}","operation":"inserted","pk":1,"changed":["id","status","amount"],"after":{"id":1,"status":"a","amount":5}}`)},
		fmt.Sprintf(`INSERT INTO %s VALUES (1, 'a', 5, 'n', 'secret-hash')`, tb))
}

// TestRenamedExcludedColumnNotCarried: an excluded column renamed after Install stays out of the
// events (it was no longer subtracted from the whole-row image).
func TestRenamedExcludedColumnNotCarried(t *testing.T) {
	h := pgHarness(t, nil)
	tb := h.table()
	h.exec(fmt.Sprintf(`CREATE TABLE %s (id int PRIMARY KEY, status text, amount int, token text)`, tb))
	h.install(capture.Table{Name: tb, Exclude: []string{"token"}})
	h.exec(fmt.Sprintf(`ALTER TABLE %s RENAME COLUMN token TO api_token`, tb))
	h.expect([]want{h.w(tb, "inserted", tb+":1", `{"table":"{q}","operation":"inserted","pk":1,"changed":["id","status","amount"],"after":{"id":1,"status":"a","amount":5}}`)},
		fmt.Sprintf(`INSERT INTO %s VALUES (1, 'a', 5, 'secret')`, tb))
}

// TestDroppedColumnFailsTheWrite: a carried column dropped after Install makes the trigger, so
// the write, fail loudly until Install runs again (an INSERT succeeded and named the dropped
// column in "changed").
func TestDroppedColumnFailsTheWrite(t *testing.T) {
	h := pgHarness(t, nil)
	tb := h.table()
	h.exec(fmt.Sprintf(`CREATE TABLE %s (id int PRIMARY KEY, status text, amount int, gone text)`, tb))
	h.install(capture.Table{Name: tb})
	h.exec(fmt.Sprintf(`ALTER TABLE %s DROP COLUMN gone`, tb))
	since := h.lastSeq()
	_, err := h.db.ExecContext(ctx, fmt.Sprintf(`INSERT INTO %s VALUES (1, 'a', 5)`, tb))
	if err == nil {
		got := h.events(since)
		t.Fatalf("INSERT after DROP COLUMN succeeded (doc: fails loudly); event: %v", got[0].Envelope)
	}
}

// TestQuotedColumnNames: column names that need quoting, in the image, pk, changed and before.
func TestQuotedColumnNames(t *testing.T) {
	h := pgHarness(t, nil)
	tb := h.table()
	h.exec(fmt.Sprintf(`CREATE TABLE %s ("Id" int PRIMARY KEY, "select" text, "it's" numeric, "a""b" int)`, tb))
	h.install(capture.Table{Name: tb})
	h.expect([]want{h.w(tb, "inserted", tb+":1", `{"table":"{q}","operation":"inserted","pk":1,"changed":["Id","select","it's","a\"b"],"after":{"Id":1,"select":"s","it's":"1.50","a\"b":2}}`)},
		fmt.Sprintf(`INSERT INTO %s VALUES (1, 's', 1.50, 2)`, tb))
	h.expect([]want{h.w(tb, "updated", tb+":2", `{"table":"{q}","operation":"updated","pk":2,"changed":["Id","it's"],"after":{"Id":2,"select":"s","it's":"2.50","a\"b":2},"before":{"Id":1}}`)},
		fmt.Sprintf(`UPDATE %s SET "Id" = 2, "it's" = 2.50`, tb))
}

// TestNoInjectionThroughTableName: a schema or table name holding a newline and the function
// body's dollar-quote tag cannot end the body early: the comment line replaces newlines and the
// tag is one the body does not contain. It ran its own SQL in the installer's session (here a
// DROP TABLE of an unrelated table), and the trigger it installed wrote no event.
func TestNoInjectionThroughTableName(t *testing.T) {
	h := pgHarness(t, nil)
	victim := fmt.Sprintf("capture_victim_%d", os.Getpid()) // short: a name has at most 63 bytes
	h.exec(fmt.Sprintf(`CREATE TABLE %s (x int)`, victim))
	t.Cleanup(func() { _, _ = h.db.ExecContext(ctx, `DROP TABLE IF EXISTS `+victim) })
	schemaName := "x\nBEGIN END$outbox_capture$;DROP TABLE IF EXISTS public"
	tableName := victim + ";SELECT $outbox_capture$"
	qs, qt := `"`+schemaName+`"`, `"`+tableName+`"`
	h.exec(`CREATE SCHEMA `+qs, fmt.Sprintf(`CREATE TABLE %s.%s (id int PRIMARY KEY)`, qs, qt))
	t.Cleanup(func() { _, _ = h.db.ExecContext(ctx, `DROP SCHEMA `+qs+` CASCADE`) })
	err := capture.Install(ctx, h.db, h.schema, capture.Table{Name: schemaName + "." + tableName, Topic: "odd.{operation}", Unordered: true})
	var exists bool
	if qerr := h.db.QueryRowContext(ctx, `SELECT to_regclass($1) IS NOT NULL`, victim).Scan(&exists); qerr != nil {
		t.Fatal(qerr)
	}
	if !exists {
		t.Fatalf("Install (err %v) dropped the unrelated table %s", err, victim)
	}
}

// TestLongUTF8TableName: a long table name is cut for the function name on a character
// boundary (cut at byte 30 it split a UTF-8 character, and Install failed).
func TestLongUTF8TableName(t *testing.T) {
	h := pgHarness(t, nil)
	tb := "a" + strings.Repeat("表", 20) // 61 bytes, + "_outbox_capture" is more than 63
	h.exec(fmt.Sprintf(`CREATE TABLE %q (id int PRIMARY KEY)`, tb))
	t.Cleanup(func() { _, _ = h.db.ExecContext(ctx, fmt.Sprintf(`DROP TABLE IF EXISTS %q`, tb)) })
	h.install(capture.Table{Name: tb})
}

// TestSQLiteGeneratedColumnCarried: SQLite carries generated columns as PostgreSQL does
// (pragma_table_info leaves them out: they were never carried).
func TestSQLiteGeneratedColumnCarried(t *testing.T) {
	h := sqliteHarness(t, nil)
	tb := h.table()
	h.exec(fmt.Sprintf(`CREATE TABLE %s (id INTEGER PRIMARY KEY, v INTEGER, g INTEGER GENERATED ALWAYS AS (v * 2) STORED)`, tb))
	h.install(capture.Table{Name: tb})
	h.expect([]want{h.w(tb, "inserted", tb+":1", `{"table":"{q}","operation":"inserted","pk":1,"changed":["id","v","g"],"after":{"id":1,"v":2,"g":4}}`)},
		fmt.Sprintf(`INSERT INTO %s (id, v) VALUES (1, 2)`, tb))
}
