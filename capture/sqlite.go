package capture

import (
	"context"
	"database/sql/driver"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/watermill-outbox/outbox"
	"modernc.org/sqlite"
)

// SQLite: three row triggers per captured table (insert, update, delete), each one INSERT …
// VALUES into the outbox built with SQLite's JSON functions. SQLite has one writer at a time,
// so sequence order is commit order without locks.

// SQLiteBase64 is the SQL function the SQLite triggers call to render a BLOB column as
// base64 (SQLite has no built-in one). Importing this package registers it with
// modernc.org/sqlite (driver "sqlite") for every connection opened afterwards; a writer using
// another driver must register a function of this name (one argument, standard base64 with
// padding, NULL for NULL), or its writes to a captured table with a BLOB column fail.
const SQLiteBase64 = "outbox_base64"

func init() {
	sqlite.MustRegisterDeterministicScalarFunction(SQLiteBase64, 1, func(_ *sqlite.FunctionContext, args []driver.Value) (driver.Value, error) {
		switch v := args[0].(type) {
		case nil:
			return nil, nil
		case []byte:
			return base64.StdEncoding.EncodeToString(v), nil
		case string:
			return base64.StdEncoding.EncodeToString([]byte(v)), nil
		default:
			return base64.StdEncoding.EncodeToString([]byte(fmt.Sprint(v))), nil
		}
	})
}

// sqliteTimeFmt renders SQLite's current time as ISO 8601 in UTC with microseconds (SQLite's
// clock has milliseconds).
const sqliteNow = `strftime('%Y-%m-%dT%H:%M:%f', 'now') || '000+00:00'`

// sqliteMillis is the current Unix time in milliseconds; julianday rather than
// unixepoch('subsec'), which SQLite before 3.42 lacks (the sqlite3 shell of Debian 12 is
// 3.40), so writers with an older library are captured too. 'now' is stable within a
// statement.
const sqliteMillis = `CAST(round((julianday('now') - 2440587.5) * 86400000) AS INTEGER)`

// sqliteUUIDv7 is a version 7 UUID (RFC 9562): 48 bits of Unix milliseconds, version 7, 12
// random bits, variant 10, 62 random bits.
const sqliteUUIDv7 = `(substr(printf('%012x', ` + sqliteMillis + `), 1, 8) || '-' || substr(printf('%012x', ` + sqliteMillis + `), 9, 4) || '-7' || substr(lower(hex(randomblob(2))), 2, 3) || '-' || substr('89ab', 1 + (abs(random()) % 4), 1) || substr(lower(hex(randomblob(2))), 2, 3) || '-' || lower(hex(randomblob(6))))`

// sqliteRule returns the JSON rule of a declared column type (SQLite's type names are free
// text; the rules follow its affinity names), or nil when there is none.
func sqliteRule(decl string) func(x string) string {
	d := strings.ToUpper(decl)
	has := func(subs ...string) bool {
		for _, s := range subs {
			if strings.Contains(d, s) {
				return true
			}
		}
		return false
	}
	switch {
	case has("BOOL"):
		return func(x string) string {
			return fmt.Sprintf("CASE WHEN %[1]s IS NULL THEN NULL WHEN %[1]s THEN json('true') ELSE json('false') END", x)
		}
	case has("JSON"):
		return func(x string) string { return "json(" + x + ")" }
	case has("INT"):
		return func(x string) string { return x }
	case has("CHAR", "CLOB", "TEXT", "UUID"):
		// A TEXT column can hold a BLOB (database/sql writes a []byte as one), which
		// json_object refuses: read it as the text it is.
		return func(x string) string {
			return fmt.Sprintf("CASE WHEN typeof(%[1]s) = 'blob' THEN CAST(%[1]s AS TEXT) ELSE %[1]s END", x)
		}
	case has("BLOB", "BYTEA"):
		return func(x string) string { return SQLiteBase64 + "(" + x + ")" }
	case has("REAL", "FLOA", "DOUB"):
		// SQLite stores NaN as NULL; infinities are ±9e999.
		return func(x string) string {
			return fmt.Sprintf("CASE WHEN %[1]s = 9e999 THEN 'Infinity' WHEN %[1]s = -9e999 THEN '-Infinity' ELSE %[1]s END", x)
		}
	case has("DATE", "TIME"):
		// Text as stored (store ISO 8601); Unix seconds as ISO 8601 in UTC.
		return func(x string) string {
			return fmt.Sprintf("CASE WHEN typeof(%[1]s) IN ('integer', 'real') THEN strftime('%%Y-%%m-%%dT%%H:%%M:%%S', %[1]s, 'unixepoch') || '+00:00' ELSE %[1]s END", x)
		}
	}
	// NUMERIC/DECIMAL (stored as INTEGER or REAL: "12.50" would read 12.5, not exact) and
	// columns without a type.
	return nil
}

