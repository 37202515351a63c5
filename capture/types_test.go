package capture_test

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/capture"
	"github.com/watermill-outbox/outbox/internal/pgtest"
)

// bigBlob is the 1 MB (3 × 349,526 bytes) value of the bytea rule's size check.
var bigBlob = bytes.Repeat([]byte{0x00, 0xff, 0x7f}, 349526)

// TestTypeRulesPostgreSQL: one column of every type with a JSON rule; values, NULLs,
// NaN/±Infinity, a 1 MB bytea.
func TestTypeRulesPostgreSQL(t *testing.T) {
	h := pgHarness(t, nil)
	tb := h.table()
	h.exec(fmt.Sprintf(`DROP TYPE IF EXISTS %[1]s_mood; DROP DOMAIN IF EXISTS %[1]s_money`, tb),
		fmt.Sprintf(`CREATE TYPE %s_mood AS ENUM ('sad', 'happy')`, tb),
		fmt.Sprintf(`CREATE DOMAIN %s_money AS numeric(8,2)`, tb))
	t.Cleanup(func() {
		_, _ = pgtest.StdDB(t).ExecContext(ctx, fmt.Sprintf(`DROP TABLE IF EXISTS %[1]s; DROP TYPE IF EXISTS %[1]s_mood; DROP DOMAIN IF EXISTS %[1]s_money`, tb))
	})
	h.exec(fmt.Sprintf(`CREATE TABLE %[1]s (id int PRIMARY KEY, i2 smallint, i8 bigint, n numeric(10,2), f4 real, f8 double precision,
		b bool, t text, vc varchar(10), ch char(3), u uuid, ip inet, net cidr, mac macaddr, mood %[1]s_mood, money %[1]s_money,
		tstz timestamptz, ts timestamp, d date, tm time, iv interval, by bytea, j json, jb jsonb,
		ai int[], an numeric[], at text[], r int4range, nr numrange, tr tstzrange)`, tb))
	h.install(capture.Table{Name: tb})
	cols := `"id","i2","i8","n","f4","f8","b","t","vc","ch","u","ip","net","mac","mood","money","tstz","ts","d","tm","iv","by","j","jb","ai","an","at","r","nr","tr"`
	nulls := `"i2":null,"i8":null,"n":null,"f4":null,"f8":null,"b":null,"t":null,"vc":null,"ch":null,"u":null,"ip":null,"net":null,"mac":null,"mood":null,"money":null,"tstz":null,"ts":null,"d":null,"tm":null,"iv":null,"by":null,"j":null,"jb":null,"ai":null,"an":null,"at":null,"r":null,"nr":null,"tr":null`
	k := func(id int) string { return fmt.Sprintf("%s:%d", tb, id) }
	h.expect([]want{
		h.w(tb, "inserted", k(1), `{"table":"{q}","operation":"inserted","pk":1,"changed":[`+cols+`],"after":{"id":1,"i2":-3,"i8":9007199254740993,"n":"12.50","f4":1.5,"f8":-0.25,
			"b":true,"t":"text ✓","vc":"v","ch":"ab","u":"0190a4e2-0000-7000-8000-000000000001","ip":"192.168.0.1/24","net":"10.0.0.0/8","mac":"08:00:2b:01:02:03","mood":"happy","money":"3.10",
			"tstz":"2024-01-02T01:04:05.123456+00:00","ts":"2024-01-02T03:04:05","d":"2024-01-02","tm":"03:04:05","iv":86402.5,"by":"AAH/","j":{"b":1,"a":[1,2]},"jb":{"x":null},
			"ai":[1,2,3],"an":["1.10","2"],"at":["a","b c"],"r":{"lower":1,"upper":5,"lower_inc":true,"upper_inc":false,"is_empty":false},
			"nr":{"lower":"1.5","upper":"2.50","lower_inc":false,"upper_inc":true,"is_empty":false},
			"tr":{"lower":"2024-01-02T00:00:00.000000+00:00","upper":null,"lower_inc":true,"upper_inc":false,"is_empty":false}}}`),
		h.w(tb, "inserted", k(2), `{"table":"{q}","operation":"inserted","pk":2,"changed":[`+cols+`],"after":{"id":2,`+nulls+`}}`),
		h.w(tb, "inserted", k(3), `{"table":"{q}","operation":"inserted","pk":3,"changed":[`+cols+`],"after":{"id":3,`+strings.NewReplacer(`"n":null`, `"n":"NaN"`, `"f4":null`, `"f4":"Infinity"`, `"f8":null`, `"f8":"NaN"`, `"ai":null`, `"ai":[]`, `"an":null`, `"an":[]`, `"r":null`, `"r":{"lower":null,"upper":null,"lower_inc":false,"upper_inc":false,"is_empty":true}`).Replace(nulls)+`}}`),
		h.w(tb, "inserted", k(4), `{"table":"{q}","operation":"inserted","pk":4,"changed":[`+cols+`],"after":{"id":4,`+strings.NewReplacer(`"f8":null`, `"f8":"-Infinity"`, `"by":null`, `"by":"`+base64.StdEncoding.EncodeToString(bigBlob)+`"`).Replace(nulls)+`}}`),
	}, fmt.Sprintf(`INSERT INTO %s VALUES (1, -3, 9007199254740993, 12.50, 1.5, -0.25, true, 'text ✓', 'v', 'ab', '0190a4e2-0000-7000-8000-000000000001',
		'192.168.0.1/24', '10.0.0.0/8', '08:00:2b:01:02:03', 'happy', 3.1, '2024-01-02 03:04:05.123456+02', '2024-01-02 03:04:05', '2024-01-02', '03:04:05',
		'1 day 2.5 seconds', '\x0001ff', '{"b":1,"a":[1,2]}', '{"x":null}', '{1,2,3}', '{1.10,2}', '{a,"b c"}', '[1,5)', '(1.5,2.50]', '[2024-01-02 00:00:00+00,)')`, tb),
		fmt.Sprintf(`INSERT INTO %s (id) VALUES (2)`, tb),
		fmt.Sprintf(`INSERT INTO %s (id, n, f4, f8, ai, an, r) VALUES (3, 'NaN', 'Infinity', 'NaN', '{}', '{}', 'empty')`, tb),
		fmt.Sprintf(`INSERT INTO %s (id, f8, by) VALUES (4, '-Infinity', decode(repeat('00ff7f', 349526), 'hex'))`, tb))
}

