package pgnotify_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/internal/pgtest"
	"github.com/watermill-outbox/outbox/internal/privatepgbouncer"
	"github.com/watermill-outbox/outbox/wakeup"
	"github.com/watermill-outbox/outbox/wakeup/internal/wakeuptest"
	"github.com/watermill-outbox/outbox/wakeup/pgnotify"
)

func connConfig(t testing.TB) *pgx.ConnConfig {
	t.Helper()
	pgtest.Require(t)
	cc, err := pgx.ParseConfig(pgtest.DSN())
	if err != nil {
		t.Fatal(err)
	}
	return cc
}

func newCase(mode pgnotify.Mode) wakeuptest.Case {
	return wakeuptest.Case{
		New: func(t *testing.T) wakeup.Wakeup {
			name := wakeuptest.UniqueName(t, "wk")
			w, err := pgnotify.New(context.Background(), connConfig(t), pgnotify.Config{
				Channel:                 name,
				Mode:                    mode,
				ListenerApplicationName: name,
				Reconnect:               wakeup.Reconnect{InitialBackoff: wakeuptest.ReconnectBackoff},
			}, nil)
			if err != nil {
				t.Fatal(err)
			}
			return w
		},
		KillLosesSignals: true,
		Kill: func(t *testing.T, w wakeup.Wakeup) {
			// The listener's application_name is the channel name in this suite.
			name := w.(*pgnotify.Wakeup).Channel()
			pool := pgtest.Require(t)
			ctx := context.Background()
			var pids []int32
			err := pool.QueryRow(ctx, `SELECT array_agg(pid) FROM pg_stat_activity WHERE application_name = $1`, name).Scan(&pids)
			if err != nil || len(pids) != 1 {
				t.Fatalf("listener backends %v (%v), want 1", pids, err)
			}
			var ok bool
			if err := pool.QueryRow(ctx, `SELECT pg_terminate_backend($1)`, pids[0]).Scan(&ok); err != nil || !ok {
				t.Fatalf("pg_terminate_backend(%d) = %v, %v", pids[0], ok, err)
			}
			pgtest.Eventually(t, 5*time.Second, "listener backend gone", func() bool {
				var n int
				_ = pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, pids[0]).Scan(&n)
				return n == 0
			})
		},
	}
}

func TestAfterCommit(t *testing.T) { wakeuptest.Run(t, newCase(pgnotify.AfterCommit)) }

func TestInTransaction(t *testing.T) { wakeuptest.Run(t, newCase(pgnotify.InTransaction)) }

