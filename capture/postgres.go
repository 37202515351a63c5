package capture

import (
	"context"
	"fmt"
	"hash/fnv"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/watermill-outbox/outbox"
)

// PostgreSQL: one row-level AFTER trigger per captured table (plus a TRUNCATE statement
// trigger) calling a PL/pgSQL function generated from the catalog at install time, so the
// function knows every column's type and does no catalog lookup per row. The event is written
// by the trigger in the writer's transaction while the writer holds the changed row's lock.

const (
	pgTrigger         = "outbox_capture"
	pgTruncateTrigger = "outbox_capture_truncate"
	pgExtSetting      = "outbox.capture_extension"
	// pgTimeFmt renders a timestamptz as ISO 8601 in UTC with microseconds.
	pgTimeFmt = `to_char((%s) AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"')`
	// pgUUIDv7 is a version 7 UUID (RFC 9562): uuid_prefix (declared in the trigger function:
	// the statement's Unix time in milliseconds as 12 hex digits, then version 7) followed by
	// the last 74 bits of a random (version 4) UUID, whose variant bits are already 10.
	// Cheaper than bytea arithmetic (measured: half the time of overlay/set_bit/encode).
	pgUUIDv7     = `(outbox_capture_fn.uuid_prefix || substr(gen_random_uuid()::text, 16))::uuid`
	pgMillis     = `lpad(to_hex(floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint), 12, '0')`
	pgUUIDPrefix = `substr(ms, 1, 8) || '-' || substr(ms, 9, 4) || '-7'`
)

// pgFunction returns the quoted name of the trigger function of schema.table (at most 63
// bytes: a long table name is cut and suffixed with a hash).
func pgFunction(schema, table string) string {
	name := table + "_outbox_capture"
	if len(name) > 63 {
		h := fnv.New32a()
		h.Write([]byte(table))
		cut := 30
		for cut > 0 && !utf8.RuneStart(table[cut]) {
			cut-- // never split a character
		}
		name = fmt.Sprintf("%s_%08x_outbox_capture", table[:cut], h.Sum32())
	}
	return pgx.Identifier{schema, name}.Sanitize()
}

// pgType is a row of pg_type with what the JSON rules need.
type pgType struct {
	name, typtype, category string
	elem, base, rngsub      int64
}

// pgTypes classifies column types, caching pg_type rows.
type pgTypes struct {
	ctx   context.Context
	c     conn
	cache map[int64]pgType
}

func (p *pgTypes) get(oid int64) (pgType, error) {
	if t, ok := p.cache[oid]; ok {
		return t, nil
	}
	rs, err := p.c.query(p.ctx, `SELECT t.typname::text, t.typtype::text, t.typcategory::text, t.typelem::int8, t.typbasetype::int8, coalesce(r.rngsubtype, 0)::int8
FROM pg_type t LEFT JOIN pg_range r ON r.rngtypid = t.oid WHERE t.oid = $1`, oid)
	if err != nil {
		return pgType{}, err
	}
	defer rs.Close()
	var t pgType
	if !rs.Next() {
		return t, fmt.Errorf("capture: type oid %d not found", oid)
	}
	if err := rs.Scan(&t.name, &t.typtype, &t.category, &t.elem, &t.base, &t.rngsub); err != nil {
		return t, err
	}
	rs.Close()
	p.cache[oid] = t
	return t, rs.Err()
}

// pgRule is the JSON rule of a type: json renders a JSON value expression of x; plain means
// to_jsonb(x) is the rule (so an array of it is to_jsonb of the array); textCmp means the type
// has no equality operator and values compare as text.
type pgRule struct {
	json    func(x string) string
	plain   bool
	textCmp bool
}