func sqliteTableName(name string) string {
	return strings.TrimPrefix(name, "main.")
}

func sqliteOutboxExists(ctx context.Context, c conn, tg *target) (bool, error) {
	got, err := queryStrings(ctx, c, `SELECT name FROM sqlite_master WHERE type = 'table' AND name = $1`, tg.parts[len(tg.parts)-1])
	return len(got) == 1, err
}

func sqliteCatalog(ctx context.Context, c conn, name string, tg *target) (*catalog, error) {
	table := sqliteTableName(name)
	got, err := queryStrings(ctx, c, `SELECT name FROM sqlite_master WHERE type = 'table' AND name = $1`, table)
	if err != nil || len(got) == 0 {
		return nil, err
	}
	cat := &catalog{schema: "main", table: got[0], isOutbox: strings.EqualFold(got[0], tg.parts[len(tg.parts)-1])}
	rs, err := c.query(ctx, `SELECT name, type, pk FROM pragma_table_xinfo($1) WHERE hidden IN (0, 2, 3) ORDER BY cid`, table)
	if err != nil {
		return nil, err
	}
	defer rs.Close()
	pk := map[int]string{}
	for rs.Next() {
		var (
			col, typ string
			pos      int
		)
		if err := rs.Scan(&col, &typ, &pos); err != nil {
			return nil, err
		}
		if pos > 0 {
			pk[pos] = col
		}
		cat.cols = append(cat.cols, catColumn{name: col, typ: typ, json: sqliteRule(typ),
			text:     func(x string) string { return "CAST(" + x + " AS TEXT)" },
			distinct: func(a, b string) string { return a + " IS NOT " + b }})
	}
	for i := 1; i <= len(pk); i++ {
		cat.pk = append(cat.pk, pk[i])
	}
	return cat, rs.Err()
}

func sqliteTrigger(table string, op Operation) string {
	return quoteIdent("outbox_capture_" + table + "_" + string(op))
}

func (r *resolved) sqliteImage(alias string, cols []catColumn) string {
	return "json_object(" + strings.Join(pairs(alias, cols), ", ") + ")"
}