// TestTypeRulesSQLite: the SQLite column types with a rule.
func TestTypeRulesSQLite(t *testing.T) {
	h := sqliteHarness(t, nil)
	tb := h.table()
	h.exec(fmt.Sprintf(`CREATE TABLE %s (id INTEGER PRIMARY KEY, i INTEGER, f REAL, b BOOLEAN, t TEXT, vc VARCHAR(10), u UUID, j JSON, by BLOB, ts TIMESTAMP, d DATE)`, tb))
	h.install(capture.Table{Name: tb})
	cols := `"id","i","f","b","t","vc","u","j","by","ts","d"`
	nulls := `"i":null,"f":null,"b":null,"t":null,"vc":null,"u":null,"j":null,"by":null,"ts":null,"d":null`
	k := func(id int) string { return fmt.Sprintf("%s:%d", tb, id) }
	h.expect([]want{
		h.w(tb, "inserted", k(1), `{"table":"{q}","operation":"inserted","pk":1,"changed":[`+cols+`],"after":{"id":1,"i":9007199254740993,"f":-0.25,"b":true,"t":"text ✓","vc":"v",
			"u":"0190a4e2-0000-7000-8000-000000000001","j":{"b":1,"a":[1,2]},"by":"AAH/","ts":"2024-01-02T01:04:05.123456+00:00","d":"2024-01-02"}}`),
		h.w(tb, "inserted", k(2), `{"table":"{q}","operation":"inserted","pk":2,"changed":[`+cols+`],"after":{"id":2,`+nulls+`}}`),
		h.w(tb, "inserted", k(3), `{"table":"{q}","operation":"inserted","pk":3,"changed":[`+cols+`],"after":{"id":3,`+strings.NewReplacer(`"f":null`, `"f":"Infinity"`, `"b":null`, `"b":false`, `"ts":null`, `"ts":"2024-01-02T01:04:05+00:00"`).Replace(nulls)+`}}`),
		h.w(tb, "inserted", k(4), `{"table":"{q}","operation":"inserted","pk":4,"changed":[`+cols+`],"after":{"id":4,`+strings.NewReplacer(`"f":null`, `"f":"-Infinity"`, `"by":null`, `"by":"`+base64.StdEncoding.EncodeToString(bigBlob)+`"`).Replace(nulls)+`}}`),
	}, fmt.Sprintf(`INSERT INTO %s VALUES (1, 9007199254740993, -0.25, true, 'text ✓', 'v', '0190a4e2-0000-7000-8000-000000000001', '{"b":1,"a":[1,2]}', x'0001ff', '2024-01-02T01:04:05.123456+00:00', '2024-01-02')`, tb),
		fmt.Sprintf(`INSERT INTO %s (id) VALUES (2)`, tb),
		fmt.Sprintf(`INSERT INTO %s (id, f, b, ts) VALUES (3, 9e999, false, 1704157445)`, tb),
		fmt.Sprintf(`INSERT INTO %s (id, f, by) VALUES (4, -9e999, unhex(replace(hex(zeroblob(349526)), '00', '00FF7F')))`, tb))
}

