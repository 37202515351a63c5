package capture_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/capture"
)

// r replaces {t} (table) and {q} (schema.table) in an expected envelope.
func (h *harness) r(tb, s string) string {
	return strings.NewReplacer("{t}", tb, "{q}", h.prefix+"."+tb).Replace(s)
}

func (h *harness) w(tb, op, key, env string) want {
	return want{topic: tb + "." + op, key: key, env: h.r(tb, env)}
}

// inTx runs stmts in one transaction, committing when commit is true.
func (h *harness) inTx(commit bool, stmts ...string) {
	h.t.Helper()
	tx, err := h.db.BeginTx(ctx, nil)
	if err != nil {
		h.t.Fatal(err)
	}
	for _, q := range stmts {
		if _, err := tx.ExecContext(ctx, q); err != nil {
			_ = tx.Rollback()
			h.t.Fatalf("%s: %v", q, err)
		}
	}
	if commit {
		err = tx.Commit()
	} else {
		err = tx.Rollback()
	}
	if err != nil {
		h.t.Fatal(err)
	}
}

// TestRowChanges: insert, update (changed columns only), no-op update, delete, multi-row
// statements, upsert, savepoint and transaction rollback — exact envelopes on both dialects.
func TestRowChanges(t *testing.T) {
	eachDialect(t, func(t *testing.T, h *harness) {
		tb := h.table()
		h.exec(fmt.Sprintf(`CREATE TABLE %s (id INTEGER PRIMARY KEY, status TEXT NOT NULL, amount INTEGER)`, tb))
		for range 2 { // idempotent
			h.install(capture.Table{Name: tb})
		}
		k := func(id int) string { return fmt.Sprintf("%s:%d", tb, id) }
		h.expect([]want{h.w(tb, "inserted", k(7), `{"table":"{q}","operation":"inserted","pk":7,"changed":["id","status","amount"],"after":{"id":7,"status":"new","amount":100}}`)},
			fmt.Sprintf(`INSERT INTO %s VALUES (7, 'new', 100)`, tb))
		h.expect([]want{h.w(tb, "updated", k(7), `{"table":"{q}","operation":"updated","pk":7,"changed":["status"],"after":{"id":7,"status":"open","amount":100}}`)},
			fmt.Sprintf(`UPDATE %s SET status = 'open' WHERE id = 7`, tb))
		h.expect(nil, fmt.Sprintf(`UPDATE %s SET status = 'open', amount = 100 WHERE id = 7`, tb))
		h.expect([]want{h.w(tb, "updated", k(7), `{"table":"{q}","operation":"updated","pk":7,"changed":["amount"],"after":{"id":7,"status":"open","amount":null}}`)},
			fmt.Sprintf(`UPDATE %s SET amount = NULL WHERE id = 7`, tb))
		h.expect([]want{h.w(tb, "deleted", k(7), `{"table":"{q}","operation":"deleted","pk":7,"changed":["id","status","amount"],"before":{"id":7,"status":"open","amount":null}}`)},
			fmt.Sprintf(`DELETE FROM %s WHERE id = 7`, tb))

		// Multi-row statements: one event per row.
		h.exec(fmt.Sprintf(`INSERT INTO %s VALUES (1, 'a', 1), (2, 'b', 2), (3, 'c', 3)`, tb))
		since := h.lastSeq()
		h.exec(fmt.Sprintf(`UPDATE %s SET amount = amount * 10 WHERE id <= 2`, tb))
		got := h.events(since)
		if len(got) != 2 || got[0].Key != k(1) && got[0].Key != k(2) || got[0].Key == got[1].Key {
			t.Fatalf("multi-row update: %+v", got)
		}
		for _, g := range got {
			id, _ := g.Envelope["pk"].(json.Number).Int64()
			after := g.Envelope["after"].(map[string]any)
			if after["amount"] != json.Number(fmt.Sprint(id*10)) || fmt.Sprint(g.Envelope["changed"]) != "[amount]" {
				t.Fatalf("multi-row update event %+v", g.Envelope)
			}
		}
		since = h.lastSeq()
		h.exec(fmt.Sprintf(`DELETE FROM %s WHERE id IN (1, 3)`, tb))
		if got := h.events(since); len(got) != 2 || got[0].Envelope["operation"] != "deleted" || got[1].Envelope["operation"] != "deleted" {
			t.Fatalf("multi-row delete: %+v", got)
		}

		// Upsert: the conflicting row is an update, the new one an insert.
		h.expect([]want{
			h.w(tb, "updated", k(2), `{"table":"{q}","operation":"updated","pk":2,"changed":["status"],"after":{"id":2,"status":"x","amount":20}}`),
			h.w(tb, "inserted", k(9), `{"table":"{q}","operation":"inserted","pk":9,"changed":["id","status","amount"],"after":{"id":9,"status":"y","amount":null}}`),
		}, fmt.Sprintf(`INSERT INTO %s (id, status) VALUES (2, 'x'), (9, 'y') ON CONFLICT (id) DO UPDATE SET status = excluded.status`, tb))

		// Savepoint rollback drops the events of the rolled-back part; rollback drops all.
		since = h.lastSeq()
		h.inTx(true, fmt.Sprintf(`UPDATE %s SET status = 's1' WHERE id = 2`, tb), `SAVEPOINT sp`,
			fmt.Sprintf(`UPDATE %s SET status = 's2' WHERE id = 2`, tb), fmt.Sprintf(`INSERT INTO %s VALUES (50, 'gone', 0)`, tb), `ROLLBACK TO SAVEPOINT sp`)
		h.check(since, []want{h.w(tb, "updated", k(2), `{"table":"{q}","operation":"updated","pk":2,"changed":["status"],"after":{"id":2,"status":"s1","amount":20}}`)})
		since = h.lastSeq()
		h.inTx(false, fmt.Sprintf(`UPDATE %s SET status = 'rb' WHERE id = 2`, tb), fmt.Sprintf(`DELETE FROM %s WHERE id = 9`, tb))
		h.check(since, nil)

		// Uninstall: no more events; idempotent.
		for range 2 {
			if err := capture.Uninstall(ctx, h.db, h.schema, capture.Table{Name: tb}); err != nil {
				t.Fatal(err)
			}
		}
		h.expect(nil, fmt.Sprintf(`UPDATE %s SET status = 'after-uninstall' WHERE id = 2`, tb))
	})
}

