package capture_test

import (
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"reflect"
	"sort"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/capture"
	"github.com/watermill-outbox/outbox/internal/pgtest"
)

var privateDBs atomic.Int64

// privateDatabase returns a harness on a database of its own on the shared server (Install
// creates a database-wide event trigger for a partitioned table: it must not act on the DDL
// of other tests), dropped when the test ends, and the database's URL.
func privateDatabase(t *testing.T) (*harness, string) {
	t.Helper()
	admin := pgtest.StdDB(t)
	name := fmt.Sprintf("capture_%d_%d", os.Getpid(), privateDBs.Add(1))
	if _, err := admin.ExecContext(ctx, `DROP DATABASE IF EXISTS `+name+` WITH (FORCE)`); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.ExecContext(ctx, `CREATE DATABASE `+name); err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(pgtest.DSN())
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	db, err := sql.Open("pgx", u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		db.Close()
		if _, err := admin.ExecContext(ctx, `DROP DATABASE IF EXISTS `+name+` WITH (FORCE)`); err != nil {
			t.Errorf("drop database %s: %v", name, err)
		}
	})
	h := &harness{t: t, db: db, schema: outbox.SchemaConfig{Table: "outbox_events"}, prefix: "public"}
	if err := outbox.Migrate(ctx, db, h.schema); err != nil {
		t.Fatal(err)
	}
	return h, u.String()
}

// partitioned creates a table partitioned by region: tb_eu, a partition with an awkward quoted
// name, and tb_us, itself partitioned by id into tb_us_low and tb_us_high. It returns the
// quoted names of the table and of the partitions.
func (h *harness) partitioned() (tb, eu, odd, us, usLow, usHigh string) {
	h.t.Helper()
	tb = h.table()
	eu, odd, us, usLow, usHigh = tb+"_eu", pgx.Identifier{tb + ` "odd"; part`}.Sanitize(), tb+"_us", tb+"_us_low", tb+"_us_high"
	h.exec(fmt.Sprintf(`CREATE TABLE %s (id int NOT NULL, region text NOT NULL, note text, PRIMARY KEY (id, region)) PARTITION BY LIST (region)`, tb),
		fmt.Sprintf(`CREATE TABLE %s PARTITION OF %s FOR VALUES IN ('eu')`, eu, tb),
		fmt.Sprintf(`CREATE TABLE %s PARTITION OF %s FOR VALUES IN ('odd')`, odd, tb),
		fmt.Sprintf(`CREATE TABLE %s PARTITION OF %s FOR VALUES IN ('us') PARTITION BY RANGE (id)`, us, tb),
		fmt.Sprintf(`CREATE TABLE %s PARTITION OF %s FOR VALUES FROM (MINVALUE) TO (100)`, usLow, us),
		fmt.Sprintf(`CREATE TABLE %s PARTITION OF %s FOR VALUES FROM (100) TO (MAXVALUE)`, usHigh, us))
	return
}

// ev is the expected event of a row of a table made by partitioned.
func (h *harness) ev(tb, op string, id int, region, note string) want {
	env := fmt.Sprintf(`{"table":"{q}","operation":%q,"pk":{"id":%d,"region":%q},"changed":["id","region","note"],"after":{"id":%d,"region":%q,"note":%q}}`, op, id, region, id, region, note)
	switch op {
	case "deleted":
		env = fmt.Sprintf(`{"table":"{q}","operation":"deleted","pk":{"id":%d,"region":%q},"changed":["id","region","note"],"before":{"id":%d,"region":%q,"note":%q}}`, id, region, id, region, note)
	case "updated":
		env = fmt.Sprintf(`{"table":"{q}","operation":"updated","pk":{"id":%d,"region":%q},"changed":["note"],"after":{"id":%d,"region":%q,"note":%q}}`, id, region, id, region, note)
	}
	return h.w(tb, op, fmt.Sprintf("%s:%d:%s", tb, id, region), env)
}