// rule returns the JSON rule of type oid, or a rule with json == nil when there is none. The
// rules are the package doc's "JSON form of values".
func (p *pgTypes) rule(oid int64) (pgRule, error) {
	t, err := p.get(oid)
	if err != nil {
		return pgRule{}, err
	}
	asText := pgRule{json: func(x string) string { return "to_jsonb((" + x + ")::text)" }}
	switch {
	case t.typtype == "d":
		return p.rule(t.base)
	case t.typtype == "e":
		return asText, nil
	case t.typtype == "r":
		sub, err := p.rule(t.rngsub)
		if err != nil || sub.json == nil {
			return pgRule{}, err
		}
		return pgRule{json: func(x string) string {
			return fmt.Sprintf("CASE WHEN (%[1]s) IS NULL THEN NULL ELSE jsonb_build_object('lower', %[2]s, 'upper', %[3]s, 'lower_inc', lower_inc(%[1]s), 'upper_inc', upper_inc(%[1]s), 'is_empty', isempty(%[1]s)) END",
				x, sub.json("lower("+x+")"), sub.json("upper("+x+")"))
		}}, nil
	case t.category == "A" && t.elem != 0:
		el, err := p.rule(t.elem)
		if err != nil || el.json == nil {
			return pgRule{}, err
		}
		if el.plain {
			return pgRule{json: func(x string) string { return "to_jsonb(" + x + ")" }, textCmp: el.textCmp}, nil
		}
		return pgRule{json: func(x string) string {
			return fmt.Sprintf("CASE WHEN (%[1]s) IS NULL THEN NULL ELSE coalesce((SELECT jsonb_agg(%[2]s ORDER BY u.o) FROM unnest(%[1]s) WITH ORDINALITY u(e, o)), '[]'::jsonb) END", x, el.json("u.e"))
		}, textCmp: el.textCmp}, nil
	}
	switch t.name {
	case "int2", "int4", "int8", "oid", "bool", "float4", "float8", "text", "varchar", "name", "timestamp", "date", "time", "timetz", "jsonb":
		// to_jsonb gives numbers, booleans, strings, ISO 8601 for the time types, and
		// "NaN"/"Infinity"/"-Infinity" for non-finite floats.
		return pgRule{json: func(x string) string { return "to_jsonb(" + x + ")" }, plain: true}, nil
	case "numeric", "uuid", "inet", "cidr", "macaddr", "macaddr8", "bpchar", "citext":
		return asText, nil
	case "timestamptz":
		return pgRule{json: func(x string) string {
			return "to_jsonb(CASE WHEN isfinite(" + x + ") THEN " + fmt.Sprintf(pgTimeFmt, x) + " ELSE (" + x + ")::text END)"
		}}, nil
	case "interval":
		return pgRule{json: func(x string) string { return "to_jsonb(trim_scale(extract(epoch FROM " + x + ")::numeric))" }}, nil
	case "bytea":
		return pgRule{json: func(x string) string { return "to_jsonb(translate(encode(" + x + ", 'base64'), E'\\n', ''))" }}, nil
	case "json":
		return pgRule{json: func(x string) string { return "(" + x + ")::jsonb" }, textCmp: true}, nil
	}
	return pgRule{}, nil
}

