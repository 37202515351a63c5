package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// This file holds the multi-tenant side of the idempotency key (SchemaConfig.IdempotencyScope):
// the scoped unique index, the check that Migrate never swaps it silently, and the read-back of
// stored events by (scope, key) that never hands one tenant another tenant's event.

// scopeMismatchCode is the SQLSTATE the PostgreSQL scope check raises (a private code, mapped
// to ErrIdempotencyScopeMismatch by Migrate).
const scopeMismatchCode = "OBX01"

// compileScope checks SchemaConfig.IdempotencyScope against the declared extra columns.
func (s *schema) compileScope() error {
	for i, name := range s.cfg.IdempotencyScope {
		field := fmt.Sprintf("SchemaConfig.IdempotencyScope[%d]", i)
		if !s.extra[name] {
			return &ConfigError{Field: field, Reason: fmt.Sprintf("column %q is not declared in SchemaConfig.ExtraColumns", name)}
		}
		if slices.Index(s.cfg.IdempotencyScope, name) != i {
			return &ConfigError{Field: field, Reason: fmt.Sprintf("column %q named twice", name)}
		}
	}
	return nil
}

// scoped reports whether idempotency keys are unique per scope rather than per table.
func (s *schema) scoped() bool { return len(s.cfg.IdempotencyScope) > 0 }

// idempotencyColumns returns the quoted columns of the idempotency unique index: the scope
// columns, then "idempotency_key". It is also the publisher's ON CONFLICT target.
func (s *schema) idempotencyColumns() string {
	cols := make([]string, 0, len(s.cfg.IdempotencyScope)+1)
	for _, c := range s.cfg.IdempotencyScope {
		cols = append(cols, pgx.Identifier{c}.Sanitize())
	}
	return strings.Join(append(cols, `"idempotency_key"`), ", ")
}

// Index suffixes of the global and the scoped idempotency index. The names differ so that a
// table migrated from one to the other is recognised by name.
const (
	globalKeyIndex = "idempotency_key_idx"
	scopedKeyIndex = "idempotency_scope_idx"
)

// idempotencyIndexName returns the unquoted name of the idempotency index of this config.
func (s *schema) idempotencyIndexName() string {
	if s.scoped() {
		return s.indexBase + "_" + scopedKeyIndex
	}
	return s.indexBase + "_" + globalKeyIndex
}

// idempotencyIndexSQL is the DDL of the idempotency unique index (both dialects). Partial, so
// the common event without a key costs no index entry; the publisher's ON CONFLICT names the
// same columns and predicate.
func (s *schema) idempotencyIndexSQL(concurrently bool) string {
	how := ""
	if concurrently {
		how = "CONCURRENTLY "
	}
	return fmt.Sprintf(`CREATE UNIQUE INDEX %sIF NOT EXISTS %s ON %s (%s) WHERE "idempotency_key" IS NOT NULL`,
		how, pgx.Identifier{s.idempotencyIndexName()}.Sanitize(), s.table, s.idempotencyColumns())
}

// qualifiedIndex returns the index name qualified like the table, as a regclass text literal.
func (s *schema) qualifiedIndex(name string) string {
	return quoteLiteral(s.schemaPfx + pgx.Identifier{name}.Sanitize())
}

// scopeMismatch texts, shared by both dialects.
func (s *schema) scopeMismatchReason(haveGlobal bool, haveScopedCols []string) string {
	want := append(slices.Clone(s.cfg.IdempotencyScope), "idempotency_key")
	fix := "run the statements of outbox.IdempotencyScopeMigrationSQL(cfg) (README, \"Multi-tenant outboxes\"), then Migrate"
	switch {
	case s.scoped() && haveGlobal:
		return fmt.Sprintf("table %s has the global idempotency index %q but SchemaConfig.IdempotencyScope is %v: %s",
			s.table, s.indexBase+"_"+globalKeyIndex, s.cfg.IdempotencyScope, fix)
	case s.scoped():
		return fmt.Sprintf("table %s has the idempotency index %q over %v, want %v: %s",
			s.table, s.indexBase+"_"+scopedKeyIndex, haveScopedCols, want, fix)
	default:
		return fmt.Sprintf("table %s has the scoped idempotency index %q over %v but SchemaConfig.IdempotencyScope is empty: %s",
			s.table, s.indexBase+"_"+scopedKeyIndex, haveScopedCols, fix)
	}
}