// TestPartitionWrites: writes naming a partition — INSERT, COPY, UPDATE, DELETE, into a
// sub-partition too — and writes to partitions created or attached after Install write
// exactly the events a write through the partitioned table writes (the table, topic and
// ordering key of the partitioned table). The triggers were on the partitioned table only:
// a statement naming a partition wrote no event.
func TestPartitionWrites(t *testing.T) {
	h0, dsn := privateDatabase(t)
	tb, eu, odd, _, usLow, usHigh := h0.partitioned()
	h0.install(capture.Table{Name: tb})
	// Each case has rows of its own, so one failing does not hide the others.
	run := func(name string, fn func(t *testing.T, h *harness)) {
		t.Run(name, func(t *testing.T) {
			h := *h0
			h.t = t
			fn(t, &h)
		})
	}
	run("insert", func(t *testing.T, h *harness) {
		h.expect([]want{h.ev(tb, "inserted", 1, "eu", "via parent")}, fmt.Sprintf(`INSERT INTO %s VALUES (1, 'eu', 'via parent')`, tb))
		h.expect([]want{h.ev(tb, "inserted", 2, "eu", "a"), h.ev(tb, "inserted", 3, "eu", "b")}, fmt.Sprintf(`INSERT INTO %s VALUES (2, 'eu', 'a'), (3, 'eu', 'b')`, eu))
		h.expect([]want{h.ev(tb, "inserted", 4, "odd", "o")}, fmt.Sprintf(`INSERT INTO %s VALUES (4, 'odd', 'o')`, odd))
	})
	run("insert-sub-partition", func(t *testing.T, h *harness) {
		h.expect([]want{h.ev(tb, "inserted", 5, "us", "low")}, fmt.Sprintf(`INSERT INTO %s VALUES (5, 'us', 'low')`, usLow))
	})
	run("update", func(t *testing.T, h *harness) {
		h.exec(fmt.Sprintf(`INSERT INTO %s VALUES (40, 'eu', 'a'), (41, 'us', 'low')`, tb))
		h.expect([]want{h.ev(tb, "updated", 40, "eu", "a2")}, fmt.Sprintf(`UPDATE %s SET note = 'a2' WHERE id = 40`, eu))
		h.expect([]want{h.ev(tb, "updated", 41, "us", "low2")}, fmt.Sprintf(`UPDATE %s SET note = 'low2' WHERE id = 41`, usLow))
	})
	run("update-moves-row", func(t *testing.T, h *harness) {
		// Through the table, an UPDATE moving a row to another partition is one "updated"
		// event (a key change: the old key in "before").
		h.exec(fmt.Sprintf(`INSERT INTO %s VALUES (60, 'eu', 'm')`, tb))
		h.expect([]want{h.w(tb, "updated", tb+":60:odd", `{"table":"{q}","operation":"updated","pk":{"id":60,"region":"odd"},"changed":["region"],"after":{"id":60,"region":"odd","note":"m"},"before":{"id":60,"region":"eu"}}`)},
			fmt.Sprintf(`UPDATE %s SET region = 'odd' WHERE id = 60`, tb))
	})
	run("delete", func(t *testing.T, h *harness) {
		h.exec(fmt.Sprintf(`INSERT INTO %s VALUES (50, 'eu', 'b'), (51, 'odd', 'o')`, tb))
		h.expect([]want{h.ev(tb, "deleted", 50, "eu", "b")}, fmt.Sprintf(`DELETE FROM %s WHERE id = 50`, eu))
		h.expect([]want{h.ev(tb, "deleted", 51, "odd", "o")}, fmt.Sprintf(`DELETE FROM %s WHERE id = 51`, odd))
	})
	run("copy", func(t *testing.T, h *harness) {
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		since := h.lastSeq()
		n, err := conn.CopyFrom(ctx, pgx.Identifier{usHigh}, []string{"id", "region", "note"}, pgx.CopyFromRows([][]any{{int32(100), "us", "c1"}, {int32(101), "us", "c2"}}))
		if err != nil || n != 2 {
			t.Fatalf("COPY into %s: %d rows, %v", usHigh, n, err)
		}
		h.check(since, []want{h.ev(tb, "inserted", 100, "us", "c1"), h.ev(tb, "inserted", 101, "us", "c2")})
	})
	asia := tb + "_asia"
	run("created-later", func(t *testing.T, h *harness) {
		h.exec(fmt.Sprintf(`CREATE TABLE %s PARTITION OF %s FOR VALUES IN ('asia')`, asia, tb))
		h.expect([]want{h.ev(tb, "inserted", 10, "asia", "new")}, fmt.Sprintf(`INSERT INTO %s VALUES (10, 'asia', 'new')`, asia))
		h.expect([]want{h.ev(tb, "inserted", 11, "asia", "parent")}, fmt.Sprintf(`INSERT INTO %s VALUES (11, 'asia', 'parent')`, tb))
		h.expect([]want{h.ev(tb, "updated", 10, "asia", "new2")}, fmt.Sprintf(`UPDATE %s SET note = 'new2' WHERE id = 10`, asia))
		h.expect([]want{h.ev(tb, "deleted", 11, "asia", "parent")}, fmt.Sprintf(`DELETE FROM %s WHERE id = 11`, asia))
	})
	af, afSub := tb+"_af", tb+"_af_sub"
	run("attached-later", func(t *testing.T, h *harness) {
		// Columns in another order than the table's.
		h.exec(fmt.Sprintf(`CREATE TABLE %s (note text, region text NOT NULL, id int NOT NULL, PRIMARY KEY (id, region))`, af),
			fmt.Sprintf(`ALTER TABLE %s ATTACH PARTITION %s FOR VALUES IN ('af')`, tb, af))
		h.expect([]want{h.ev(tb, "inserted", 20, "af", "attached")}, fmt.Sprintf(`INSERT INTO %s (id, region, note) VALUES (20, 'af', 'attached')`, af))
		h.expect([]want{h.ev(tb, "updated", 20, "af", "attached2")}, fmt.Sprintf(`UPDATE %s SET note = 'attached2'`, af))
		h.expect([]want{h.ev(tb, "deleted", 20, "af", "attached2")}, fmt.Sprintf(`DELETE FROM %s`, af))
	})
	run("attached-later-sub-partitioned", func(t *testing.T, h *harness) {
		h.exec(fmt.Sprintf(`CREATE TABLE %s (id int NOT NULL, region text NOT NULL, note text, PRIMARY KEY (id, region)) PARTITION BY RANGE (id)`, afSub),
			fmt.Sprintf(`CREATE TABLE %s_1 PARTITION OF %s FOR VALUES FROM (MINVALUE) TO (MAXVALUE)`, afSub, afSub),
			fmt.Sprintf(`ALTER TABLE %s ATTACH PARTITION %s FOR VALUES IN ('af2')`, tb, afSub))
		h.expect([]want{h.ev(tb, "inserted", 30, "af2", "deep")}, fmt.Sprintf(`INSERT INTO %s_1 VALUES (30, 'af2', 'deep')`, afSub))
		h.expect([]want{h.ev(tb, "deleted", 30, "af2", "deep")}, fmt.Sprintf(`DELETE FROM %s`, afSub))
	})
	run("truncate-refused", func(t *testing.T, h *harness) {
		// TRUNCATE of a partition, present or later, is refused like the table's.
		for _, p := range []string{tb, eu, usLow, asia, af} {
			if _, err := h.db.ExecContext(ctx, `TRUNCATE `+p); err == nil {
				t.Errorf("TRUNCATE %s succeeded: its rows vanished without events", p)
			}
		}
	})
	run("verify", func(t *testing.T, h *harness) {
		if err := capture.Verify(ctx, h.db, h.schema); err != nil {
			t.Fatalf("Verify after partitions were added: %v", err)
		}
	})
	run("detached", func(t *testing.T, h *harness) {
		// A detached partition is no longer captured: its writes are not the table's.
		h.exec(fmt.Sprintf(`ALTER TABLE %s DETACH PARTITION %s`, tb, asia))
		h.expect(nil, fmt.Sprintf(`INSERT INTO %s VALUES (12, 'asia', 'detached')`, asia))
		if err := capture.Verify(ctx, h.db, h.schema); err != nil {
			t.Fatalf("Verify after a detach: %v", err)
		}
	})
	run("install-again", func(t *testing.T, h *harness) {
		h.install(capture.Table{Name: tb})
		h.expect([]want{h.ev(tb, "inserted", 6, "eu", "again")}, fmt.Sprintf(`INSERT INTO %s VALUES (6, 'eu', 'again')`, eu))
	})
	run("uninstall", func(t *testing.T, h *harness) {
		// Uninstall drops the partitions' triggers too (DROP FUNCTION failed on them).
		if err := capture.Uninstall(ctx, h.db, h.schema, capture.Table{Name: tb}); err != nil {
			t.Fatalf("Uninstall of a partitioned table: %v", err)
		}
		h.expect(nil, fmt.Sprintf(`INSERT INTO %s VALUES (7, 'eu', 'gone')`, eu), fmt.Sprintf(`INSERT INTO %s (id, region, note) VALUES (8, 'af', 'gone')`, af))
		var n int
		if err := h.db.QueryRowContext(ctx, `SELECT count(*) FROM pg_trigger WHERE tgname LIKE 'outbox_capture%'`).Scan(&n); err != nil || n != 0 {
			t.Fatalf("%d capture triggers left after Uninstall (%v)", n, err)
		}
	})
}