// pgCatalog reads the table name (schema-qualified or through search_path).
func pgCatalog(ctx context.Context, c conn, name string, tg *target) (*catalog, error) {
	var (
		oid                  int64
		schema, table, kind  string
		outboxOID, outboxErr = int64(0), error(nil)
	)
	var partitionOf, inherits string
	rs, err := c.query(ctx, `SELECT c.oid::int8, n.nspname::text, c.relname::text, c.relkind::text, coalesce(to_regclass($2)::oid, 0)::int8,
  coalesce((SELECT i.inhparent::regclass::text FROM pg_inherits i WHERE i.inhrelid = c.oid AND c.relispartition), ''),
  coalesce((SELECT string_agg(i.inhrelid::regclass::text, ', ' ORDER BY i.inhrelid::regclass::text) FROM pg_inherits i JOIN pg_class k ON k.oid = i.inhrelid WHERE i.inhparent = c.oid AND NOT k.relispartition), '')
    || coalesce((SELECT string_agg(i.inhparent::regclass::text, ', ' ORDER BY i.inhparent::regclass::text) FROM pg_inherits i WHERE i.inhrelid = c.oid AND NOT c.relispartition), '')
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass($1)`, pgx.Identifier(strings.Split(name, ".")).Sanitize(), tg.table)
	if err != nil {
		return nil, fmt.Errorf("capture: read catalog of %s: %w", name, err)
	}
	found := rs.Next()
	if found {
		outboxErr = rs.Scan(&oid, &schema, &table, &kind, &outboxOID, &partitionOf, &inherits)
	}
	rs.Close()
	if outboxErr != nil {
		return nil, outboxErr
	}
	if err := rs.Err(); err != nil {
		return nil, fmt.Errorf("capture: read catalog of %s: %w", name, err)
	}
	if !found || (kind != "r" && kind != "p") {
		return nil, nil
	}
	cat := &catalog{schema: schema, table: table, isOutbox: oid == outboxOID, partitionOf: partitionOf, inherits: inherits}
	if kind == "p" {
		cat.partitioned = true
		if cat.partitions, err = pgPartitions(ctx, c, oid); err != nil {
			return nil, fmt.Errorf("capture: read partitions of %s: %w", name, err)
		}
	}
	types := &pgTypes{ctx: ctx, c: c, cache: map[int64]pgType{}}
	type col struct {
		name, typ string
		oid       int64
	}
	var cols []col
	rs, err = c.query(ctx, `SELECT a.attname::text, format_type(a.atttypid, a.atttypmod), a.atttypid::int8
FROM pg_attribute a WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum`, oid)
	if err != nil {
		return nil, err
	}
	for rs.Next() {
		var cl col
		if err := rs.Scan(&cl.name, &cl.typ, &cl.oid); err != nil {
			rs.Close()
			return nil, err
		}
		cols = append(cols, cl)
	}
	rs.Close()
	if err := rs.Err(); err != nil {
		return nil, err
	}
	for _, cl := range cols {
		rule, err := types.rule(cl.oid)
		if err != nil {
			return nil, fmt.Errorf("capture: type of %s.%s: %w", table, cl.name, err)
		}
		cc := catColumn{name: cl.name, typ: cl.typ, json: rule.json, plain: rule.plain,
			text:     func(x string) string { return "(" + x + ")::text" },
			distinct: func(a, b string) string { return a + " IS DISTINCT FROM " + b }}
		if rule.textCmp {
			cc.distinct = func(a, b string) string { return a + "::text IS DISTINCT FROM " + b + "::text" }
		}
		cat.cols = append(cat.cols, cc)
	}
	cat.pk, err = queryStrings(ctx, c, `SELECT a.attname::text FROM pg_index i CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY k(attnum, ord)
JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum WHERE i.indrelid = $1 AND i.indisprimary ORDER BY k.ord`, oid)
	return cat, err
}

// pgOutboxExists reports whether the outbox table exists.
func pgOutboxExists(ctx context.Context, c conn, tg *target) (bool, error) {
	got, err := queryStrings(ctx, c, `SELECT n.nspname::text || '.' || c.relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass($1)`, tg.table)
	if err != nil || len(got) != 1 {
		return false, err
	}
	schema, table, _ := strings.Cut(got[0], ".")
	tg.written = pgx.Identifier{schema, table}.Sanitize()
	tg.schemaName = schema
	// The payload column's type as the table has it (the CLI's SchemaConfig cannot know a
	// BYTEA outbox; a config that says otherwise would make every captured write fail).
	typ, err := queryStrings(ctx, c, `SELECT format_type(a.atttypid, a.atttypmod) FROM pg_attribute a WHERE a.attrelid = to_regclass($1) AND a.attname = 'payload' AND NOT a.attisdropped`, tg.table)
	if err != nil {
		return false, err
	}
	if len(typ) == 1 && typ[0] == "bytea" {
		tg.cfg.PayloadType = outbox.PayloadBytea
	} else if len(typ) == 1 && tg.cfg.PayloadType == outbox.PayloadBytea {
		tg.cfg.PayloadType = outbox.PayloadJSON
	}
	return true, nil
}

