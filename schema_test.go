package outbox_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/internal/pgtest"
)

// TestFillFactor: Migrate creates the table with the configured fillfactor (default 50) and
// sets it on an existing table; with the default, a lease write (lease_until, leased_by) is a
// heap-only tuple update for most rows, with full pages for almost none.
func TestFillFactor(t *testing.T) {
	pool := pgtest.Require(t)
	b := pgBackend(t)
	reloptions := func(table string) string {
		var opts string
		if err := pool.QueryRow(ctx, `SELECT coalesce(array_to_string(reloptions, ','), '') FROM pg_class WHERE oid = $1::regclass`, fmt.Sprintf("%q", table)).Scan(&opts); err != nil {
			t.Fatal(err)
		}
		return opts
	}
	// hotLeases seeds 1,000 events and leases them all in one UPDATE, like a claim; it returns
	// how many of the row updates were heap-only (the transaction's own statistics).
	hotLeases := func(schema outbox.SchemaConfig) int {
		b.seed(t, schema, "t", 1000, []string{"", "k1", "k2"})
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		if _, err := tx.Exec(ctx, fmt.Sprintf(`UPDATE %q SET lease_until = now() + interval '1 minute', leased_by = 'relay#0123456789ab#1'`, schema.Table)); err != nil {
			t.Fatal(err)
		}
		var hot int
		if err := tx.QueryRow(ctx, `SELECT pg_stat_get_xact_tuples_hot_updated($1::regclass)`, fmt.Sprintf("%q", schema.Table)).Scan(&hot); err != nil {
			t.Fatal(err)
		}
		t.Logf("SchemaConfig.FillFactor %d (0: the default): %d of 1000 lease writes heap-only", schema.FillFactor, hot)
		return hot
	}

	def := b.table(t)
	if got := reloptions(def.Table); got != "fillfactor=50" {
		t.Fatalf("default table options %q, want fillfactor=50", got)
	}
	if hot := hotLeases(def); hot < 700 {
		t.Fatalf("fillfactor 50: %d of 1000 lease writes were heap-only, want at least 700", hot)
	}

	full := b.table(t, func(c *outbox.SchemaConfig) { c.FillFactor = 100 })
	if got := reloptions(full.Table); got != "fillfactor=100" {
		t.Fatalf("table options %q, want fillfactor=100", got)
	}
	if hot := hotLeases(full); hot > 100 {
		t.Fatalf("fillfactor 100: %d of 1000 lease writes were heap-only, want at most 100 (full pages)", hot)
	}

	// An existing table gets the configured value on the next Migrate.
	full.FillFactor = 80
	if err := outbox.Migrate(ctx, pool, full); err != nil {
		t.Fatal(err)
	}
	if got := reloptions(full.Table); got != "fillfactor=80" {
		t.Fatalf("after Migrate with 80: table options %q", got)
	}
	ddl, err := outbox.SchemaSQL(full)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(ddl, ") WITH (fillfactor = 80);") || !strings.Contains(ddl, "SET (fillfactor = 80);") {
		t.Fatalf("SchemaSQL does not set fillfactor 80:\n%s", ddl)
	}
}
