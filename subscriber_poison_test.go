package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	_ "github.com/go-sql-driver/mysql" // registers the "mysql" database/sql driver
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/internal/mariadbtest"
	"github.com/watermill-outbox/outbox/internal/pgtest"
)

// The environment of a relay process of TestCrashLoopDeadLettersOnlyPoison (see TestMain and
// crashChild): crashChildEnv names its backend ("postgresql", "sqlite", "mariadb").
const (
	crashChildEnv  = "OUTBOX_CRASH_CHILD"
	crashTableEnv  = "OUTBOX_CRASH_TABLE"  // the outbox table
	crashSQLiteEnv = "OUTBOX_CRASH_SQLITE" // the SQLite database file
	crashPoisonEnv = "OUTBOX_CRASH_POISON" // the payload of the event that kills the process
)

// TestMain runs the tests, or, in a child process of TestCrashLoopDeadLettersOnlyPoison
// (crashChildEnv set), one relay process and nothing else.
func TestMain(m *testing.M) {
	if os.Getenv(crashChildEnv) != "" {
		os.Exit(crashChild())
	}
	os.Exit(m.Run())
}

// crashChild is one relay process of TestCrashLoopDeadLettersOnlyPoison: a Subscriber (RelayName
// "crash-relay", BatchSize 100, Concurrency 10, MaxDeliveryStarts 3) whose handler acks every
// event but the poison one, on which it kills the process (exit status 3) as a crashing handler
// would. It returns 0 once an event is dead-lettered and every event left pending is held
// behind a dead letter of its key, 4 if that takes more than 2 minutes, 5 on a setup error.
func crashChild() int {
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "crash child:", err)
		return 5
	}
	table := os.Getenv(crashTableEnv)
	schema := outbox.SchemaConfig{Table: table}
	var (
		db  any
		raw *sql.DB
		err error
	)
	switch os.Getenv(crashChildEnv) {
	case "postgresql":
		var pool *pgxpool.Pool
		if pool, err = pgxpool.New(ctx, pgtest.DSN()); err != nil {
			return fail(err)
		}
		defer pool.Close()
		db = pool
		raw, err = sql.Open("pgx", pgtest.DSN())
	case "sqlite":
		schema.Dialect = outbox.DialectSQLite
		raw, err = sql.Open("sqlite", outbox.SQLiteDSN(os.Getenv(crashSQLiteEnv)))
		db = raw
	case "mariadb":
		schema.Dialect = outbox.DialectMySQL
		dsn, sep := mariadbtest.DSN(), "?"
		if strings.Contains(dsn, "?") {
			sep = "&"
		}
		raw, err = sql.Open("mysql", dsn+sep+"interpolateParams=true")
		db = raw
	default:
		return fail(fmt.Errorf("unknown backend %q", os.Getenv(crashChildEnv)))
	}
	if err != nil {
		return fail(err)
	}
	defer raw.Close()
	poison := os.Getenv(crashPoisonEnv)
	cfg := outbox.SubscriberConfig{Schema: schema, RelayName: "crash-relay", BatchSize: 100, Concurrency: 10, MaxDeliveryStarts: 3,
		PollInterval: 20 * time.Millisecond, LeaseDuration: 3 * time.Second, DeliveryTimeout: 2 * time.Second}
	log := &isolationLog{LoggerAdapter: watermill.NewStdLogger(false, false), state: &isolationState{}}
	sub, err := outbox.NewSubscriber(db, cfg, log)
	if err != nil {
		return fail(err)
	}
	ch, err := sub.Subscribe(ctx, "t")
	if err != nil {
		return fail(err)
	}
	go func() {
		for m := range ch {
			if string(m.Payload) == poison {
				os.Exit(3) // the handler crashes the process, every time
			}
			m.Ack()
		}
	}()
	// Table names are lower-case letters, digits and underscores: no quoting in any dialect.
	q := fmt.Sprintf(`SELECT (SELECT count(*) FROM %[1]s WHERE dead_lettered_at IS NOT NULL),
	(SELECT count(*) FROM %[1]s o WHERE published_at IS NULL AND dead_lettered_at IS NULL AND (ordering_key IS NULL OR NOT EXISTS
		(SELECT 1 FROM %[1]s d WHERE d.ordering_key = o.ordering_key AND d.dead_lettered_at IS NOT NULL)))`, table)
	for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		var dead, free int
		if err := raw.QueryRowContext(ctx, q).Scan(&dead, &free); err != nil {
			return fail(err)
		}
		// Done, and the isolation this process began (if any) has ended: the end is logged at
		// the claim after the last suspect's mark.
		if dead > 0 && free == 0 && log.state.began.Load() == log.state.ended.Load() {
			sub.Close()
			return 0
		}
	}
	return 4
}

// isolationLog passes every line on and counts the subscriber's lines that begin and end
// isolating suspects.
type isolationLog struct {
	watermill.LoggerAdapter
	state *isolationState
}

type isolationState struct{ began, ended atomic.Int64 }

func (l *isolationLog) Info(msg string, fields watermill.LogFields) {
	switch {
	case strings.HasPrefix(msg, "outbox: isolating suspect events"):
		l.state.began.Add(1)
	case strings.HasPrefix(msg, "outbox: suspect events isolated"):
		l.state.ended.Add(1)
	}
	l.LoggerAdapter.Info(msg, fields)
}

