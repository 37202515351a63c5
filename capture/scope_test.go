package capture_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/capture"
)

// TestScopeFromRow: with a multi-tenant outbox (SchemaConfig.IdempotencyScope), a captured
// row's tenant column fills the outbox's scope column without any Extend.Columns; an explicit
// Extend.Columns entry still wins.
func TestScopeFromRow(t *testing.T) {
	scoped := func(s *outbox.SchemaConfig) {
		s.ExtraColumns = []outbox.Column{{Name: "tenant", Type: "TEXT NULL"}}
		s.IdempotencyScope = []string{"tenant"}
	}
	for name, h := range map[string]func(*testing.T) *harness{
		"postgresql": func(t *testing.T) *harness { return pgHarness(t, scoped) },
		"sqlite":     func(t *testing.T) *harness { return sqliteHarness(t, scoped) },
	} {
		t.Run(name, func(t *testing.T) {
			h := h(t)
			plain, explicit := h.table(), h.table()
			for _, tb := range []string{plain, explicit} {
				h.exec(fmt.Sprintf(`CREATE TABLE %s (id INTEGER PRIMARY KEY, tenant TEXT, status TEXT)`, tb))
			}
			h.install(capture.Table{Name: plain, Payload: capture.PayloadKeys},
				capture.Table{Name: explicit, Payload: capture.PayloadKeys, Extend: capture.Extend{Columns: map[string]string{"tenant": "'fixed'"}}})
			since := h.lastSeq()
			h.exec(fmt.Sprintf(`INSERT INTO %s VALUES (1, 'acme', 'new')`, plain),
				fmt.Sprintf(`INSERT INTO %s VALUES (2, 'globex', 'new')`, plain),
				fmt.Sprintf(`UPDATE %s SET status = 'x' WHERE id = 2`, plain),
				fmt.Sprintf(`INSERT INTO %s VALUES (1, 'acme', 'new')`, explicit))
			rows, err := h.db.QueryContext(ctx, fmt.Sprintf(`SELECT "topic", coalesce(tenant, '-') FROM %s WHERE "sequence" > $1 ORDER BY "sequence"`, quote(h.schema)), since)
			if err != nil {
				t.Fatal(err)
			}
			defer rows.Close()
			var got []string
			for rows.Next() {
				var topic, tenant string
				if err := rows.Scan(&topic, &tenant); err != nil {
					t.Fatal(err)
				}
				got = append(got, strings.TrimPrefix(strings.TrimPrefix(topic, plain+"."), explicit+".")+"/"+tenant)
			}
			if err := rows.Err(); err != nil {
				t.Fatal(err)
			}
			if want := "inserted/acme,inserted/globex,updated/globex,inserted/fixed"; strings.Join(got, ",") != want {
				t.Fatalf("captured events %v, want %s", got, want)
			}
		})
	}
}
