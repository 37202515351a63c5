package outbox_test

import (
	"database/sql"
	"fmt"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	wmsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/internal/pgtest"
)

// relaySettings are the settings the relay changes for its own transactions.
const relaySettings = `SELECT current_setting('jit') || ' ' || current_setting('plan_cache_mode') || ' ' || current_setting('synchronous_commit'),
	(SELECT count(*) FROM pg_settings WHERE source = 'session' AND name IN ('jit', 'plan_cache_mode', 'synchronous_commit'))`

// TestRelayLeavesNoSessionSetting runs a relay (asynchronous and synchronous commits) on a
// one-connection pool and on a one-connection database/sql handle, then reads the settings on
// that same connection: they equal a fresh connection's, and none has a session-level value
// (a transaction pooler would hand such a connection to other clients).
func TestRelayLeavesNoSessionSetting(t *testing.T) {
	pgtest.Require(t)
	fresh, err := pgx.Connect(ctx, pgtest.DSN())
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close(ctx)
	var defaults string
	var n int
	if err := fresh.QueryRow(ctx, relaySettings).Scan(&defaults, &n); err != nil {
		t.Fatal(err)
	}
	for _, sync := range []bool{false, true} {
		t.Run(fmt.Sprintf("pool/synccommit=%v", sync), func(t *testing.T) {
			cfg, err := pgxpool.ParseConfig(pgtest.DSN())
			if err != nil {
				t.Fatal(err)
			}
			cfg.MaxConns = 1
			pool, err := pgxpool.NewWithConfig(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			var pid0, pid int
			if err := pool.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid0); err != nil {
				t.Fatal(err)
			}
			defer runRelay(t, pool, sync)() // checked while the relay runs: Close may cut a connection mid-claim
			var got string
			var session int
			if err := pool.QueryRow(ctx, `SELECT pg_backend_pid(), s.* FROM (`+relaySettings+`) s`).Scan(&pid, &got, &session); err != nil {
				t.Fatal(err)
			}
			if pid != pid0 {
				t.Fatalf("the pool's connection changed (backend %d, then %d): nothing checked", pid0, pid)
			}
			if got != defaults || session != 0 {
				t.Fatalf("after the relay the pool's connection has %q (%d set for the session), a fresh one %q", got, session, defaults)
			}
		})
		t.Run(fmt.Sprintf("stdlib/synccommit=%v", sync), func(t *testing.T) {
			db, err := sql.Open("pgx", pgtest.DSN())
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			db.SetMaxOpenConns(1)
			var pid0, pid int
			if err := db.QueryRowContext(ctx, `SELECT pg_backend_pid()`).Scan(&pid0); err != nil {
				t.Fatal(err)
			}
			defer runRelay(t, db, sync)()
			var got string
			var session int
			if err := db.QueryRowContext(ctx, `SELECT pg_backend_pid(), s.* FROM (`+relaySettings+`) s`).Scan(&pid, &got, &session); err != nil {
				t.Fatal(err)
			}
			if pid != pid0 {
				t.Fatalf("the handle's connection changed (backend %d, then %d): nothing checked", pid0, pid)
			}
			if got != defaults || session != 0 {
				t.Fatalf("after the relay the handle's connection has %q (%d set for the session), a fresh one %q", got, session, defaults)
			}
		})
	}
}