// sqliteStatements returns the DDL installing r's triggers.
func (r *resolved) sqliteStatements(tg *target) []string {
	var stmts []string
	for _, op := range []Operation{Inserted, Updated, Deleted} {
		name := sqliteTrigger(r.cat.table, op)
		stmts = append(stmts, "DROP TRIGGER IF EXISTS "+name)
		if !containsOp(r.ops, op) {
			continue
		}
		alias := map[Operation]string{Inserted: "NEW", Updated: "NEW", Deleted: "OLD"}[op]
		var diffs, names, changedSel []string
		for _, c := range r.carried {
			d := c.distinct(rowRef("OLD")(c.name), rowRef("NEW")(c.name))
			diffs = append(diffs, d)
			names = append(names, quoteLiteral(c.name))
			changedSel = append(changedSel, fmt.Sprintf("SELECT %s AS c WHERE %s", quoteLiteral(c.name), d))
		}
		changed := "json_array(" + strings.Join(names, ", ") + ")"
		when := ""
		if op == Updated {
			changed = "json('[]')"
			if len(changedSel) > 0 {
				changed = "json((SELECT json_group_array(c) FROM (" + strings.Join(changedSel, " UNION ALL ") + ")))"
			}
			if !r.EmitUnchanged {
				if len(r.key) > 0 {
					diffs = append(diffs, r.keyChanged("OLD", "NEW"))
				}
				when = " WHEN " + strings.Join(append(diffs, "0"), " OR ")
			}
		}
		env := r.envelope(op, r.pk(alias, "NULL", r.sqliteImage), changed, sqliteNow, "OLD", "NEW", "NULL", r.sqliteImage)
		for _, k := range sortedKeys(r.Extend.Payload) {
			env = append(env, quoteLiteral(k)+", "+expandRow(r.Extend.Payload[k], alias))
		}
		payload := "json_object(" + strings.Join(env, ", ") + ")"
		if op == Updated && r.Payload != PayloadBeforeAndAfter && len(r.key) > 0 {
			payload = fmt.Sprintf("CASE WHEN %s THEN json_set(%s, '$.before', %s) ELSE %s END", r.keyChanged("OLD", "NEW"), payload, r.sqliteImage("OLD", r.key), payload)
		}
		if tg.cfg.PayloadType == outbox.PayloadBytea {
			payload = "CAST(" + payload + " AS BLOB)"
		}
		headers := "'{}'"
		if len(r.Extend.Headers) > 0 {
			var pairs []string
			for _, k := range sortedKeys(r.Extend.Headers) {
				pairs = append(pairs, quoteLiteral(k)+", CAST("+expandRow(r.Extend.Headers[k], alias)+" AS TEXT)")
			}
			headers = "(SELECT json_group_object(key, value) FROM json_each(json_object(" + strings.Join(pairs, ", ") + ")) WHERE type <> 'null')"
		}
		okey := r.orderingKey(alias, func(p []string) string { return "(" + strings.Join(p, " || ") + ")" })
		// created_at explicitly (microseconds, the dialect's time value): the table's default
		// needs unixepoch('subsec') (SQLite 3.42+).
		cols := []string{`"id"`, `"topic"`, `"payload"`, `"headers"`, `"ordering_key"`, `"created_at"`}
		vals := []string{sqliteUUIDv7, quoteLiteral(r.topicFor(op)), payload, headers, "nullif(" + okey + ", '')", sqliteMillis + " * 1000"}
		for _, c := range sortedKeys(r.Extend.Columns) {
			cols, vals = append(cols, quoteIdent(c)), append(vals, expandRow(r.Extend.Columns[c], alias))
		}
		stmts = append(stmts, fmt.Sprintf("CREATE TRIGGER %s AFTER %s ON %s FOR EACH ROW%s BEGIN\n  INSERT INTO %s (%s) VALUES (%s);\nEND",
			name, pgOp(op), quoteIdent(r.cat.table), when, tg.table, strings.Join(cols, ", "), strings.Join(vals, ", ")))
	}
	return stmts
}

func sqliteUninstall(name string) []string {
	table := sqliteTableName(name)
	var stmts []string
	for _, op := range []Operation{Inserted, Updated, Deleted} {
		stmts = append(stmts, "DROP TRIGGER IF EXISTS "+sqliteTrigger(table, op))
	}
	return stmts
}

// sqliteVerify checks that each table has the triggers of its declaration's Operations.
func sqliteVerify(ctx context.Context, c conn, tables []Table) error {
	var problems []TriggerProblem
	for i, t := range tables {
		ch, err := check(i, t)
		if err != nil {
			return err
		}
		table := sqliteTableName(t.Name)
		got, err := queryStrings(ctx, c, `SELECT name FROM sqlite_master WHERE type = 'table' AND name = $1`, table)
		if err != nil {
			return fmt.Errorf("capture: verify %s: %w", t.Name, err)
		}
		if len(got) == 0 {
			return &outbox.ConfigError{Field: ch.field("Name"), Reason: fmt.Sprintf("no table %q", t.Name), Err: ErrUnknownTable}
		}
		for _, op := range ch.ops {
			name := "outbox_capture_" + got[0] + "_" + string(op)
			n, err := queryStrings(ctx, c, `SELECT name FROM sqlite_master WHERE type = 'trigger' AND tbl_name = $1 AND name = $2`, got[0], name)
			if err != nil {
				return fmt.Errorf("capture: verify %s: %w", t.Name, err)
			}
			if len(n) == 0 {
				problems = append(problems, TriggerProblem{Table: "main." + got[0], Relation: "main." + got[0], Trigger: name, Problem: "missing"})
			}
		}
	}
	if len(problems) > 0 {
		return &VerifyError{Problems: problems}
	}
	return nil
}