func TestPublisherConfig(t *testing.T) {
	cc := connConfig(t)
	for _, tc := range []struct {
		mode pgnotify.Mode
		want string
	}{{pgnotify.AfterCommit, ""}, {pgnotify.InTransaction, "chan_x"}} {
		w, err := pgnotify.New(context.Background(), cc, pgnotify.Config{Channel: "chan_x", Mode: tc.mode}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := w.PublisherConfig(outbox.PublisherConfig{}).NotifyChannel; got != tc.want {
			t.Errorf("%s: NotifyChannel = %q, want %q", tc.mode, got, tc.want)
		}
		_ = w.Close()
	}
	if got := pgnotify.InTransactionConfig(outbox.PublisherConfig{}, "").NotifyChannel; got != pgnotify.DefaultChannel {
		t.Errorf("InTransactionConfig default channel = %q", got)
	}
}

func TestConfigValidate(t *testing.T) {
	long := string(make([]byte, 64))
	for _, tc := range []struct {
		name  string
		cfg   pgnotify.Config
		field string
	}{
		{"zero", pgnotify.Config{}, ""},
		{"long channel", pgnotify.Config{Channel: "c" + long[1:]}, "pgnotify.Config.Channel"},
		{"nul channel", pgnotify.Config{Channel: "a\x00b"}, "pgnotify.Config.Channel"},
		{"mode", pgnotify.Config{Mode: 7}, "pgnotify.Config.Mode"},
		{"window", pgnotify.Config{Window: -1}, "pgnotify.Config.Window"},
		{"ping", pgnotify.Config{PingInterval: -1}, "pgnotify.Config.PingInterval"},
		{"probe", pgnotify.Config{ProbeTimeout: -1}, "pgnotify.Config.ProbeTimeout"},
		{"backoff", pgnotify.Config{Reconnect: wakeup.Reconnect{InitialBackoff: -1}}, "pgnotify.Config.Reconnect.InitialBackoff"},
		{"max below initial", pgnotify.Config{Reconnect: wakeup.Reconnect{InitialBackoff: time.Second, MaxBackoff: time.Millisecond}}, "pgnotify.Config.Reconnect.MaxBackoff"},
	} {
		err := tc.cfg.Validate()
		var ce *outbox.ConfigError
		switch {
		case tc.field == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.field != "" && (!errors.As(err, &ce) || ce.Field != tc.field || !errors.Is(err, outbox.ErrConfig)):
			t.Errorf("%s: err = %v, want ConfigError on %s", tc.name, err, tc.field)
		}
	}
	if _, err := pgnotify.New(context.Background(), nil, pgnotify.Config{}, nil); !errors.Is(err, outbox.ErrConfig) {
		t.Errorf("New(nil conn config) = %v", err)
	}
}

// TestUnsupportedServer runs New against a database that refuses pg_notify to its user, as
// a server without NOTIFY does (a hot standby refuses with SQLSTATE 25006, which New classifies
// the same way; PostgreSQL allows NOTIFY in read-only transactions, so a revoke stands in).
// The revoke is made in a database of its own: function privileges are per database, so the
// shared test database is untouched.
func TestUnsupportedServer(t *testing.T) {
	pool := pgtest.Require(t)
	ctx := context.Background()
	name := wakeuptest.UniqueName(t, "nonotify")
	ident := pgx.Identifier{name}.Sanitize()
	for _, q := range []string{`CREATE ROLE ` + ident + ` LOGIN`, `CREATE DATABASE ` + ident} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		_, _ = pool.Exec(ctx, `DROP DATABASE IF EXISTS `+ident+` WITH (FORCE)`)
		_, _ = pool.Exec(ctx, `DROP ROLE IF EXISTS `+ident)
	})
	admin := connConfig(t)
	admin.Database = name
	conn, err := pgx.ConnectConfig(ctx, admin)
	if err != nil {
		t.Fatal(err)
	}
	_, err = conn.Exec(ctx, `REVOKE EXECUTE ON FUNCTION pg_notify(text, text) FROM PUBLIC`)
	_ = conn.Close(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cc := connConfig(t)
	cc.Database, cc.User = name, name
	_, err = pgnotify.New(ctx, cc, pgnotify.Config{Channel: name}, nil)
	var pgErr *pgconn.PgError
	if !errors.Is(err, pgnotify.ErrNotifyUnsupported) || !errors.Is(err, outbox.ErrConfig) || !errors.As(err, &pgErr) || pgErr.Code != "42501" {
		t.Fatalf("New on a server refusing pg_notify = %v, want a ConfigError wrapping ErrNotifyUnsupported and the server error", err)
	}
}