// scopeCheckSQL is a PostgreSQL statement that raises SQLSTATE OBX01 when the table's existing
// idempotency index does not match the config (a scope added, changed or removed on an
// existing table), so Migrate never builds a second unique index next to the old one.
func (s *schema) scopeCheckSQL() string {
	want := make([]string, 0, len(s.cfg.IdempotencyScope)+1)
	for _, c := range append(slices.Clone(s.cfg.IdempotencyScope), "idempotency_key") {
		want = append(want, quoteLiteral(c))
	}
	colsOf := func(idx string) string {
		return fmt.Sprintf(`(SELECT array_agg(a.attname::text ORDER BY k.n) FROM pg_index i CROSS JOIN LATERAL unnest(i.indkey::int2[]) WITH ORDINALITY k(attnum, n) JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum WHERE i.indexrelid = to_regclass(%s))`, s.qualifiedIndex(idx))
	}
	global, scoped := s.indexBase+"_"+globalKeyIndex, s.indexBase+"_"+scopedKeyIndex
	var cond string
	if s.scoped() {
		cond = fmt.Sprintf(`to_regclass(%s) IS NOT NULL OR (have IS NOT NULL AND have <> ARRAY[%s])`, s.qualifiedIndex(global), strings.Join(want, ", "))
	} else {
		cond = `have IS NOT NULL`
	}
	// The message is built in SQL from the columns found so that it names them.
	reasonGlobal := s.scopeMismatchReason(true, nil)
	body := fmt.Sprintf(`DECLARE have text[] := %s; BEGIN IF %s THEN RAISE EXCEPTION USING ERRCODE = '%s', MESSAGE = CASE WHEN to_regclass(%s) IS NOT NULL THEN %s ELSE format(%s, have) END; END IF; END`,
		colsOf(scoped), cond, scopeMismatchCode, s.qualifiedIndex(global), quoteLiteral(reasonGlobal),
		quoteLiteral(strings.ReplaceAll(strings.ReplaceAll(s.scopeMismatchReason(false, []string{"\x00"}), "%", "%%"), "[\x00]", "%s")))
	tag := dollarQuote(body, "sc")
	return "DO " + tag + body + tag
}

// sqliteScopeCheck is scopeCheckSQL for SQLite, run by Migrate in Go.
func (s *schema) sqliteScopeCheck(ctx context.Context, ex execer) error {
	cols := func(idx string) ([]string, error) {
		rs, err := ex.query(ctx, `SELECT "name" FROM pragma_index_info($1) ORDER BY "seqno"`, idx)
		if err != nil {
			return nil, err
		}
		defer rs.Close()
		var out []string
		for rs.Next() {
			var c string
			if err := rs.Scan(&c); err != nil {
				return nil, err
			}
			out = append(out, c)
		}
		return out, rs.Err()
	}
	global, err := cols(s.indexBase + "_" + globalKeyIndex)
	if err != nil {
		return err
	}
	have, err := cols(s.indexBase + "_" + scopedKeyIndex)
	if err != nil {
		return err
	}
	want := append(slices.Clone(s.cfg.IdempotencyScope), "idempotency_key")
	switch {
	case s.scoped() && len(global) > 0:
		return fmt.Errorf("%w: %s", ErrIdempotencyScopeMismatch, s.scopeMismatchReason(true, nil))
	case s.scoped() && len(have) > 0 && !slices.Equal(have, want), !s.scoped() && len(have) > 0:
		return fmt.Errorf("%w: %s", ErrIdempotencyScopeMismatch, s.scopeMismatchReason(false, have))
	}
	return nil
}

// migrateError maps the scope check's PostgreSQL error to ErrIdempotencyScopeMismatch.
func migrateError(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == scopeMismatchCode {
		return fmt.Errorf("%w: %s", ErrIdempotencyScopeMismatch, pgErr.Message)
	}
	return err
}