// jsonbObject renders jsonb_build_object over "key, value" pairs, in chunks (a function takes
// at most 100 arguments).
func jsonbObject(pairs []string) string {
	if len(pairs) == 0 {
		return "'{}'::jsonb"
	}
	var chunks []string
	for i := 0; i < len(pairs); i += 50 {
		chunks = append(chunks, "jsonb_build_object("+strings.Join(pairs[i:min(i+50, len(pairs))], ", ")+")")
	}
	return strings.Join(chunks, " || ")
}

// wholeRow reports whether the images of the carried columns come from one to_jsonb call
// over the LATERAL projection <alias>_img of exactly those columns (see pgBranch).
func (r *resolved) wholeRow() bool { return len(r.carried) > 2 }

// pgImgFrom returns the LATERAL projection of the carried columns of alias.
func (r *resolved) pgImgFrom(alias string) string {
	refs := make([]string, len(r.carried))
	for i, c := range r.carried {
		refs[i] = rowRef(alias)(c.name)
	}
	return fmt.Sprintf(" CROSS JOIN LATERAL (SELECT %s) %s_img", strings.Join(refs, ", "), alias)
}

func (r *resolved) pgImage(alias string, cols []catColumn) string {
	if r.wholeRow() && slices.EqualFunc(cols, r.carried, func(a, b catColumn) bool { return a.name == b.name }) {
		// The whole row in one to_jsonb call (half the cost of a pair per column in a
		// 10,000-row UPDATE) over a projection of the carried columns only (a column added or
		// renamed after Install is not carried), plus the columns whose rule is not to_jsonb's.
		img := "to_jsonb(" + alias + "_img.*)"
		var other []catColumn
		for _, c := range cols {
			if !c.plain {
				other = append(other, c)
			}
		}
		if len(other) == 0 {
			return img
		}
		return img + " || " + jsonbObject(pairs(alias, other))
	}
	return jsonbObject(pairs(alias, cols))
}

// Transition tables of the statement triggers and the row aliases the generated SQL uses.
const (
	pgOldRows = "outbox_capture_old"
	pgNewRows = "outbox_capture_new"
	pgRowNum  = "outbox_capture_rn"
)

