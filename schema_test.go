package outbox_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/internal/pgtest"
)

// TestFillFactor: Migrate creates the table with the configured fillfactor (default 50) and
// sets an explicitly configured one on an existing table, but not the default. With the
// default, a lease write (lease_until, leased_by) is a heap-only tuple update for most rows;
// with full pages, for almost none.
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

	// An existing table keeps its fillfactor under the default config (an operator may have
	// tuned it) and gets an explicitly configured one on the next Migrate.
	if _, err := pool.Exec(ctx, fmt.Sprintf(`ALTER TABLE %q SET (fillfactor = 70)`, def.Table)); err != nil {
		t.Fatal(err)
	}
	if err := outbox.Migrate(ctx, pool, def); err != nil {
		t.Fatal(err)
	}
	if got := reloptions(def.Table); got != "fillfactor=70" {
		t.Fatalf("after Migrate with the default: table options %q, want the operator's fillfactor=70", got)
	}
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
	if !strings.Contains(ddl, ") WITH (fillfactor = 80);") || !strings.Contains(ddl, "SET (fillfactor = 80); END IF; END$ff$;") {
		t.Fatalf("SchemaSQL does not set fillfactor 80:\n%s", ddl)
	}
}

// TestFillFactorOddTableName: the statement that sets an explicit fillfactor on an existing
// table quotes a name holding a quote and a dollar-quote tag.
func TestFillFactorOddTableName(t *testing.T) {
	pool := pgtest.Require(t)
	schema := outbox.SchemaConfig{Table: pgtest.Table(t) + `'$ff$`, FillFactor: 60}
	t.Cleanup(func() { pool.Exec(ctx, fmt.Sprintf(`DROP TABLE IF EXISTS %s`, pgxIdent(schema.Table))) })
	for range 2 { // create, then the existing table
		if err := outbox.Migrate(ctx, pool, schema); err != nil {
			t.Fatal(err)
		}
	}
	var opts string
	if err := pool.QueryRow(ctx, `SELECT array_to_string(reloptions, ',') FROM pg_class WHERE oid = $1::regclass`, pgxIdent(schema.Table)).Scan(&opts); err != nil {
		t.Fatal(err)
	}
	if opts != "fillfactor=60" {
		t.Fatalf("table options %q, want fillfactor=60", opts)
	}
}

func pgxIdent(name string) string { return pgx.Identifier{name}.Sanitize() }