// TestReplicaSessions: writes of a session with session_replication_role = replica (pg_restore
// --disable-triggers, logical replication apply, bulk loaders) write their events by default,
// on a partition too; with SkipReplicaSessions they do not, while ordinary sessions still do.
// The triggers were enabled ORIGIN: replica sessions changed rows without events.
func TestReplicaSessions(t *testing.T) {
	h, _ := privateDatabase(t)
	tb, eu, _, _, _, _ := h.partitioned()
	h.install(capture.Table{Name: tb})
	replica := "SET LOCAL session_replication_role = replica"
	since := h.lastSeq()
	h.inTx(true, replica, fmt.Sprintf(`INSERT INTO %s VALUES (1, 'eu', 'r')`, tb), fmt.Sprintf(`INSERT INTO %s VALUES (2, 'eu', 'r')`, eu),
		fmt.Sprintf(`UPDATE %s SET note = 'r2' WHERE id = 2`, eu), fmt.Sprintf(`DELETE FROM %s WHERE id = 1`, tb))
	h.check(since, []want{h.ev(tb, "inserted", 1, "eu", "r"), h.ev(tb, "inserted", 2, "eu", "r"), h.ev(tb, "updated", 2, "eu", "r2"), h.ev(tb, "deleted", 1, "eu", "r")})
	if _, err := h.db.ExecContext(ctx, `BEGIN; SET LOCAL session_replication_role = replica; TRUNCATE `+eu+`; COMMIT`); err == nil {
		t.Fatalf("TRUNCATE %s in a replica session succeeded", eu)
	}

	h.install(capture.Table{Name: tb, SkipReplicaSessions: true})
	since = h.lastSeq()
	h.inTx(true, replica, fmt.Sprintf(`INSERT INTO %s VALUES (3, 'eu', 'skipped')`, tb), fmt.Sprintf(`UPDATE %s SET note = 'skipped'`, eu))
	h.check(since, nil)
	h.expect([]want{h.ev(tb, "inserted", 4, "eu", "origin")}, fmt.Sprintf(`INSERT INTO %s VALUES (4, 'eu', 'origin')`, eu))
	if err := capture.Verify(ctx, h.db, h.schema); err != nil {
		t.Fatalf("Verify with SkipReplicaSessions: %v", err)
	}
}