// pgBranch renders the one statement that writes the events of one operation's statement:
// an INSERT … SELECT over the transition table(s), alias n for the new rows and o for the
// old ones. An UPDATE pairs its old and new rows by position: PostgreSQL appends each updated
// row's old and new versions to the two transition tables together (trigger.c,
// AfterTriggerSaveEvent), so the k-th old row and the k-th new row are one row's versions —
// also when the key changed.
func (r *resolved) pgBranch(op Operation, tg *target) string {
	alias := map[Operation]string{Inserted: "n", Updated: "n", Deleted: "o"}[op]
	names := make([]string, len(r.carried))
	for i, c := range r.carried {
		names[i] = quoteLiteral(c.name)
	}
	var from, changed, where string
	switch op {
	case Inserted:
		from = pgNewRows + " n"
	case Deleted:
		from = pgOldRows + " o"
	case Updated:
		from = fmt.Sprintf("(SELECT row_number() OVER () AS %[1]s, t.* FROM %[2]s t) o JOIN (SELECT row_number() OVER () AS %[1]s, t.* FROM %[3]s t) n USING (%[1]s)", pgRowNum, pgOldRows, pgNewRows)
	}
	if r.wholeRow() {
		if op != Deleted {
			from += r.pgImgFrom("n")
		}
		if op != Inserted {
			from += r.pgImgFrom("o")
		}
	}
	if op == Updated {
		whens := make([]string, len(r.carried))
		for i, c := range r.carried {
			whens[i] = fmt.Sprintf("CASE WHEN %s THEN %s END", c.distinct(rowRef("o")(c.name), rowRef("n")(c.name)), quoteLiteral(c.name))
		}
		from += fmt.Sprintf(" CROSS JOIN LATERAL (SELECT array_remove(ARRAY[%s]::text[], NULL) AS ch) c", strings.Join(whens, ", "))
		changed = "to_jsonb(c.ch)"
		if !r.EmitUnchanged {
			where = " WHERE cardinality(c.ch) > 0"
			if len(r.key) > 0 {
				where += " OR " + r.keyChanged("o", "n")
			}
		}
	} else {
		changed = fmt.Sprintf("to_jsonb(ARRAY[%s]::text[])", strings.Join(names, ", "))
	}
	env := r.envelope(op, r.pk(alias, "'null'::jsonb", r.pgImage), changed, "outbox_capture_fn.occurred_at", "o", "n", "NULL::jsonb", r.pgImage)
	envSQL := jsonbObject(env)
	if op == Updated && r.Payload != PayloadBeforeAndAfter && len(r.key) > 0 {
		// A key change: the event goes under the new key, the old key is in "before".
		envSQL += fmt.Sprintf(" || CASE WHEN %s THEN jsonb_build_object('before', %s) ELSE '{}'::jsonb END", r.keyChanged("o", "n"), r.pgImage("o", r.key))
	}
	var extra []string
	for _, k := range sortedKeys(r.Extend.Payload) {
		extra = append(extra, quoteLiteral(k)+", "+expandRow(r.Extend.Payload[k], alias))
	}
	var hdrs []string
	for _, k := range sortedKeys(r.Extend.Headers) {
		hdrs = append(hdrs, quoteLiteral(k)+", "+expandRow(r.Extend.Headers[k], alias)+"::text")
	}
	sel := []string{
		fmt.Sprintf("coalesce(outbox_capture_fn.ext->'payload', '{}'::jsonb) || %s || %s AS env", jsonbObject(extra), envSQL),
		fmt.Sprintf("jsonb_strip_nulls(%s) || coalesce(outbox_capture_fn.ext->'headers', '{}'::jsonb) AS hdr", jsonbObject(hdrs)),
		fmt.Sprintf("nullif(%s, '') AS k", r.orderingKey(alias, func(p []string) string { return "(" + strings.Join(p, " || ") + ")" })),
	}
	for _, c := range sortedKeys(r.Extend.Columns) {
		sel = append(sel, fmt.Sprintf("%s AS %s", expandRow(r.Extend.Columns[c], alias), quoteIdent("x_"+c)))
	}
	// ev is read once (inlined, streamed into the INSERT) unless the key locks read it too.
	cte := fmt.Sprintf("WITH ev AS (SELECT %s FROM %s%s)", strings.Join(sel, ", "), from, where)
	lock := ""
	if r.lockKey {
		cte = strings.Replace(cte, "ev AS (", "ev AS MATERIALIZED (", 1)
		// The Publisher's per-ordering-key lock: the same 64-bit hash
		// seeded with the outbox table, taken in hash order in a materialized CTE that the
		// INSERT reads, before it draws its first sequence value; so captured and published
		// events of one key keep commit order together.
		cte += fmt.Sprintf(", locks AS MATERIALIZED (SELECT count(pg_advisory_xact_lock(h)) AS n FROM (SELECT DISTINCT hashtextextended(k, %d) AS h FROM ev WHERE k IS NOT NULL ORDER BY 1) x)", tg.seed)
		lock = " CROSS JOIN locks"
	}
	return r.pgInsert(cte, r.topicFor(op), lock, true, tg)
}

// pgInsert renders the INSERT of the events of CTE ev (env, hdr, k, x_<extra column>) after
// cte; lock is the join that makes the INSERT wait for the key locks.
func (r *resolved) pgInsert(cte, topic, lock string, rowCols bool, tg *target) string {
	payload := "ev.env"
	if tg.cfg.PayloadType == outbox.PayloadBytea {
		payload = "convert_to(ev.env::text, 'UTF8')"
	}
	insert := func(fromExt bool) string {
		cols := []string{`"id"`, `"topic"`, `"payload"`, `"headers"`, `"ordering_key"`}
		vals := []string{pgUUIDv7, quoteLiteral(topic), payload, "ev.hdr", "ev.k"}
		for _, c := range tg.extras {
			_, ok := r.Extend.Columns[c]
			switch {
			case ok && rowCols: // a truncate has no row to evaluate Extend.Columns on
				cols, vals = append(cols, quoteIdent(c)), append(vals, "ev."+quoteIdent("x_"+c))
			case fromExt:
				cols, vals = append(cols, quoteIdent(c)), append(vals, fmt.Sprintf("(jsonb_populate_record(NULL::%s, outbox_capture_fn.ext->'columns')).%s", tg.written, quoteIdent(c)))
			}
		}
		return fmt.Sprintf("%s INSERT INTO %s (%s) SELECT %s FROM ev%s;", cte, tg.written, strings.Join(cols, ", "), strings.Join(vals, ", "), lock)
	}
	if len(tg.extras) == 0 {
		return "    " + insert(false) + "\n"
	}
	return fmt.Sprintf("    IF outbox_capture_fn.ext ? 'columns' THEN\n      %s\n    ELSE\n      %s\n    END IF;\n", insert(true), insert(false))
}