// TestKeys: composite primary key, primary-key change, ON DELETE CASCADE of a captured child.
func TestKeys(t *testing.T) {
	eachDialect(t, func(t *testing.T, h *harness) {
		parent, child := h.table(), h.table()
		h.exec(fmt.Sprintf(`CREATE TABLE %s (id INTEGER PRIMARY KEY, name TEXT)`, parent),
			fmt.Sprintf(`CREATE TABLE %s (parent_id INTEGER NOT NULL REFERENCES %s (id) ON DELETE CASCADE ON UPDATE CASCADE, line INTEGER NOT NULL, qty INTEGER, PRIMARY KEY (parent_id, line))`, child, parent))
		h.install(capture.Table{Name: parent}, capture.Table{Name: child, Payload: capture.PayloadBeforeAndAfter})
		h.exec(fmt.Sprintf(`INSERT INTO %s VALUES (1, 'p')`, parent))
		h.expect([]want{h.w(child, "inserted", child+":1:2", `{"table":"{q}","operation":"inserted","pk":{"parent_id":1,"line":2},"changed":["parent_id","line","qty"],"before":null,"after":{"parent_id":1,"line":2,"qty":5}}`)},
			fmt.Sprintf(`INSERT INTO %s VALUES (1, 2, 5)`, child))
		// A key change is captured under the new key, the old key in "before".
		since := h.lastSeq()
		h.exec(fmt.Sprintf(`UPDATE %s SET id = 3 WHERE id = 1`, parent))
		h.checkAnyTableOrder(since, []want{
			h.w(parent, "updated", parent+":3", h.r(parent, `{"table":"{q}","operation":"updated","pk":3,"changed":["id"],"after":{"id":3,"name":"p"},"before":{"id":1}}`)),
			h.w(child, "updated", child+":3:2", `{"table":"{q}","operation":"updated","pk":{"parent_id":3,"line":2},"changed":["parent_id"],"before":{"parent_id":1,"line":2,"qty":5},"after":{"parent_id":3,"line":2,"qty":5}}`),
		})
		// Several keys changed by one statement: each event pairs a row's old and new
		// versions (PostgreSQL's statement trigger pairs them by position).
		h.exec(fmt.Sprintf(`INSERT INTO %s VALUES (11, 'a'), (12, 'b'), (13, 'c')`, parent))
		since = h.lastSeq()
		h.exec(fmt.Sprintf(`UPDATE %s SET id = id + 10, name = name || '!' WHERE id > 10`, parent))
		got := h.events(since)
		if len(got) != 3 {
			t.Fatalf("multi-row key change: %d events", len(got))
		}
		for _, g := range got {
			pk, _ := g.Envelope["pk"].(json.Number).Int64()
			old, _ := g.Envelope["before"].(map[string]any)["id"].(json.Number).Int64()
			name := g.Envelope["after"].(map[string]any)["name"]
			if old != pk-10 || name != map[int64]string{21: "a!", 22: "b!", 23: "c!"}[pk] || g.Key != fmt.Sprintf("%s:%d", parent, pk) {
				t.Fatalf("multi-row key change event %v (key %s)", g.Envelope, g.Key)
			}
		}
		h.exec(fmt.Sprintf(`DELETE FROM %s WHERE id > 20`, parent))
		// The database's own cascade is captured.
		since = h.lastSeq()
		h.exec(fmt.Sprintf(`DELETE FROM %s WHERE id = 3`, parent))
		got = h.events(since)
		if len(got) != 2 {
			t.Fatalf("cascade: %d events, want 2", len(got))
		}
		byTable := map[string]captured{}
		for _, g := range got {
			byTable[g.Envelope["table"].(string)] = g
		}
		if c := byTable[h.prefix+"."+child]; c.Key != child+":3:2" || c.Envelope["operation"] != "deleted" || c.Envelope["after"] != nil {
			t.Fatalf("cascaded child delete: %+v", c)
		}
		if p := byTable[h.prefix+"."+parent]; p.Key != parent+":3" || p.Envelope["operation"] != "deleted" {
			t.Fatalf("parent delete: %+v", p)
		}
	})
}

