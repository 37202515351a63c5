package capture_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/capture"
)

// triggers counts the capture triggers and functions in the database.
func (h *harness) triggers() int {
	h.t.Helper()
	q := `SELECT (SELECT count(*) FROM pg_trigger WHERE tgname LIKE 'outbox_capture%') + (SELECT count(*) FROM pg_proc WHERE proname LIKE '%outbox_capture')`
	if h.sqlite {
		q = `SELECT count(*) FROM sqlite_master WHERE type = 'trigger'`
	}
	var n int
	if err := h.db.QueryRowContext(ctx, q).Scan(&n); err != nil {
		h.t.Fatal(err)
	}
	return n
}

// TestValidation: every refused declaration is a typed error at install, with nothing
// installed — not even the valid declaration given with it.
func TestValidation(t *testing.T) {
	eachDialect(t, func(t *testing.T, h *harness) {
		ok, nopk, odd := h.table(), h.table(), h.table()
		h.exec(fmt.Sprintf(`CREATE TABLE %s (id INTEGER PRIMARY KEY, name TEXT)`, ok),
			fmt.Sprintf(`CREATE TABLE %s (a INTEGER, b TEXT)`, nopk))
		oddType := "point"
		if h.sqlite {
			oddType = "NUMERIC(10,2)"
		}
		h.exec(fmt.Sprintf(`CREATE TABLE %s (id INTEGER PRIMARY KEY, odd %s)`, odd, oddType))
		outboxName := h.schema.Table
		if outboxName == "" {
			outboxName = outbox.DefaultTable
		}
		before := h.triggers()
		cases := []struct {
			name  string
			table capture.Table
			field string
			err   error
		}{
			{"unknown table", capture.Table{Name: "no_such_table"}, "Table[1].Name", capture.ErrUnknownTable},
			{"empty name", capture.Table{}, "Table[1].Name", capture.ErrUnknownTable},
			{"unknown field", capture.Table{Name: ok, Fields: []string{"nope"}}, "Table[1].Fields", capture.ErrUnknownColumn},
			{"unknown excluded", capture.Table{Name: ok, Exclude: []string{"nope"}}, "Table[1].Exclude", capture.ErrUnknownColumn},
			{"unknown key column", capture.Table{Name: nopk, Key: []string{"nope"}}, "Table[1].Key", capture.ErrUnknownColumn},
			{"fields and exclude", capture.Table{Name: ok, Fields: []string{"name"}, Exclude: []string{"id"}}, "Table[1].Fields", capture.ErrFieldsAndExclude},
			{"topic template", capture.Table{Name: ok, Topic: "{table}.{op}"}, "Table[1].Topic", capture.ErrTemplate},
			{"key template", capture.Table{Name: ok, OrderingKey: "{table}:{operation}"}, "Table[1].OrderingKey", capture.ErrTemplate},
			{"unbalanced template", capture.Table{Name: ok, Topic: "{table"}, "Table[1].Topic", capture.ErrTemplate},
			{"no primary key", capture.Table{Name: nopk}, "Table[1].Key", capture.ErrNoPrimaryKey},
			{"no primary key, {pk} template", capture.Table{Name: nopk, OrderingKey: "x:{pk}"}, "Table[1].Key", capture.ErrNoPrimaryKey},
			{"outbox table", capture.Table{Name: outboxName}, "Table[1].Name", capture.ErrOutboxTable},
			{"envelope key extension", capture.Table{Name: ok, Extend: capture.Extend{Payload: map[string]string{"pk": "1"}}}, "Table[1].Extend.Payload", capture.ErrInvalid},
			{"unknown extra column", capture.Table{Name: ok, Extend: capture.Extend{Columns: map[string]string{"tenant": "1"}}}, "Table[1].Extend.Columns", capture.ErrInvalid},
			{"unknown operation", capture.Table{Name: ok, Operations: []capture.Operation{capture.Truncated}}, "Table[1].Operations", capture.ErrInvalid},
			{"declared twice", capture.Table{Name: ok}, "Table[1].Name", capture.ErrInvalid},
		}
		for _, c := range cases {
			err := capture.Install(ctx, h.db, h.schema, capture.Table{Name: ok}, c.table)
			var ce *outbox.ConfigError
			if !errors.As(err, &ce) || !errors.Is(err, outbox.ErrConfig) || !errors.Is(err, c.err) || ce.Field != c.field {
				t.Fatalf("%s: %v (field %q), want %q %v", c.name, err, fieldOf(ce), c.field, c.err)
			}
			if _, err := capture.SQL(ctx, h.db, h.schema, capture.Table{Name: ok}, c.table); !errors.Is(err, c.err) {
				t.Fatalf("%s: SQL: %v, want %v", c.name, err, c.err)
			}
			if n := h.triggers(); n != before {
				t.Fatalf("%s: %d triggers after a refused install, want %d", c.name, n, before)
			}
		}
		// An unsupported type names the column; leaving it out installs.
		err := capture.Install(ctx, h.db, h.schema, capture.Table{Name: odd})
		var te *capture.UnsupportedTypeError
		if !errors.As(err, &te) || te.Column != "odd" || te.Table != h.prefix+"."+odd || !errors.Is(err, outbox.ErrConfig) {
			t.Fatalf("unsupported type: %v", err)
		}
		if n := h.triggers(); n != before {
			t.Fatalf("%d triggers after a refused install, want %d", n, before)
		}
		h.install(capture.Table{Name: odd, Exclude: []string{"odd"}})
		// A table without a primary key installs with Key or unordered (then "pk" is null).
		h.install(capture.Table{Name: nopk, Key: []string{"a"}})
		h.expect([]want{h.w(nopk, "inserted", nopk+":1", `{"table":"{q}","operation":"inserted","pk":1,"changed":["a","b"],"after":{"a":1,"b":"x"}}`)},
			fmt.Sprintf(`INSERT INTO %s VALUES (1, 'x')`, nopk))
		h.install(capture.Table{Name: nopk, Unordered: true, Payload: capture.PayloadKeys})
		h.expect([]want{{topic: nopk + ".inserted", env: h.r(nopk, `{"table":"{q}","operation":"inserted","pk":null,"changed":["a","b"]}`)}},
			fmt.Sprintf(`INSERT INTO %s VALUES (2, 'y')`, nopk))
		// The outbox table must exist.
		missing := h.schema
		missing.Table = "no_outbox_here"
		if err := capture.Install(ctx, h.db, missing, capture.Table{Name: ok}); !errors.Is(err, capture.ErrOutboxTable) {
			t.Fatalf("missing outbox table: %v", err)
		}
		// A handle that is not a database.
		if err := capture.Install(ctx, "db", h.schema, capture.Table{Name: ok}); !errors.Is(err, outbox.ErrUnsupportedDB) {
			t.Fatalf("bad handle: %v", err)
		}
	})
}

func fieldOf(ce *outbox.ConfigError) string {
	if ce == nil {
		return ""
	}
	return ce.Field
}