// pgStatements returns the DDL installing r's triggers, one statement per element: one
// function, and one statement-level trigger per captured operation with its transition
// tables (plus the TRUNCATE trigger).
func (r *resolved) pgStatements(tg *target) []string {
	fn := pgFunction(r.cat.schema, r.cat.table)
	var b strings.Builder
	fmt.Fprintf(&b, "-- Generated by watermill-outbox capture.Install for %s (%s); re-run Install after ALTER TABLE.\n", strings.NewReplacer("\n", " ", "\r", " ").Replace(r.display), r.Payload)
	b.WriteString(r.marker(tg).line())
	b.WriteString("<<outbox_capture_fn>>\nDECLARE\n  ext jsonb := nullif(current_setting('" + pgExtSetting + "', true), '')::jsonb;\n  occurred_at jsonb := to_jsonb(" + fmt.Sprintf(pgTimeFmt, "now()") + ");\n  ms text := " + pgMillis + ";\n  uuid_prefix text := " + pgUUIDPrefix + ";\nBEGIN\n")
	first := true
	kw := func() string {
		k := map[bool]string{true: "IF", false: "ELSIF"}[first]
		first = false
		return k
	}
	for _, op := range []Operation{Inserted, Updated, Deleted} {
		if containsOp(r.ops, op) {
			fmt.Fprintf(&b, "  %s TG_OP = %s THEN\n%s", kw(), quoteLiteral(pgOp(op)), r.pgBranch(op, tg))
		}
	}
	switch r.Truncate {
	case TruncateRefuse:
		fmt.Fprintf(&b, "  %s TG_OP = 'TRUNCATE' THEN\n    RAISE EXCEPTION 'outbox capture: TRUNCATE of %%.%% is refused (its rows would vanish without events): delete them with DELETE, or set capture.Table.Truncate', TG_TABLE_SCHEMA, TG_TABLE_NAME USING ERRCODE = 'feature_not_supported';\n", kw())
	case TruncateCapture:
		// One event per truncated table that holds rows: a TRUNCATE of a partitioned table
		// runs the trigger of each of its partitions too, each event naming its partition.
		cte := fmt.Sprintf("WITH ev AS (SELECT coalesce(outbox_capture_fn.ext->'payload', '{}'::jsonb) || jsonb_build_object('table', %s, 'operation', 'truncated', 'occurred_at', outbox_capture_fn.occurred_at) || CASE WHEN (TG_TABLE_SCHEMA, TG_TABLE_NAME) = (%s::name, %s::name) THEN '{}'::jsonb ELSE jsonb_build_object('partition', TG_TABLE_SCHEMA || '.' || TG_TABLE_NAME) END AS env, coalesce(outbox_capture_fn.ext->'headers', '{}'::jsonb) AS hdr, NULL::text AS k)",
			quoteLiteral(r.display), quoteLiteral(r.cat.schema), quoteLiteral(r.cat.table))
		fmt.Fprintf(&b, "  %s TG_OP = 'TRUNCATE' AND NOT EXISTS (SELECT FROM pg_class WHERE oid = TG_RELID AND relkind = 'p') THEN\n%s", kw(), r.pgInsert(cte, r.topicFor(Truncated), "", false, tg))
	}
	if !first {
		b.WriteString("  END IF;\n")
	}
	b.WriteString("  RETURN NULL;\nEND\n")
	body := b.String()
	tag := "$outbox_capture$"
	for i := 0; strings.Contains(body, tag); i++ {
		tag = fmt.Sprintf("$outbox_capture_%d$", i)
	}
	stmts := []string{fmt.Sprintf("CREATE OR REPLACE FUNCTION %s() RETURNS trigger LANGUAGE plpgsql AS %s\n%s%s", fn, tag, body, tag)}
	// The same statement triggers on the table and on each of its partitions: a statement
	// runs the statement triggers of the table it names only, so a write naming a partition
	// is captured by the partition's triggers, with the same envelope, topic and ordering key.
	stmts = append(stmts, r.pgTriggers(r.qtable, fn)...)
	for _, p := range r.cat.partitions {
		stmts = append(stmts, r.pgTriggers(p.quoted(), fn)...)
	}
	return stmts
}

