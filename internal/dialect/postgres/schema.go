package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/watermill-outbox/outbox/internal/dialect"
)

func payloadType(p dialect.Payload) string {
	switch p {
	case dialect.PayloadBytea:
		return "BYTEA"
	case dialect.PayloadJSONB:
		return "JSONB"
	}
	return "JSON"
}

// Statements implements dialect.Dialect.
func (Dialect) Statements(t *dialect.Table) []string {
	q := dialect.DoubleQuote(t.Parts...)
	stmts := []string{
		fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
	"sequence"         BIGINT GENERATED ALWAYS AS IDENTITY (CACHE 1) PRIMARY KEY,
	"id"               UUID NOT NULL UNIQUE,
	"topic"            VARCHAR(255) NOT NULL CHECK ("topic" <> ''),
	"payload"          %s NOT NULL,
	"headers"          JSON  NOT NULL DEFAULT '{}',
	"ordering_key"     VARCHAR(255) NULL CHECK ("ordering_key" <> ''),
	"idempotency_key"  VARCHAR(255) NULL,
	"created_at"       TIMESTAMPTZ NOT NULL DEFAULT now(),
	"attempts"         INT NOT NULL DEFAULT 0,
	"last_error"       TEXT NULL,
	"next_attempt_at"  TIMESTAMPTZ NULL,
	"lease_until"      TIMESTAMPTZ NULL,
	"leased_by"        TEXT NULL,
	"published_at"     TIMESTAMPTZ NULL,
	"dead_lettered_at" TIMESTAMPTZ NULL,
	"delivery_starts"  INT NOT NULL DEFAULT 0,
	"last_error_class" TEXT NULL
) WITH (fillfactor = %d)`, q, payloadType(t.Payload), t.FillFactor),
		addRelayColumns(q),
	}
	if !t.FillDefault {
		stmts = append(stmts, setFillFactor(q, t.FillFactor))
	}
	for _, col := range t.Extra {
		stmts = append(stmts, fmt.Sprintf(`ALTER TABLE %s ADD COLUMN IF NOT EXISTS %s %s`, q, dialect.DoubleQuote(col.Name), col.Type))
	}
	stmts = append(stmts, scopeCheckSQL(t))
	return append(append(stmts, dialect.IndexStatements(t, q)...), floorIndexes(t, q)...)
}

// floorIndexes are the indexes the claim's floors need (see the walked_retry and next_keyed
// steps of claim.sql's claim). Both hold only events that failed, were taken back from the dead
// letters or are dead-lettered, so an INSERT adds no entry to either (their predicates are
// false for a new event) and a lease stays a HOT update (neither indexes a lease column).
func floorIndexes(t *dialect.Table, q string) []string {
	return []string{
		// Pending events that are due again at next_attempt_at: the claim's retry scans below
		// the floors.
		fmt.Sprintf(`CREATE INDEX IF NOT EXISTS %s ON %s ("next_attempt_at") WHERE "published_at" IS NULL AND "dead_lettered_at" IS NULL AND "next_attempt_at" IS NOT NULL`, index(t, "retry_idx"), q),
		// Unpublished keyed events that are dead-lettered or retrying, by key: the events of
		// their keys after them wait for them, so they do not hold the keyed floor.
		fmt.Sprintf(`CREATE INDEX IF NOT EXISTS %s ON %s ("ordering_key", "sequence") WHERE "published_at" IS NULL AND "ordering_key" IS NOT NULL AND ("dead_lettered_at" IS NOT NULL OR "next_attempt_at" IS NOT NULL)`, index(t, "blocking_idx"), q),
	}
}

// addRelayColumns returns a statement that adds the relay's columns added after the first
// release (delivery_starts, last_error_class) to a table created before them, each unless it
// has it (ALTER TABLE takes an ACCESS EXCLUSIVE lock even when IF NOT EXISTS finds the column:
// not worth taking on every start). PostgreSQL 11+ adds a column with a constant default, or
// none, without rewriting the table.
func addRelayColumns(q string) string {
	var body strings.Builder
	body.WriteString("BEGIN")
	for _, c := range []struct{ name, typ string }{{"delivery_starts", "INT NOT NULL DEFAULT 0"}, {"last_error_class", "TEXT NULL"}} {
		fmt.Fprintf(&body, ` IF NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = '%s'::regclass AND attname = '%s' AND NOT attisdropped) THEN ALTER TABLE %s ADD COLUMN "%s" %s; END IF;`,
			strings.ReplaceAll(q, "'", "''"), c.name, q, c.name, c.typ)
	}
	body.WriteString(" END")
	tag := dollarQuote(body.String(), "ds")
	return "DO " + tag + body.String() + tag
}

// dollarQuote returns a dollar-quote tag ("$name$", "$name0$" …) that body does not contain (a
// table name may hold '$').
func dollarQuote(body, name string) string {
	tag := "$" + name + "$"
	for i := 0; strings.Contains(body, tag); i++ {
		tag = fmt.Sprintf("$%s%d$", name, i)
	}
	return tag
}

// setFillFactor returns a statement that sets the configured fillfactor on an existing table
// unless it has it already (ALTER TABLE … SET takes a SHARE UPDATE EXCLUSIVE lock, which waits
// for a running VACUUM: not worth taking on every start).
func setFillFactor(q string, ff int) string {
	body := fmt.Sprintf(`BEGIN IF NOT EXISTS (SELECT 1 FROM pg_class WHERE oid = '%s'::regclass AND 'fillfactor=%d' = ANY(coalesce(reloptions, '{}'))) THEN ALTER TABLE %s SET (fillfactor = %d); END IF; END`,
		strings.ReplaceAll(q, "'", "''"), ff, q, ff)
	tag := dollarQuote(body, "ff")
	return "DO " + tag + body + tag
}

// scopeMismatchCode is the SQLSTATE the scope check raises (a private code, mapped to
// dialect.ScopeMismatch by Migrate).
const scopeMismatchCode = "OBX01"

// qualifiedIndex returns the index name qualified like the table, as a regclass text literal.
func qualifiedIndex(t *dialect.Table, name string) string {
	parts := append(append([]string(nil), t.Parts[:len(t.Parts)-1]...), name)
	return dialect.QuoteLiteral(dialect.DoubleQuote(parts...))
}

// scopeCheckSQL is a statement that raises SQLSTATE OBX01 when the table's existing
// idempotency index does not match the config (a scope added, changed or removed on an
// existing table), so Migrate never builds a second unique index next to the old one.
func scopeCheckSQL(t *dialect.Table) string {
	want := make([]string, 0, len(t.Scope)+1)
	for _, c := range append(append([]string(nil), t.Scope...), "idempotency_key") {
		want = append(want, dialect.QuoteLiteral(c))
	}
	colsOf := func(idx string) string {
		return fmt.Sprintf(`(SELECT array_agg(a.attname::text ORDER BY k.n) FROM pg_index i CROSS JOIN LATERAL unnest(i.indkey::int2[]) WITH ORDINALITY k(attnum, n) JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum WHERE i.indexrelid = to_regclass(%s))`, qualifiedIndex(t, idx))
	}
	global, scoped := t.IndexBase+"_"+dialect.GlobalKeyIndex, t.IndexBase+"_"+dialect.ScopedKeyIndex
	var cond string
	if len(t.Scope) > 0 {
		cond = fmt.Sprintf(`to_regclass(%s) IS NOT NULL OR (have IS NOT NULL AND have <> ARRAY[%s])`, qualifiedIndex(t, global), strings.Join(want, ", "))
	} else {
		cond = `have IS NOT NULL`
	}
	q := dialect.DoubleQuote(t.Parts...)
	// The message is built in SQL from the columns found so that it names them.
	reasonGlobal := dialect.ScopeMismatchReason(q, t, true, nil)
	body := fmt.Sprintf(`DECLARE have text[] := %s; BEGIN IF %s THEN RAISE EXCEPTION USING ERRCODE = '%s', MESSAGE = CASE WHEN to_regclass(%s) IS NOT NULL THEN %s ELSE format(%s, have) END; END IF; END`,
		colsOf(scoped), cond, scopeMismatchCode, qualifiedIndex(t, global), dialect.QuoteLiteral(reasonGlobal),
		dialect.QuoteLiteral(strings.ReplaceAll(strings.ReplaceAll(dialect.ScopeMismatchReason(q, t, false, []string{"\x00"}), "%", "%%"), "[\x00]", "%s")))
	tag := dollarQuote(body, "sc")
	return "DO " + tag + body + tag
}

// Migrate implements dialect.Dialect: the whole script under a transaction-scoped advisory
// lock, so concurrent Migrates run one after the other.
func (d Dialect) Migrate(ctx context.Context, ex dialect.Executor, t *dialect.Table) error {
	script := fmt.Sprintf("SELECT pg_advisory_xact_lock(%d);\n", t.LockSeed)
	for _, st := range d.Statements(t) {
		script += st + ";\n"
	}
	// A parameterless multi-statement script runs in one round trip through the simple query
	// protocol, which runs it as one implicit transaction (or inside the caller's).
	var err error
	if pe, ok := ex.Handle().(interface {
		Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
	}); ok {
		_, err = pe.Exec(ctx, script, pgx.QueryExecModeSimpleProtocol)
	} else {
		_, err = ex.Exec(ctx, script)
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == scopeMismatchCode {
		return &dialect.ScopeMismatch{Reason: pgErr.Message}
	}
	return err
}

// ScopeMigration implements dialect.Dialect: the new unique index built CONCURRENTLY (with a
// scope under a temporary name), the old one dropped CONCURRENTLY, the new one renamed.
func (Dialect) ScopeMigration(t *dialect.Table) ([]string, error) {
	const drop = "DROP INDEX CONCURRENTLY IF EXISTS "
	q := dialect.DoubleQuote(t.Parts...)
	schemaPfx := ""
	if len(t.Parts) == 2 {
		schemaPfx = dialect.DoubleQuote(t.Parts[0]) + "."
	}
	name := dialect.DoubleQuote(t.IdempotencyIndexName())
	if len(t.Scope) == 0 {
		return []string{dialect.IdempotencyIndexSQL(t, q, name, true), drop + schemaPfx + dialect.DoubleQuote(t.IndexBase+"_"+dialect.ScopedKeyIndex)}, nil
	}
	// A changed scope: the new index replaces the old one of the same name, so it is built
	// under a temporary name first.
	tmp := dialect.DoubleQuote(t.IndexBase + "_idempotency_new")
	return []string{
		dialect.IdempotencyIndexSQL(t, q, tmp, true),
		drop + schemaPfx + name,
		drop + schemaPfx + dialect.DoubleQuote(t.IndexBase+"_"+dialect.GlobalKeyIndex),
		"ALTER INDEX " + schemaPfx + tmp + " RENAME TO " + name,
	}, nil
}