func (l *isolationLog) With(fields watermill.LogFields) watermill.LoggerAdapter {
	return &isolationLog{LoggerAdapter: l.LoggerAdapter.With(fields), state: l.state}
}

// TestCrashLoopDeadLettersOnlyPoison: a handler that kills the relay process whenever it gets
// event P (the test runs each relay as a process of its own, restarted after each death) has P
// dead-lettered as a poison event after MaxDeliveryStarts (3) deaths, and only P: every event
// claimed with it — in its batch, in the batch claimed ahead — is published, no attempt
// counted; the events of P's key after P are held behind the dead letter. Without suspect
// isolation the events that were out with P at each death were dead-lettered with it.
func TestCrashLoopDeadLettersOnlyPoison(t *testing.T) {
	backends := []struct {
		name string
		open func(t *testing.T) (*backend, string) // the backend and its SQLite file ("" if none)
	}{
		{"postgresql", func(t *testing.T) (*backend, string) { return pgBackend(t), "" }},
		{"sqlite", func(t *testing.T) (*backend, string) {
			path := filepath.Join(t.TempDir(), "outbox.db")
			return sqliteBackendAt(t, path), path
		}},
		{"mariadb", func(t *testing.T) (*backend, string) { return mariaDBBackend(t), "" }},
	}
	for _, bk := range backends {
		t.Run(bk.name, func(t *testing.T) {
			b, path := bk.open(t)
			schema := b.table(t)
			// 200 events: every third unordered, the others over 7 keys; P is event 100 (key k2).
			keys := make([]string, 200)
			for i := range keys {
				if i%3 != 0 {
					keys[i] = fmt.Sprintf("k%d", i%7)
				}
			}
			const p = 100
			held := 0
			for i := p + 1; i < len(keys); i++ {
				if keys[i] == keys[p] {
					held++
				}
			}
			b.publishKeys(t, schema, "t", 0, keys)
			env := append(os.Environ(), crashChildEnv+"="+bk.name, crashTableEnv+"="+schema.Table, crashSQLiteEnv+"="+path,
				crashPoisonEnv+"="+fmt.Sprintf(`{"i":%d}`, p))
			deadline := time.Now().Add(4 * time.Minute)
			var logs strings.Builder
			crashes := 0
			for life := 1; ; life++ {
				cctx, cancel := context.WithDeadline(ctx, deadline)
				cmd := exec.CommandContext(cctx, os.Args[0], "-test.run=^$")
				cmd.Env = env
				out, err := cmd.CombinedOutput()
				killed := cctx.Err() != nil // the deadline passed
				cancel()
				fmt.Fprintf(&logs, "--- relay process %d\n%s", life, out)
				var ee *exec.ExitError
				if err == nil {
					break
				}
				if !errors.As(err, &ee) || ee.ExitCode() != 3 || killed {
					t.Fatalf("relay process %d: %v\n%s", life, err, logs.String())
				}
				if crashes++; crashes > 10 {
					t.Fatalf("the relay died %d times and P is still not dead-lettered\n%s", crashes, logs.String())
				}
			}
			if crashes != 3 {
				t.Errorf("the relay died %d times, want 3 (MaxDeliveryStarts: P's fourth claim dead-letters it)", crashes)
			}
			tbl := schema.Table
			pSeq := fmt.Sprintf(`(SELECT min(sequence) FROM %q) + %d`, tbl, p)
			if n := b.count(t, fmt.Sprintf(`SELECT count(*) FROM %q WHERE dead_lettered_at IS NOT NULL`, tbl)); n != 1 {
				t.Errorf("%d events dead-lettered, want 1 (P)", n)
			}
			var lastErr string
			if err := b.raw.QueryRowContext(ctx, fmt.Sprintf(`SELECT last_error FROM %q WHERE sequence = %s AND dead_lettered_at IS NOT NULL`, tbl, pSeq)).Scan(&lastErr); err != nil {
				t.Errorf("P not dead-lettered: %v", err)
			} else if !strings.HasPrefix(lastErr, outbox.ErrPoisonEvent.Error()) {
				t.Errorf("P's last_error %q, want ErrPoisonEvent's text first", lastErr)
			}
			want := len(keys) - 1 - held
			if n := b.count(t, fmt.Sprintf(`SELECT count(*) FROM %q WHERE published_at IS NOT NULL AND dead_lettered_at IS NULL AND attempts = 0`, tbl)); n != want {
				t.Errorf("%d events published (no attempt counted), want %d: every event but P and the %d held behind it", n, want, held)
			}
			if n := b.count(t, fmt.Sprintf(`SELECT count(*) FROM %q WHERE published_at IS NULL AND dead_lettered_at IS NULL AND attempts = 0 AND ordering_key = 'k%d' AND sequence > %s`, tbl, p%7, pSeq)); n != held {
				t.Errorf("%d events of P's key after P held (pending), want %d", n, held)
			}
			out := logs.String()
			if n := strings.Count(out, "outbox: isolating suspect events"); n < 2 {
				t.Errorf("%d relay processes logged isolating suspects, want at least 2 (those after the first two deaths)", n)
			}
			if !strings.Contains(out, "outbox: suspect events isolated; whole batches resume") {
				t.Error("no relay process logged the end of the isolation")
			}
			if t.Failed() {
				t.Log(out)
			}
		})
	}
}
