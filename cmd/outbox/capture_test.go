package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"reflect"
	"strings"
	"testing"

	"github.com/watermill-outbox/outbox/internal/pgtest"
)

// TestCaptureSQLViaPsql: the script of "outbox capture sql", applied by plain psql, behaves
// like "outbox capture install": two identical tables, one installed each way, get the same
// events for the same writes (and the same generated function), TRUNCATE is refused on both,
// and uninstall stops both.
func TestCaptureSQLViaPsql(t *testing.T) {
	pool := pgtest.Require(t)
	psql, err := exec.LookPath("psql")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("psql not found and CI=true")
		}
		t.Skip("psql not found")
	}
	ctx := context.Background()
	dsn := pgtest.DSN()
	ob, viaInstall, viaSQL := pgtest.Table(t), pgtest.Table(t), pgtest.Table(t)
	if r := cli(t, nil, "migrate", "--db", dsn, "--table", ob); r.code != 0 {
		t.Fatalf("migrate: %+v", r)
	}
	for _, tb := range []string{viaInstall, viaSQL} {
		if _, err := pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE %s (id int PRIMARY KEY, status text, secret text)`, tb)); err != nil {
			t.Fatal(err)
		}
	}
	decl := []string{"--db", dsn, "--outbox-table", ob, "--exclude", "secret", "--payload", "before-and-after", "--ordering-key", "acct/{pk}"}
	if r := cli(t, nil, append([]string{"capture", "install", "--table", viaInstall}, decl...)...); r.code != 0 || !strings.Contains(r.stdout, "capture triggers installed") {
		t.Fatalf("capture install: %+v", r)
	}
	r := cli(t, nil, append([]string{"capture", "sql", "--table", viaSQL}, decl...)...)
	if r.code != 0 || !strings.HasPrefix(r.stdout, "BEGIN;\nSELECT pg_advisory_xact_lock(") || !strings.HasSuffix(r.stdout, "COMMIT;\n") {
		t.Fatalf("capture sql: %+v", r)
	}
	for range 2 { // the script is idempotent
		cmd := exec.Command(psql, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", dsn, "-f", "-")
		cmd.Stdin = strings.NewReader(r.stdout)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("psql: %v: %s", err, out)
		}
	}
	src := func(tb string) string {
		var s string
		if err := pool.QueryRow(ctx, `SELECT prosrc FROM pg_proc WHERE proname = $1`, tb+"_outbox_capture").Scan(&s); err != nil {
			t.Fatal(err)
		}
		return strings.ReplaceAll(s, tb, "T")
	}
	if a, b := src(viaInstall), src(viaSQL); a != b {
		t.Fatalf("generated functions differ:\n%s\n---\n%s", a, b)
	}

	writes := []string{`INSERT INTO %s VALUES (1, 'new', 's'), (2, 'new', 's')`, `UPDATE %s SET status = 'open' WHERE id = 1`,
		`UPDATE %s SET secret = 'only-secret' WHERE id = 1`, `UPDATE %s SET id = 3 WHERE id = 2`, `DELETE FROM %s WHERE id = 1`}
	events := func(tb string) []string {
		for _, w := range writes {
			if _, err := pool.Exec(ctx, fmt.Sprintf(w, tb)); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := pool.Exec(ctx, fmt.Sprintf(`TRUNCATE %s`, tb)); err == nil || !strings.Contains(err.Error(), "TRUNCATE") {
			t.Fatalf("TRUNCATE %s: %v, want refused", tb, err)
		}
		rows, err := pool.Query(ctx, fmt.Sprintf(`SELECT topic, ordering_key, payload::jsonb - 'occurred_at', headers FROM %q WHERE topic LIKE $1 ORDER BY sequence`, ob), tb+".%")
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var out []string
		for rows.Next() {
			var topic, key string
			var payload, headers map[string]any
			if err := rows.Scan(&topic, &key, &payload, &headers); err != nil {
				t.Fatal(err)
			}
			b, _ := json.Marshal([]any{topic, key, payload, headers})
			out = append(out, strings.ReplaceAll(string(b), tb, "T"))
		}
		if rows.Err() != nil {
			t.Fatal(rows.Err())
		}
		return out
	}
	a, b := events(viaInstall), events(viaSQL)
	if len(a) != 5 || !reflect.DeepEqual(a, b) {
		t.Fatalf("events differ or not 5:\ninstall: %v\nsql:     %v", a, b)
	}
	want := `["T.updated","acct/1",{"after":{"id":1,"status":"open"},"before":{"id":1,"status":"new"},"changed":["status"],"operation":"updated","pk":1,"table":"public.T"},{}]`
	if a[2] != want {
		t.Fatalf("event 2:\n got %s\nwant %s", a[2], want)
	}

	for _, tb := range []string{viaInstall, viaSQL} {
		if r := cli(t, nil, "capture", "uninstall", "--db", dsn, "--outbox-table", ob, "--table", tb); r.code != 0 {
			t.Fatalf("uninstall: %+v", r)
		}
		if _, err := pool.Exec(ctx, fmt.Sprintf(`TRUNCATE %s`, tb)); err != nil {
			t.Fatalf("TRUNCATE after uninstall: %v", err)
		}
	}
	// A refused declaration: exit status 1, one line naming the column.
	if r := cli(t, nil, "capture", "install", "--db", dsn, "--outbox-table", ob, "--table", viaSQL, "--fields", "nope"); r.code != 1 || !strings.Contains(r.stderr, `no column "nope"`) {
		t.Fatalf("bad field: %+v", r)
	}
	if r := cli(t, nil, "capture", "install", "--db", dsn, "--outbox-table", ob); r.code != 2 {
		t.Fatalf("no --table: %+v", r)
	}
}

// TestCaptureVerifyCLI: "outbox capture verify" passes after install, and after a capture
// trigger is dropped exits 1 naming it; --skip-replica-sessions installs triggers that replica
// sessions skip (enabled ORIGIN), the default ALWAYS.
func TestCaptureVerifyCLI(t *testing.T) {
	pool := pgtest.Require(t)
	ctx := context.Background()
	dsn := pgtest.DSN()
	ob, tb := pgtest.Table(t), pgtest.Table(t)
	if r := cli(t, nil, "migrate", "--db", dsn, "--table", ob); r.code != 0 {
		t.Fatalf("migrate: %+v", r)
	}
	if _, err := pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE %s (id int PRIMARY KEY, status text)`, tb)); err != nil {
		t.Fatal(err)
	}
	enabled := func() string {
		var s string
		if err := pool.QueryRow(ctx, `SELECT string_agg(tgname || '=' || tgenabled::text, ',' ORDER BY tgname) FROM pg_trigger WHERE tgrelid = $1::regclass`, tb).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	db := []string{"--db", dsn, "--outbox-table", ob}
	if r := cli(t, nil, append([]string{"capture", "install", "--table", tb}, db...)...); r.code != 0 {
		t.Fatalf("capture install: %+v", r)
	}
	if got, want := enabled(), "outbox_capture_deleted=A,outbox_capture_inserted=A,outbox_capture_truncate=A,outbox_capture_updated=A"; got != want {
		t.Fatalf("triggers %s, want %s", got, want)
	}
	if r := cli(t, nil, append([]string{"capture", "verify"}, db...)...); r.code != 0 || !strings.Contains(r.stdout, "capture triggers verified on every captured table") {
		t.Fatalf("capture verify: %+v", r)
	}
	if _, err := pool.Exec(ctx, fmt.Sprintf(`DROP TRIGGER outbox_capture_updated ON %s`, tb)); err != nil {
		t.Fatal(err)
	}
	r := cli(t, nil, append([]string{"capture", "verify", "--table", tb}, db...)...)
	if r.code != 1 || r.stdout != fmt.Sprintf("public.%s: trigger outbox_capture_updated missing\n", tb) || !strings.Contains(r.stderr, "1 capture trigger(s) missing or not enabled") {
		t.Fatalf("capture verify after DROP TRIGGER: %+v", r)
	}
	if r := cli(t, nil, append([]string{"capture", "install", "--table", tb, "--skip-replica-sessions"}, db...)...); r.code != 0 {
		t.Fatalf("capture install --skip-replica-sessions: %+v", r)
	}
	if got, want := enabled(), "outbox_capture_deleted=O,outbox_capture_inserted=O,outbox_capture_truncate=O,outbox_capture_updated=O"; got != want {
		t.Fatalf("triggers %s, want %s", got, want)
	}
	if r := cli(t, nil, append([]string{"capture", "verify", "--table", tb}, db...)...); r.code != 0 {
		t.Fatalf("capture verify after --skip-replica-sessions: %+v", r)
	}
}