// TestDeclarations: payload modes, Fields/Exclude, templates, Extend (SQL) and the
// transaction's extension.
func TestDeclarations(t *testing.T) {
	eachDialect(t, func(t *testing.T, h *harness) {
		keys, fields, excl, tmpl := h.table(), h.table(), h.table(), h.table()
		for _, tb := range []string{keys, fields, excl, tmpl} {
			h.exec(fmt.Sprintf(`CREATE TABLE %s (id INTEGER PRIMARY KEY, tenant TEXT, status TEXT, token TEXT)`, tb))
		}
		h.install(
			capture.Table{Name: keys, Payload: capture.PayloadKeys, Operations: []capture.Operation{capture.Updated, capture.Deleted}},
			capture.Table{Name: fields, Fields: []string{"status"}},
			capture.Table{Name: excl, Exclude: []string{"token"}, Payload: capture.PayloadBeforeAndAfter},
			capture.Table{Name: tmpl, Topic: "cdc.{schema}.{table}.{operation}", OrderingKey: "{schema}/{table}/{pk}",
				Extend: capture.Extend{Payload: map[string]string{"tenant_id": "{row}.tenant"}, Headers: map[string]string{"tenant": "{row}.tenant", "none": "NULL"}}},
		)
		for _, tb := range []string{keys, fields, excl, tmpl} {
			h.exec(fmt.Sprintf(`INSERT INTO %s VALUES (1, 'acme', 'new', 'secret')`, tb))
		}
		since := h.lastSeq()
		for _, tb := range []string{keys, fields, excl, tmpl} {
			h.exec(fmt.Sprintf(`UPDATE %s SET status = 'open', token = 'other' WHERE id = 1`, tb))
		}
		// Fields: a change of an uncarried column alone writes nothing.
		h.exec(fmt.Sprintf(`UPDATE %s SET token = 'again' WHERE id = 1`, fields))
		h.check(since, []want{
			h.w(keys, "updated", keys+":1", h.r(keys, `{"table":"{q}","operation":"updated","pk":1,"changed":["status","token"]}`)),
			h.w(fields, "updated", fields+":1", h.r(fields, `{"table":"{q}","operation":"updated","pk":1,"changed":["status"],"after":{"status":"open"}}`)),
			h.w(excl, "updated", excl+":1", h.r(excl, `{"table":"{q}","operation":"updated","pk":1,"changed":["status"],"before":{"id":1,"tenant":"acme","status":"new"},"after":{"id":1,"tenant":"acme","status":"open"}}`)),
			{topic: "cdc." + h.prefix + "." + tmpl + ".updated", key: h.prefix + "/" + tmpl + "/1", headers: map[string]string{"tenant": "acme"},
				env: h.r(tmpl, `{"table":"{q}","operation":"updated","pk":1,"changed":["status","token"],"after":{"id":1,"tenant":"acme","status":"open","token":"other"},"tenant_id":"acme"}`)},
		})

		// The transaction's extension: headers and payload keys on every captured change of
		// the scope, none after it.
		since = h.lastSeq()
		tx, err := h.db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		ext := capture.Extension{Headers: map[string]string{"author": "ann"}, Payload: map[string]any{"reason": "audit"}}
		err = capture.WithExtension(ctx, tx, h.schema, ext, func() error {
			_, err := tx.ExecContext(ctx, fmt.Sprintf(`UPDATE %s SET status = 'ext' WHERE id = 1`, tmpl))
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.ExecContext(ctx, fmt.Sprintf(`UPDATE %s SET status = 'plain' WHERE id = 1`, tmpl)); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		h.check(since, []want{
			{topic: "cdc." + h.prefix + "." + tmpl + ".updated", key: h.prefix + "/" + tmpl + "/1", headers: map[string]string{"tenant": "acme", "author": "ann"},
				env: h.r(tmpl, `{"table":"{q}","operation":"updated","pk":1,"changed":["status"],"after":{"id":1,"tenant":"acme","status":"ext","token":"other"},"tenant_id":"acme","reason":"audit"}`)},
			{topic: "cdc." + h.prefix + "." + tmpl + ".updated", key: h.prefix + "/" + tmpl + "/1", headers: map[string]string{"tenant": "acme"},
				env: h.r(tmpl, `{"table":"{q}","operation":"updated","pk":1,"changed":["status"],"after":{"id":1,"tenant":"acme","status":"plain","token":"other"},"tenant_id":"acme"}`)},
		})
		// Keys mode without inserts captured: an insert writes nothing.
		h.expect(nil, fmt.Sprintf(`INSERT INTO %s VALUES (2, 'acme', 'new', 'secret')`, keys))
	})
}

// TestSetExtensionAndColumns (PostgreSQL): the transaction-scoped extension via set_config,
// extra outbox columns from Extend and from the extension.
func TestSetExtensionAndColumns(t *testing.T) {
	h := pgHarness(t, func(s *outbox.SchemaConfig) {
		s.ExtraColumns = []outbox.Column{{Name: "tenant", Type: "TEXT NULL"}, {Name: "author", Type: "TEXT NULL"}}
	})
	tb := h.table()
	h.exec(fmt.Sprintf(`CREATE TABLE %s (id INTEGER PRIMARY KEY, tenant TEXT, status TEXT)`, tb))
	h.install(capture.Table{Name: tb, Payload: capture.PayloadKeys, Extend: capture.Extend{Columns: map[string]string{"tenant": "{row}.tenant"}}})
	since := h.lastSeq()
	tx, err := h.db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	mustExec := func(q string) {
		if _, err := tx.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	mustExec(fmt.Sprintf(`INSERT INTO %s VALUES (1, 'acme', 'new')`, tb))
	if err := capture.SetExtension(ctx, tx, h.schema, capture.Extension{Headers: map[string]string{"author": "bob"}, Columns: map[string]any{"author": "bob"}}); err != nil {
		t.Fatal(err)
	}
	mustExec(fmt.Sprintf(`UPDATE %s SET status = 'x' WHERE id = 1`, tb))
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	h.check(since, []want{
		h.w(tb, "inserted", tb+":1", `{"table":"{q}","operation":"inserted","pk":1,"changed":["id","tenant","status"]}`),
		{topic: tb + ".updated", key: tb + ":1", headers: map[string]string{"author": "bob"}, env: h.r(tb, `{"table":"{q}","operation":"updated","pk":1,"changed":["status"]}`)},
	})
	rows, err := h.db.QueryContext(ctx, fmt.Sprintf(`SELECT tenant, coalesce(author, '-') FROM %s WHERE "sequence" > $1 ORDER BY "sequence"`, quote(h.schema)), since)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var got []string
	for rows.Next() {
		var a, b string
		if err := rows.Scan(&a, &b); err != nil {
			t.Fatal(err)
		}
		got = append(got, a+"/"+b)
	}
	if strings.Join(got, ",") != "acme/-,acme/bob" {
		t.Fatalf("extra columns %v, want acme/-,acme/bob", got)
	}
	// A later transaction does not see the extension.
	h.expect([]want{h.w(tb, "updated", tb+":1", `{"table":"{q}","operation":"updated","pk":1,"changed":["status"]}`)}, fmt.Sprintf(`UPDATE %s SET status = 'y' WHERE id = 1`, tb))
}