// TestReplicaSessionsPlainTable: the same on a table that is not partitioned, on the shared
// database.
func TestReplicaSessionsPlainTable(t *testing.T) {
	h := pgHarness(t, nil)
	tb := h.table()
	h.exec(fmt.Sprintf(`CREATE TABLE %s (id int PRIMARY KEY, note text)`, tb))
	h.install(capture.Table{Name: tb})
	since := h.lastSeq()
	h.inTx(true, "SET LOCAL session_replication_role = replica", fmt.Sprintf(`INSERT INTO %s VALUES (1, 'r')`, tb))
	h.check(since, []want{h.w(tb, "inserted", tb+":1", `{"table":"{q}","operation":"inserted","pk":1,"changed":["id","note"],"after":{"id":1,"note":"r"}}`)})
	h.install(capture.Table{Name: tb, SkipReplicaSessions: true})
	since = h.lastSeq()
	h.inTx(true, "SET LOCAL session_replication_role = replica", fmt.Sprintf(`INSERT INTO %s VALUES (2, 'r')`, tb))
	h.check(since, nil)
}

// TestVerify: Verify reports each partition whose trigger was dropped or disabled, a trigger
// no longer enabled ALWAYS, a disabled event trigger, and a declared table never installed —
// exactly those; and Install refuses a partition declared on its own.
func TestVerify(t *testing.T) {
	h, _ := privateDatabase(t)
	tb, eu, odd, _, usLow, _ := h.partitioned()
	plain := h.table()
	h.exec(fmt.Sprintf(`CREATE TABLE %s (id int PRIMARY KEY)`, plain))
	h.install(capture.Table{Name: tb, Operations: []capture.Operation{capture.Inserted, capture.Deleted}})
	if err := capture.Verify(ctx, h.db, h.schema); err != nil {
		t.Fatalf("Verify after Install: %v", err)
	}
	oddName := tb + ` "odd"; part`
	// (The event trigger gives a partition back a dropped trigger at the next ALTER TABLE of the
	// tree: the trigger is dropped after it is disabled.)
	h.exec(fmt.Sprintf(`ALTER TABLE %s DISABLE TRIGGER outbox_capture_deleted`, odd),
		fmt.Sprintf(`ALTER TABLE %s ENABLE TRIGGER outbox_capture_truncate`, usLow),
		`ALTER EVENT TRIGGER `+capture.PartitionsEventTrigger+` DISABLE`,
		fmt.Sprintf(`DROP TRIGGER outbox_capture_inserted ON %s`, eu))
	q := func(s string) string { return "public." + s }
	wantProblems := []capture.TriggerProblem{
		{Table: q(tb), Relation: q(oddName), Trigger: "outbox_capture_deleted", Problem: "disabled"},
		{Table: q(tb), Relation: q(tb + "_eu"), Trigger: "outbox_capture_inserted", Problem: "missing"},
		{Table: q(tb), Relation: q(tb + "_us_low"), Trigger: "outbox_capture_truncate", Problem: "not enabled ALWAYS (sessions with session_replication_role = replica skip it)"},
		{Table: q(tb), Trigger: capture.PartitionsEventTrigger, Problem: "disabled"},
	}
	err := capture.Verify(ctx, h.db, h.schema)
	var ve *capture.VerifyError
	if !errors.As(err, &ve) || !errors.Is(err, capture.ErrNotCaptured) || !reflect.DeepEqual(ve.Problems, wantProblems) {
		t.Fatalf("Verify: %v\nwant problems %+v", err, wantProblems)
	}
	// Named tables: only those; one never installed is reported.
	err = capture.Verify(ctx, h.db, h.schema, capture.Table{Name: plain})
	if !errors.As(err, &ve) || !reflect.DeepEqual(ve.Problems, []capture.TriggerProblem{{Table: q(plain), Relation: q(plain), Trigger: "outbox_capture_*", Problem: "missing (not installed by this version of Install)"}}) {
		t.Fatalf("Verify of a table never installed: %v", err)
	}
	// Install repairs all of it.
	h.install(capture.Table{Name: tb, Operations: []capture.Operation{capture.Inserted, capture.Deleted}})
	if err := capture.Verify(ctx, h.db, h.schema, capture.Table{Name: tb}); err != nil {
		t.Fatalf("Verify after a second Install: %v", err)
	}
	// A partition is declared through its table.
	err = capture.Install(ctx, h.db, h.schema, capture.Table{Name: eu})
	if !errors.Is(err, capture.ErrPartition) || !errors.Is(err, outbox.ErrConfig) {
		t.Fatalf("Install of partition %s: %v, want ErrPartition", eu, err)
	}
}