// pgTriggers returns the DDL (re)creating the capture triggers of rel (quoted), a captured
// table or one of its partitions, calling the trigger function fn.
func (r *resolved) pgTriggers(rel, fn string) []string {
	stmts := pgDropTriggers(rel)
	for _, op := range r.ops {
		ref := map[Operation]string{Inserted: "NEW TABLE AS " + pgNewRows, Updated: "OLD TABLE AS " + pgOldRows + " NEW TABLE AS " + pgNewRows, Deleted: "OLD TABLE AS " + pgOldRows}[op]
		stmts = append(stmts, fmt.Sprintf("CREATE TRIGGER %s AFTER %s ON %s REFERENCING %s FOR EACH STATEMENT EXECUTE FUNCTION %s()",
			quoteIdent(pgTrigger+"_"+string(op)), pgOp(op), rel, ref, fn))
	}
	switch r.Truncate {
	case TruncateRefuse:
		stmts = append(stmts, fmt.Sprintf("CREATE TRIGGER %s BEFORE TRUNCATE ON %s FOR EACH STATEMENT EXECUTE FUNCTION %s()", pgTruncateTrigger, rel, fn))
	case TruncateCapture:
		stmts = append(stmts, fmt.Sprintf("CREATE TRIGGER %s AFTER TRUNCATE ON %s FOR EACH STATEMENT EXECUTE FUNCTION %s()", pgTruncateTrigger, rel, fn))
	}
	if !r.SkipReplicaSessions {
		for _, name := range r.triggerNames() {
			stmts = append(stmts, fmt.Sprintf("ALTER TABLE %s ENABLE ALWAYS TRIGGER %s", rel, quoteIdent(name)))
		}
	}
	return stmts
}

// triggerNames returns the names of the triggers Install creates on the table and on each of
// its partitions.
func (r *resolved) triggerNames() []string {
	var names []string
	for _, op := range r.ops {
		names = append(names, pgTrigger+"_"+string(op))
	}
	if r.Truncate != TruncateIgnore {
		names = append(names, pgTruncateTrigger)
	}
	return names
}

// pgDropTriggers returns the statements dropping every capture trigger of table (quoted).
func pgDropTriggers(table string) []string {
	var out []string
	// pgTrigger alone is the row trigger of earlier versions of this package.
	for _, name := range []string{pgTrigger, pgTrigger + "_" + string(Inserted), pgTrigger + "_" + string(Updated), pgTrigger + "_" + string(Deleted), pgTruncateTrigger} {
		out = append(out, fmt.Sprintf("DROP TRIGGER IF EXISTS %s ON %s", quoteIdent(name), table))
	}
	return out
}

// pgUninstall returns the DDL removing the triggers of schema.table.
func pgUninstall(schema, table string) []string {
	return append(pgDropTriggers(pgx.Identifier{schema, table}.Sanitize()), fmt.Sprintf("DROP FUNCTION IF EXISTS %s()", pgFunction(schema, table)))
}

func pgOp(op Operation) string {
	return map[Operation]string{Inserted: "INSERT", Updated: "UPDATE", Deleted: "DELETE"}[op]
}

func containsOp(ops []Operation, op Operation) bool {
	for _, o := range ops {
		if o == op {
			return true
		}
	}
	return false
}