// IdempotencyScopeMigrationSQL returns the statements that move an existing outbox table to
// the idempotency index cfg describes (SchemaConfig.IdempotencyScope set, changed or removed),
// one per element, for an operator to run one by one, in order, outside a transaction:
//
//  1. build the new unique index (on PostgreSQL CONCURRENTLY, which does not block writers;
//     with a scope under a temporary name). It fails if stored events already break the new
//     uniqueness (two tenants' events sharing a key, going back to a global key); on
//     PostgreSQL drop the INVALID index it leaves before trying again;
//  2. drop the old idempotency index (on PostgreSQL CONCURRENTLY);
//  3. with a scope, give the new index its final name (SQLite: build it again and drop the
//     temporary one).
//
// Deploy Publishers with the new config after step 1: while both indexes exist Publishers of
// either config work (each ON CONFLICT names its own index's columns). Migrate refuses a
// config whose index does not match the table's (ErrIdempotencyScopeMismatch) until the last
// step is done. Errors: a *ConfigError for an invalid config. It runs no SQL.
func IdempotencyScopeMigrationSQL(cfg SchemaConfig) ([]string, error) {
	s, err := cfg.compile()
	if err != nil {
		return nil, err
	}
	drop := "DROP INDEX CONCURRENTLY IF EXISTS "
	if s.sqlite {
		drop = "DROP INDEX IF EXISTS "
	}
	old := s.indexBase + "_" + globalKeyIndex
	stmts := []string{s.idempotencyIndexSQL(!s.sqlite)}
	if !s.scoped() {
		old = s.indexBase + "_" + scopedKeyIndex
	} else {
		// A changed scope: the new index replaces the old one of the same name, so it is
		// built under a temporary name first.
		tmp := pgx.Identifier{s.indexBase + "_idempotency_new"}.Sanitize()
		stmts = []string{
			strings.Replace(s.idempotencyIndexSQL(!s.sqlite), pgx.Identifier{s.idempotencyIndexName()}.Sanitize(), tmp, 1),
			drop + s.schemaPfx + pgx.Identifier{s.idempotencyIndexName()}.Sanitize(),
			drop + s.schemaPfx + pgx.Identifier{old}.Sanitize(),
		}
		if s.sqlite {
			// SQLite has no ALTER INDEX … RENAME: the index is built again under its name.
			return append(stmts, s.idempotencyIndexSQL(false), drop+tmp), nil
		}
		return append(stmts, "ALTER INDEX "+s.schemaPfx+tmp+" RENAME TO "+pgx.Identifier{s.idempotencyIndexName()}.Sanitize()), nil
	}
	return append(stmts, drop+s.schemaPfx+pgx.Identifier{old}.Sanitize()), nil
}

// checkScope refuses, before any SQL, an event with an idempotency key whose scope columns
// are missing or NULL (the unique index would not hold it: NULLs never conflict).
func (s *schema) checkScope(i int, ikey *string, extra map[string]any) error {
	if ikey == nil {
		return nil
	}
	for _, c := range s.cfg.IdempotencyScope {
		if v, ok := extra[c]; !ok || v == nil {
			return &ValidationError{Index: i, Field: "idempotency_scope", Reason: fmt.Sprintf("idempotency key %q set without a value for scope column %q (SchemaConfig.IdempotencyScope): set it in ExtraColumns", *ikey, c)}
		}
	}
	return nil
}