// TestPartitionedNeedsEventTrigger: a role that is not a superuser cannot create the event
// trigger: its Install of a partitioned table is refused with ErrEventTrigger (installing
// nothing) until a superuser has run Install once in the database; then the role's Install
// works, and its partitions created later are captured.
func TestPartitionedNeedsEventTrigger(t *testing.T) {
	admin := pgtest.StdDB(t)
	role := fmt.Sprintf("capture_role_%d_%d", os.Getpid(), privateDBs.Add(1))
	if _, err := admin.ExecContext(ctx, `CREATE ROLE `+role+` LOGIN NOSUPERUSER`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = admin.ExecContext(ctx, `DROP ROLE IF EXISTS `+role) }) // after the database is dropped
	h, dsn := privateDatabase(t)
	h.exec(`GRANT CREATE, USAGE ON SCHEMA public TO `+role, `GRANT INSERT, SELECT ON outbox_events TO `+role)
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(role)
	owner, err := sql.Open("pgx", u.String())
	if err != nil {
		t.Fatal(err)
	}
	defer owner.Close()
	tb := h.table()
	for _, q := range []string{
		fmt.Sprintf(`CREATE TABLE %s (id int NOT NULL, region text NOT NULL, note text, PRIMARY KEY (id, region)) PARTITION BY LIST (region)`, tb),
		fmt.Sprintf(`CREATE TABLE %s_eu PARTITION OF %s FOR VALUES IN ('eu')`, tb, tb),
	} {
		if _, err := owner.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	err = capture.Install(ctx, owner, h.schema, capture.Table{Name: tb})
	if !errors.Is(err, capture.ErrEventTrigger) || !errors.Is(err, outbox.ErrConfig) {
		t.Fatalf("Install by a role that is not a superuser: %v, want ErrEventTrigger", err)
	}
	var n int
	if err := h.db.QueryRowContext(ctx, `SELECT count(*) FROM pg_trigger WHERE tgname LIKE 'outbox_capture%'`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d capture triggers after a refused Install (%v), want 0", n, err)
	}
	// A superuser installs once (another table), then the owner's Install works.
	other := h.table()
	h.exec(fmt.Sprintf(`CREATE TABLE %s (id int, k int, PRIMARY KEY (id, k)) PARTITION BY LIST (k)`, other))
	h.install(capture.Table{Name: other})
	if err := capture.Install(ctx, owner, h.schema, capture.Table{Name: tb}); err != nil {
		t.Fatalf("Install by the owner after a superuser's: %v", err)
	}
	if _, err := owner.ExecContext(ctx, fmt.Sprintf(`CREATE TABLE %s_us PARTITION OF %s FOR VALUES IN ('us')`, tb, tb)); err != nil {
		t.Fatal(err)
	}
	since := h.lastSeq()
	if _, err := owner.ExecContext(ctx, fmt.Sprintf(`INSERT INTO %s_us VALUES (1, 'us', 'later')`, tb)); err != nil {
		t.Fatal(err)
	}
	h.check(since, []want{h.ev(tb, "inserted", 1, "us", "later")})
}