// TestCopyAndTruncate (PostgreSQL): COPY fires the row triggers; TRUNCATE is refused by
// default and captured as one event when asked.
func TestCopyAndTruncate(t *testing.T) {
	h := pgHarness(t, nil)
	refused, captured := h.table(), h.table()
	for _, tb := range []string{refused, captured} {
		h.exec(fmt.Sprintf(`CREATE TABLE %s (id int PRIMARY KEY, name text)`, tb))
	}
	h.install(capture.Table{Name: refused}, capture.Table{Name: captured, Truncate: capture.TruncateCapture, Payload: capture.PayloadKeys})
	since := h.lastSeq()
	conn, err := pgtest.Require(t).Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	n, err := conn.Conn().CopyFrom(ctx, pgx.Identifier{refused}, []string{"id", "name"}, pgx.CopyFromRows([][]any{{int32(1), "a"}, {int32(2), "b"}}))
	conn.Release()
	if err != nil || n != 2 {
		t.Fatalf("copy: %d, %v", n, err)
	}
	h.check(since, []want{
		h.w(refused, "inserted", refused+":1", `{"table":"{q}","operation":"inserted","pk":1,"changed":["id","name"],"after":{"id":1,"name":"a"}}`),
		h.w(refused, "inserted", refused+":2", `{"table":"{q}","operation":"inserted","pk":2,"changed":["id","name"],"after":{"id":2,"name":"b"}}`),
	})
	if _, err := h.db.ExecContext(ctx, fmt.Sprintf(`TRUNCATE %s`, refused)); err == nil || !strings.Contains(err.Error(), "TRUNCATE") {
		t.Fatalf("truncate of a captured table: %v, want refused", err)
	}
	h.exec(fmt.Sprintf(`INSERT INTO %s VALUES (1, 'a')`, captured))
	h.expect([]want{{topic: captured + ".truncated", env: h.r(captured, `{"table":"{q}","operation":"truncated"}`)}}, fmt.Sprintf(`TRUNCATE %s`, captured))
}

// TestSchemasAndSearchPath (PostgreSQL): a captured table in its own schema, the outbox
// table configured unqualified (found through search_path at install); the trigger writes
// into the outbox table resolved at install, whatever the writer's search_path.
func TestSchemasAndSearchPath(t *testing.T) {
	db := pgtest.StdDB(t)
	schemaName := pgtest.Table(t) // a fresh name
	h := &harness{t: t, db: db, prefix: schemaName}
	h.exec(fmt.Sprintf(`CREATE SCHEMA %s`, schemaName))
	t.Cleanup(func() { _, _ = db.ExecContext(ctx, fmt.Sprintf(`DROP SCHEMA IF EXISTS %s CASCADE`, schemaName)) })
	h.schema.Table = pgtest.Table(t)
	if err := outbox.Migrate(ctx, db, h.schema); err != nil {
		t.Fatal(err)
	}
	h.exec(fmt.Sprintf(`CREATE TABLE %s.loan (id int PRIMARY KEY, status text)`, schemaName))
	h.install(capture.Table{Name: schemaName + ".loan", OrderingKey: "{schema}.{table}:{pk}"})
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{`SET LOCAL search_path = pg_catalog`, fmt.Sprintf(`INSERT INTO %s.loan VALUES (1, 'a')`, schemaName)} {
		if _, err := tx.ExecContext(ctx, q); err != nil {
			t.Fatal(q, err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	var topic, key, payload string
	if err := db.QueryRowContext(ctx, fmt.Sprintf(`SELECT topic, ordering_key, (payload::jsonb - 'occurred_at')::text FROM public.%s`, h.schema.Table)).Scan(&topic, &key, &payload); err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf(`{"pk": 1, "after": {"id": 1, "status": "a"}, "table": "%s.loan", "changed": ["id", "status"], "operation": "inserted"}`, schemaName)
	if topic != "loan.inserted" || key != schemaName+".loan:1" || payload != want {
		t.Fatalf("got %s %s %s\nwant payload %s", topic, key, payload, want)
	}
}