// sqliteBackend is SQLite.
type sqliteBackend struct{}

func (sqliteBackend) title() string       { return "SQLite" }
func (sqliteBackend) lock(*target) string { return "" }

func (sqliteBackend) outboxExists(ctx context.Context, c conn, tg *target) (bool, error) {
	return sqliteOutboxExists(ctx, c, tg)
}

func (sqliteBackend) catalog(ctx context.Context, c conn, name string, tg *target) (*catalog, error) {
	return sqliteCatalog(ctx, c, name, tg)
}

func (sqliteBackend) statements(r *resolved, tg *target) []string { return r.sqliteStatements(tg) }

func (sqliteBackend) installed(context.Context, conn, *plan) error { return nil }

func (sqliteBackend) script(*plan) (string, []string) { return "BEGIN IMMEDIATE;\n", nil }

func (sqliteBackend) uninstall(_ context.Context, _ conn, _ *target, tables []Table) ([]string, error) {
	var stmts []string
	for _, t := range tables {
		stmts = append(stmts, sqliteUninstall(t.Name)...)
	}
	return stmts, nil
}

// verify checks each named table (SQLite triggers cannot be disabled and fire for every
// session); without tables it checks nothing.
func (sqliteBackend) verify(ctx context.Context, c conn, _ *target, tables []Table) error {
	return sqliteVerify(ctx, c, tables)
}

func (sqliteBackend) txSettings() bool { return false }

// withExtension installs a temporary trigger on the outbox table for fn's duration.
func (sqliteBackend) withExtension(ctx context.Context, tx any, tg *target, ext Extension, _ []byte, fn func() error) error {
	var sets []string
	if len(ext.Headers) > 0 {
		h, _ := json.Marshal(ext.Headers)
		sets = append(sets, fmt.Sprintf(`"headers" = json_patch("headers", %s)`, quoteLiteral(string(h))))
	}
	if len(ext.Payload) > 0 {
		if tg.cfg.PayloadType == outbox.PayloadBytea {
			return &outbox.ConfigError{Field: "Extension.Payload", Reason: "a BYTEA outbox payload cannot take envelope keys on SQLite", Err: ErrInvalid}
		}
		expr := `"payload"`
		for _, k := range sortedKeys(ext.Payload) {
			v, err := json.Marshal(ext.Payload[k])
			if err != nil {
				return &outbox.ConfigError{Field: "Extension.Payload", Reason: err.Error(), Err: ErrInvalid}
			}
			path, _ := json.Marshal(k)
			expr = fmt.Sprintf("json_insert(%s, %s, json(%s))", expr, quoteLiteral("$."+string(path)), quoteLiteral(string(v)))
		}
		sets = append(sets, `"payload" = `+expr)
	}
	for _, k := range sortedKeys(ext.Columns) {
		v, err := json.Marshal(ext.Columns[k])
		if err != nil {
			return &outbox.ConfigError{Field: "Extension.Columns", Reason: err.Error(), Err: ErrInvalid}
		}
		sets = append(sets, fmt.Sprintf("%s = json_extract(%s, '$')", quoteIdent(k), quoteLiteral(string(v))))
	}
	if len(sets) == 0 {
		return fn()
	}
	name := quoteIdent("outbox_capture_extension_" + tg.parts[len(tg.parts)-1])
	return inTxOnly(ctx, tx, func(c conn) error {
		if err := c.exec(ctx, "DROP TRIGGER IF EXISTS temp."+name); err != nil {
			return fmt.Errorf("capture: set extension: %w", err)
		}
		ddl := fmt.Sprintf(`CREATE TEMP TRIGGER %s AFTER INSERT ON main.%s FOR EACH ROW BEGIN UPDATE %s SET %s WHERE "sequence" = NEW."sequence"; END`,
			name, tg.table, tg.table, strings.Join(sets, ", "))
		if err := c.exec(ctx, ddl); err != nil {
			return fmt.Errorf("capture: set extension: %w", err)
		}
		fnErr := fn()
		if err := c.exec(context.WithoutCancel(ctx), "DROP TRIGGER IF EXISTS temp."+name); err != nil && fnErr == nil {
			return fmt.Errorf("capture: clear extension: %w", err)
		}
		return fnErr
	})
}