// TestPartitionTruncateCapture: with TruncateCapture, a TRUNCATE of a partition writes one
// "truncated" event naming the partition; of the partitioned table, one per partition that
// holds rows (a TRUNCATE of the table truncates each of them).
func TestPartitionTruncateCapture(t *testing.T) {
	h, _ := privateDatabase(t)
	tb, eu, _, _, _, _ := h.partitioned()
	h.install(capture.Table{Name: tb, Truncate: capture.TruncateCapture})
	trunc := func(part string) want {
		return want{topic: tb + ".truncated", env: fmt.Sprintf(`{"table":"public.%s","operation":"truncated","partition":"public.%s"}`, tb, part)}
	}
	h.expect([]want{trunc(tb + "_eu")}, `TRUNCATE `+eu)
	since := h.lastSeq()
	h.exec(`TRUNCATE ` + tb)
	var parts []string
	for _, e := range h.events(since) {
		if e.Topic != tb+".truncated" || e.Key != "" || len(e.Envelope) != 3 || e.Envelope["table"] != "public."+tb || e.Envelope["operation"] != "truncated" {
			t.Fatalf("TRUNCATE of the table: event %+v", e)
		}
		parts = append(parts, e.Envelope["partition"].(string))
	}
	sort.Strings(parts)
	if want := []string{"public." + tb + ` "odd"; part`, "public." + tb + "_eu", "public." + tb + "_us_high", "public." + tb + "_us_low"}; !reflect.DeepEqual(parts, want) {
		t.Fatalf("TRUNCATE of the table: events of partitions %q, want %q", parts, want)
	}
}