// resolveByScope fills out[i] for every row: the event this call inserted (byID), or the
// stored event of its idempotency key in its scope, read again by (scope columns, key) with
// one statement. It is used when the table is scoped or the call carries extra columns. For
// an unscoped table the stored event must agree with every extra column the row sets
// (compared as text in the column's type); otherwise the key belongs to another tenant and
// the call fails with an *IdempotencyConflictError instead of returning that event.
func (p *Publisher) resolveByScope(ctx context.Context, rows []row, byID map[string]Event) ([]Event, error) {
	out := make([]Event, len(rows))
	type probe struct {
		O int            `json:"o"`
		K string         `json:"k"`
		E map[string]any `json:"e"`
	}
	var probes []probe
	for i, r := range rows {
		if ev, ok := byID[r.id.String()]; ok {
			out[i] = ev
			continue
		}
		if r.ikey == nil {
			return nil, fmt.Errorf("outbox: insert into %s: event %s not returned", p.s.table, r.id)
		}
		e := r.extra
		if e == nil {
			e = map[string]any{}
		}
		probes = append(probes, probe{O: i, K: *r.ikey, E: e})
	}
	if len(probes) == 0 {
		return out, nil
	}
	in, err := json.Marshal(probes)
	if err != nil {
		return nil, &ValidationError{Index: probes[0].O, Field: "extra_columns", Reason: err.Error()}
	}
	t := p.s.table
	var from, match, same, ord string
	var arg any = string(in)
	if p.s.sqlite {
		from = `json_each($1) j JOIN ` + t + ` o ON o."idempotency_key" = (j.value ->> '$.k')`
		ord = `j.value ->> '$.o'`
		val := func(c string) string { return fmt.Sprintf(`(j.value ->> '$.e."%s"')`, c) }
		for _, c := range p.s.cfg.IdempotencyScope {
			match += fmt.Sprintf(` AND o.%s = %s`, pgx.Identifier{c}.Sanitize(), val(c))
		}
		same = "1"
		if !p.s.scoped() {
			var conds []string
			for _, col := range p.s.cfg.ExtraColumns {
				conds = append(conds, fmt.Sprintf(`(json_type(j.value, '$.e."%s"') IS NULL OR o.%s IS %s)`, col.Name, pgx.Identifier{col.Name}.Sanitize(), val(col.Name)))
			}
			if len(conds) > 0 {
				same = strings.Join(conds, " AND ")
			}
		}
	} else {
		from = `jsonb_to_recordset($1::jsonb) AS i(o int, k text, e jsonb) JOIN ` + t + ` o ON o."idempotency_key" = i.k`
		ord = `i.o`
		val := func(c string) string {
			return fmt.Sprintf(`(jsonb_populate_record(NULL::%s, i.e)).%s`, t, pgx.Identifier{c}.Sanitize())
		}
		for _, c := range p.s.cfg.IdempotencyScope {
			match += fmt.Sprintf(` AND o.%s = %s`, pgx.Identifier{c}.Sanitize(), val(c))
		}
		same = "true"
		if !p.s.scoped() {
			var conds []string
			for _, col := range p.s.cfg.ExtraColumns {
				conds = append(conds, fmt.Sprintf(`(NOT (i.e ? %s) OR o.%s::text IS NOT DISTINCT FROM %s::text)`, quoteLiteral(col.Name), pgx.Identifier{col.Name}.Sanitize(), val(col.Name)))
			}
			if len(conds) > 0 {
				same = strings.Join(conds, " AND ")
			}
		}
	}
	q := fmt.Sprintf(`SELECT %s, o."sequence", %s, o."topic", o."ordering_key", o."idempotency_key", o."created_at", %s FROM %s%s`,
		ord, p.s.textSQL(`o."id"`), same, from, match)
	rs, err := p.ex.query(ctx, q, arg)
	if err != nil {
		return nil, fmt.Errorf("outbox: read stored events: %w", err)
	}
	defer rs.Close()
	found := make(map[int]bool, len(probes))
	var conflicts []int
	for rs.Next() {
		var (
			i        int
			ev       Event
			id       string
			okey, ik *string
			ok       bool
		)
		if err := rs.Scan(&i, &ev.Sequence, &id, &ev.Topic, &okey, &ik, p.s.timeDest(&ev.CreatedAt), &ok); err != nil {
			return nil, fmt.Errorf("outbox: read stored events: %w", err)
		}
		if i < 0 || i >= len(rows) {
			return nil, fmt.Errorf("outbox: read stored events: row %d out of range", i)
		}
		found[i] = true
		if !ok {
			conflicts = append(conflicts, i)
			continue
		}
		ev.ID, _ = uuid.Parse(id)
		ev.OrderingKey, ev.IdempotencyKey = deref(okey), deref(ik)
		ev.Duplicate = true
		out[i] = ev
	}
	if err := rs.Err(); err != nil {
		return nil, fmt.Errorf("outbox: read stored events: %w", err)
	}
	if len(conflicts) > 0 {
		slices.Sort(conflicts)
		i := conflicts[0]
		return nil, &IdempotencyConflictError{Index: i, Key: *rows[i].ikey}
	}
	for _, pr := range probes {
		if !found[pr.O] {
			return nil, fmt.Errorf("outbox: insert into %s: idempotency key %q neither inserted nor found", p.s.table, pr.K)
		}
	}
	return out, nil
}