// TestSelfProbeBehindTransactionPooler runs New with a connection config through PgBouncer in
// transaction mode, where LISTEN does not keep its session: New fails with ErrProbeFailed and
// a message naming the fix, and succeeds with the direct DSN.
func TestSelfProbeBehindTransactionPooler(t *testing.T) {
	pgtest.Require(t)
	b := privatepgbouncer.Start(t, pgtest.DSN())
	for _, mode := range []pgnotify.Mode{pgnotify.AfterCommit, pgnotify.InTransaction} {
		cc, err := pgx.ParseConfig(b.DSN(""))
		if err != nil {
			t.Fatal(err)
		}
		name := wakeuptest.UniqueName(t, "probe")
		start := time.Now()
		w, err := pgnotify.New(context.Background(), cc, pgnotify.Config{Channel: name, Mode: mode, ProbeTimeout: 300 * time.Millisecond}, nil)
		if err == nil {
			w.Close()
			t.Fatalf("%s: New through PgBouncer (transaction mode) succeeded", mode)
		}
		if !errors.Is(err, pgnotify.ErrProbeFailed) || !errors.Is(err, outbox.ErrConfig) ||
			!strings.Contains(err.Error(), "transaction-mode pooler") || !strings.Contains(err.Error(), "separate DSN that connects directly to PostgreSQL") {
			t.Fatalf("%s: New through PgBouncer = %v, want a ConfigError wrapping ErrProbeFailed naming the fix", mode, err)
		}
		if took := time.Since(start); took > 5*time.Second {
			t.Fatalf("%s: New took %s to fail, want about ProbeTimeout", mode, took)
		}
		w, err = pgnotify.New(context.Background(), connConfig(t), pgnotify.Config{Channel: name, Mode: mode, ProbeTimeout: 5 * time.Second}, nil)
		if err != nil {
			t.Fatalf("%s: New with the direct DSN: %v", mode, err)
		}
		w.Close()
	}
}

// TestWakeupWithPoolThroughPgBouncer is the documented set-up: the pool, the writer and the
// relay go through PgBouncer in transaction mode (exec mode), the Wakeup has the direct DSN.
// With a one-minute poll interval, an event written after the relay went idle is delivered
// within seconds: the notification woke it.
func TestWakeupWithPoolThroughPgBouncer(t *testing.T) {
	pgtest.Require(t)
	ctx := context.Background()
	b := privatepgbouncer.Start(t, pgtest.DSN())
	pool, err := pgxpool.New(ctx, b.DSN("default_query_exec_mode=exec"))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	for _, mode := range []pgnotify.Mode{pgnotify.AfterCommit, pgnotify.InTransaction} {
		t.Run(mode.String(), func(t *testing.T) {
			w, err := pgnotify.New(ctx, connConfig(t), pgnotify.Config{Channel: wakeuptest.UniqueName(t, "bouncer"), Mode: mode}, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer w.Close()
			schema := outbox.SchemaConfig{Table: pgtest.Table(t)}
			if err := outbox.Migrate(ctx, pool, schema); err != nil {
				t.Fatal(err)
			}
			sub, err := outbox.NewSubscriber(pool, outbox.SubscriberConfig{Schema: schema, PollInterval: time.Minute, Wakeup: w, DisableWakeProbe: true}, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer sub.Close()
			ch, err := sub.Subscribe(ctx, "orders")
			if err != nil {
				t.Fatal(err)
			}
			write := func(body string) string {
				var id string
				err := wakeup.RunInTx(ctx, pool, w, outbox.PublisherConfig{Schema: schema}, func(_ pgx.Tx, pub *outbox.Publisher) error {
					m := outbox.NewMessage([]byte(body))
					id = m.UUID
					return pub.Publish("orders", m)
				})
				if err != nil {
					t.Fatal(err)
				}
				return id
			}
			receive := func(id string, within time.Duration) {
				select {
				case m := <-ch:
					if m.UUID != id {
						t.Fatalf("received %s, want %s", m.UUID, id)
					}
					m.Ack()
				case <-time.After(within):
					t.Fatalf("event %s not delivered within %s", id, within)
				}
			}
			receive(write(`1`), 10*time.Second)
			pgtest.Eventually(t, 10*time.Second, "first event marked published", func() bool {
				var n int
				_ = pool.QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{schema.Table}.Sanitize()+` WHERE "published_at" IS NOT NULL`).Scan(&n)
				return n == 1
			})
			start := time.Now()
			receive(write(`2`), 10*time.Second)
			t.Logf("woken after %s (poll interval 1 minute)", time.Since(start))
		})
	}
}