// TestPartitionSQLScript: the script of SQL for a partitioned table, run as one multi-statement
// string, installs what Install does: a write naming a partition, and one to a partition
// created later, write their events; Verify passes.
func TestPartitionSQLScript(t *testing.T) {
	h, dsn := privateDatabase(t)
	tb, eu, _, _, _, _ := h.partitioned()
	script, err := capture.SQL(ctx, h.db, h.schema, capture.Table{Name: tb})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for range 2 { // idempotent
		if _, err := conn.Exec(ctx, script); err != nil {
			t.Fatalf("script: %v\n%s", err, script)
		}
	}
	if err := capture.Verify(ctx, h.db, h.schema, capture.Table{Name: tb}); err != nil {
		t.Fatal(err)
	}
	h.expect([]want{h.ev(tb, "inserted", 1, "eu", "s")}, fmt.Sprintf(`INSERT INTO %s VALUES (1, 'eu', 's')`, eu))
	h.exec(fmt.Sprintf(`CREATE TABLE %s_asia PARTITION OF %s FOR VALUES IN ('asia')`, tb, tb))
	h.expect([]want{h.ev(tb, "inserted", 2, "asia", "s")}, fmt.Sprintf(`INSERT INTO %s_asia VALUES (2, 'asia', 's')`, tb))
}

// TestVerifySQLite: Verify on SQLite reports a declared table whose trigger was dropped.
func TestVerifySQLite(t *testing.T) {
	h := sqliteHarness(t, nil)
	tb := h.table()
	h.exec(fmt.Sprintf(`CREATE TABLE %s (id INTEGER PRIMARY KEY, note TEXT)`, tb))
	h.install(capture.Table{Name: tb})
	if err := capture.Verify(ctx, h.db, h.schema, capture.Table{Name: tb}); err != nil {
		t.Fatalf("Verify after Install: %v", err)
	}
	h.exec(fmt.Sprintf(`DROP TRIGGER "outbox_capture_%s_updated"`, tb))
	err := capture.Verify(ctx, h.db, h.schema, capture.Table{Name: tb})
	var ve *capture.VerifyError
	want := []capture.TriggerProblem{{Table: "main." + tb, Relation: "main." + tb, Trigger: "outbox_capture_" + tb + "_updated", Problem: "missing"}}
	if !errors.As(err, &ve) || !reflect.DeepEqual(ve.Problems, want) {
		t.Fatalf("Verify after DROP TRIGGER: %v, want %+v", err, want)
	}
	if err := capture.Verify(ctx, h.db, h.schema, capture.Table{Name: tb, Operations: []capture.Operation{capture.Inserted, capture.Deleted}}); err != nil {
		t.Fatalf("Verify of inserted and deleted only: %v", err)
	}
}

// TestInheritanceRefused: a table with an inheritance child, and the child, are refused
// (ErrInheritance): a write naming the child, or an UPDATE through the parent reaching the
// child's rows, ran only the named table's triggers — changes without events.
func TestInheritanceRefused(t *testing.T) {
	h := pgHarness(t, nil)
	parent, child := h.table(), h.table()
	h.exec(fmt.Sprintf(`CREATE TABLE %s (id int PRIMARY KEY, note text)`, parent), fmt.Sprintf(`CREATE TABLE %s (extra text) INHERITS (%s)`, child, parent))
	for _, tb := range []string{parent, child} {
		if err := capture.Install(ctx, h.db, h.schema, capture.Table{Name: tb}); !errors.Is(err, capture.ErrInheritance) || !errors.Is(err, outbox.ErrConfig) {
			t.Fatalf("Install of %s: %v, want ErrInheritance", tb, err)
		}
	}
}