// runRelay publishes 20 events on db and waits until they are delivered and marked published
// with a Subscriber (one failure, retried); it returns the Subscriber's Close.
func runRelay(t *testing.T, db any, syncCommit bool) func() error {
	t.Helper()
	schema := outbox.SchemaConfig{Table: pgtest.Table(t)}
	if err := outbox.Migrate(ctx, db, schema); err != nil {
		t.Fatal(err)
	}
	b := &backend{dialect: outbox.DialectPostgreSQL, db: db, raw: pgtest.StdDB(t)}
	b.seed(t, schema, "orders", 20, []string{"a", "b", ""})
	cfg := fastCfg(schema)
	cfg.SyncCommit = syncCommit
	cfg.RetryBase, cfg.RetryMax = 20*time.Millisecond, 20*time.Millisecond
	sub, err := outbox.NewSubscriber(db, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	ch, err := sub.Subscribe(ctx, "orders")
	if err != nil {
		t.Fatal(err)
	}
	var failed atomic.Bool
	go func() {
		for m := range ch {
			if failed.CompareAndSwap(false, true) {
				m.Nack()
				continue
			}
			m.Ack()
		}
	}()
	pgtest.Eventually(t, 30*time.Second, "20 events published", func() bool {
		return b.count(t, fmt.Sprintf(`SELECT count(*) FROM %q WHERE "published_at" IS NOT NULL`, schema.Table)) == 20
	})
	return sub.Close
}

// TestRelaySettingsThroughBeginner: a relay given a watermill-sql Beginner over a pool or over
// a pgx stdlib *sql.DB runs its statements with the relay's settings, as one given the pool or
// the *sql.DB itself (jit off: a claim over stale statistics was otherwise compiled by JIT at
// every claim). The connections' session default is jit = on (options in the DSN); a
// statement trigger on the outbox table records jit and synchronous_commit as every lease and
// mark sees them.
func TestRelaySettingsThroughBeginner(t *testing.T) {
	pgtest.Require(t)
	u, err := url.Parse(pgtest.DSN())
	if err != nil {
		t.Fatal(err)
	}
	qs := u.Query()
	qs.Set("options", "-c jit=on")
	u.RawQuery = strings.ReplaceAll(qs.Encode(), "+", "%20") // the DSN parser reads %20, not +, as a space
	dsn := u.String()
	handles := map[string]func(t *testing.T) any{
		"BeginnerFromPgx": func(t *testing.T) any {
			pool, err := pgxpool.New(ctx, dsn)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(pool.Close)
			return wmsql.BeginnerFromPgx(pool)
		},
		"BeginnerFromStdSQL": func(t *testing.T) any {
			db, err := sql.Open("pgx", dsn)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { db.Close() })
			return wmsql.BeginnerFromStdSQL(db)
		},
	}
	for name, open := range handles {
		t.Run(name, func(t *testing.T) {
			raw := pgtest.StdDB(t)
			schema := outbox.SchemaConfig{Table: pgtest.Table(t)}
			if err := outbox.Migrate(ctx, raw, schema); err != nil {
				t.Fatal(err)
			}
			seen := schema.Table + "_settings"
			for _, st := range []string{
				fmt.Sprintf(`CREATE TABLE %q (jit text, sync text)`, seen),
				fmt.Sprintf(`CREATE FUNCTION %q() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN INSERT INTO %q VALUES (current_setting('jit'), current_setting('synchronous_commit')); RETURN NULL; END $$`, seen, seen),
				fmt.Sprintf(`CREATE TRIGGER %q AFTER UPDATE ON %q FOR EACH STATEMENT EXECUTE FUNCTION %q()`, seen, schema.Table, seen),
			} {
				if _, err := raw.ExecContext(ctx, st); err != nil {
					t.Fatal(err)
				}
			}
			t.Cleanup(func() {
				raw.ExecContext(ctx, fmt.Sprintf(`DROP TABLE IF EXISTS %q; DROP TABLE IF EXISTS %q; DROP FUNCTION IF EXISTS %q()`, schema.Table, seen, seen))
			})
			b := &backend{dialect: outbox.DialectPostgreSQL, db: raw, raw: raw}
			b.seed(t, schema, "orders", 5, []string{"a", ""})
			sub, err := outbox.NewSubscriber(open(t), fastCfg(schema), nil)
			if err != nil {
				t.Fatal(err)
			}
			defer sub.Close()
			(&recorder{}).consume(mustSubscribe(t, sub, "orders"), ack)
			pgtest.Eventually(t, 10*time.Second, "every event published", func() bool {
				return b.count(t, fmt.Sprintf(`SELECT count(*) FROM %q WHERE published_at IS NOT NULL`, schema.Table)) == 5
			})
			sub.Close()
			var statements, off int
			if err := raw.QueryRowContext(ctx, fmt.Sprintf(`SELECT count(*), count(*) FILTER (WHERE jit = 'off' AND sync = 'off') FROM %q`, seen)).Scan(&statements, &off); err != nil {
				t.Fatal(err)
			}
			if statements < 2 || off != statements {
				t.Fatalf("%d of the relay's %d UPDATE statements ran with jit and synchronous_commit off, want all (at least a lease and a mark)", off, statements)
			}
		})
	}
}
