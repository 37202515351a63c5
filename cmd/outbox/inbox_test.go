package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/inbox"
	"github.com/watermill-outbox/outbox/internal/brokertest"
	"github.com/watermill-outbox/outbox/internal/pgtest"
)

// TestInboxCommands: inbox migrate, status and cleanup on PostgreSQL and SQLite, against rows
// that package inbox wrote; on MariaDB/MySQL, which package inbox does not support, each
// subcommand is a usage error saying so.
func TestInboxCommands(t *testing.T) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			db, table := b.fresh(t)
			if b.name == "mariadb" {
				for _, args := range [][]string{
					{"inbox", "migrate", "--db", db, "--table", table},
					{"inbox", "status", "--db", db},
					{"inbox", "cleanup", "--db", db, "--older-than", "1h"},
				} {
					wantFailure(t, cli(t, nil, args...), 2, "outbox inbox supports PostgreSQL and SQLite only", "not MariaDB/MySQL", "postgres://")
				}
				if n := mariadbTableCount(t, table); n != 0 {
					t.Fatalf("inbox migrate created %d tables", n)
				}
				return
			}
			r := cli(t, nil, "inbox", "status", "--db", db, "--table", table)
			if b.name == "postgres" {
				wantFailure(t, r, 1, fmt.Sprintf("inbox table %q not found", table), "outbox inbox migrate")
			} else {
				wantFailure(t, r, 1, "does not exist", "outbox migrate") // no SQLite file yet
			}
			out := mustRun(t, nil, "inbox", "migrate", "--db", db, "--table", table)
			if !strings.Contains(out, fmt.Sprintf("inbox table %q is ready", table)) {
				t.Fatalf("migrate said %q", out)
			}
			mustRun(t, nil, "inbox", "migrate", "--db", db, "--table", table) // idempotent

			// Three messages for "billing", one for "shipping", through package inbox.
			u, err := parseDBURL(db)
			if err != nil {
				t.Fatal(err)
			}
			cfg := inbox.SchemaConfig{Table: table, Dialect: u.Dialect()}
			processors := map[outbox.Dialect]func(consumer string, n int){
				outbox.DialectPostgreSQL: func(consumer string, n int) {
					in, err := inbox.New(inbox.FromPgx(pgtest.Require(t), pgx.TxOptions{}), inbox.Config{Schema: cfg, Consumer: consumer}, nil)
					if err != nil {
						t.Fatal(err)
					}
					for range n {
						if _, err := in.Process(outbox.NewMessage(nil), func(*message.Message, pgx.Tx) ([]*message.Message, error) { return nil, nil }); err != nil {
							t.Fatal(err)
						}
					}
				},
				outbox.DialectSQLite: func(consumer string, n int) {
					sdb, err := sql.Open("sqlite", sqliteDSN(u.File()))
					if err != nil {
						t.Fatal(err)
					}
					defer sdb.Close()
					in, err := inbox.New(inbox.FromSQL(sdb, nil), inbox.Config{Schema: cfg, Consumer: consumer, Outbox: outbox.PublisherConfig{Schema: outbox.SchemaConfig{Dialect: outbox.DialectSQLite}}}, nil)
					if err != nil {
						t.Fatal(err)
					}
					for range n {
						if _, err := in.Process(outbox.NewMessage(nil), func(*message.Message, *sql.Tx) ([]*message.Message, error) { return nil, nil }); err != nil {
							t.Fatal(err)
						}
					}
				},
			}
			process := processors[u.Dialect()]
			process("billing", 3)
			process("shipping", 1)

			var st inboxStatusJSON
			if err := json.Unmarshal([]byte(mustRun(t, nil, "inbox", "status", "--db", db, "--table", table, "--json")), &st); err != nil {
				t.Fatal(err)
			}
			if st.Messages != 4 || len(st.Consumers) != 2 || st.Consumers[0].Consumer != "billing" || st.Consumers[0].Messages != 3 || st.Consumers[1].Messages != 1 {
				t.Fatalf("status: %+v", st)
			}
			if age := time.Since(st.Consumers[0].OldestProcessed); age < 0 || age > time.Minute {
				t.Fatalf("oldest processed %s ago", age)
			}
			text := mustRun(t, nil, "inbox", "status", "--db", db, "--table", table)
			if !strings.Contains(text, "billing") || !strings.Contains(text, "TOTAL") {
				t.Fatalf("status table: %s", text)
			}

			wantFailure(t, cli(t, nil, "inbox", "cleanup", "--db", db, "--table", table), 2, "--older-than is required")
			if out := mustRun(t, nil, "inbox", "cleanup", "--db", db, "--table", table, "--older-than", "1h"); out != "deleted 0 inbox records older than 1h0m0s\n" {
				t.Fatalf("cleanup 1h: %q", out)
			}
			if out := mustRun(t, nil, "inbox", "cleanup", "--db", db, "--table", table, "--older-than", "0s", "--consumer", "shipping"); out != "deleted 1 inbox record of consumer \"shipping\" older than 0s\n" {
				t.Fatalf("cleanup shipping: %q", out)
			}
			if out := mustRun(t, []string{"OUTBOX_OLDER_THAN=0s"}, "inbox", "cleanup", "--db", db, "--table", table); out != "deleted 3 inbox records older than 0s\n" {
				t.Fatalf("cleanup via the environment: %q", out)
			}
		})
	}
}

// TestRelayAsynqKill: 3,000 task events (and 10 events of another topic) relayed by `outbox
// relay --to asynq+redis://…` to an asynq worker on 127.0.0.1. The first relay is killed with
// SIGKILL once 200 tasks are enqueued: with BatchSize 1000 and a batch claimed ahead, a batch
// is then enqueued but not yet marked published (with the whole backlog in one batch, a quiet
// machine enqueued and marked all of it before the test saw 200 tasks); the second relay takes
// it over when its lease expires, enqueues those events again, and asynq answers "task ID
// conflict" (logged at debug level): every task runs exactly once, exactly 3,000 tasks exist,
// the other topic is left alone.
func TestRelayAsynqKill(t *testing.T) {
	const n = 3000
	pool := pgtest.Require(t)
	addr := brokertest.RequireRedis(t)
	db, table := pgtest.DSN(), pgtest.Table(t)
	mustRun(t, nil, "migrate", "--db", db, "--table", table)
	queue := fmt.Sprintf("outbox-cli-%d-%d", os.Getpid(), time.Now().UnixNano())
	redisOpt := asynq.RedisClientOpt{Addr: addr, DB: 9}
	ins := asynq.NewInspector(redisOpt)
	defer ins.Close()
	defer func() { _ = ins.DeleteQueue(queue, true) }()

	var ids []string
	err := pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error {
		pub, err := outbox.NewPublisher(tx, outbox.PublisherConfig{Schema: outbox.SchemaConfig{Table: table}}, nil)
		if err != nil {
			return err
		}
		for i := range n {
			m := outbox.NewMessage([]byte(fmt.Sprintf(`{"job":%d}`, i)))
			ids = append(ids, m.UUID)
			if err := pub.Publish("task.work", m); err != nil {
				return err
			}
		}
		for range 10 {
			if err := pub.Publish("orders.created", outbox.NewMessage([]byte(`{}`))); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	var (
		mu   sync.Mutex
		runs = map[string]int{}
	)
	srv := asynq.NewServer(redisOpt, asynq.Config{Concurrency: 8, Queues: map[string]int{queue: 1}, LogLevel: asynq.ErrorLevel, TaskCheckInterval: 20 * time.Millisecond})
	if err := srv.Start(asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		if task.Type() != "work" || task.Headers()[outbox.MetadataEventID] != id {
			return fmt.Errorf("task %s: type %q, headers %v", id, task.Type(), task.Headers())
		}
		mu.Lock()
		runs[id]++
		mu.Unlock()
		return nil
	})); err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()

	to := fmt.Sprintf("asynq+redis://%s/9?queue=%s", addr, queue)
	args := []string{"relay", "--db", db, "--table", table, "--to", to, "--lease", "3s", "--poll-interval", "50ms", "--batch-size", "1000", "--debug"}
	enqueued := func() int {
		info, err := ins.GetQueueInfo(queue)
		if err != nil {
			return 0
		}
		return info.Pending + info.Active + info.Retry + info.Completed
	}
	first := start(t, nil, args...)
	waitFor(t, 30*time.Second, "the first relay enqueues 200 tasks", func() bool {
		if !first.running() {
			t.Fatalf("relay exited: %s", first.errb.String())
		}
		return enqueued() >= 200
	})
	if err := first.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-first.done
	atKill := topicCounts(status(t, db, table))["task.work"][0]
	if atKill == 0 {
		t.Fatal("every task event was marked before the kill: nothing left to redeliver")
	}

	second := start(t, nil, args...)
	second.runUntil(t, "the second relay delivers the rest", func() bool {
		c := topicCounts(status(t, db, table))
		return c["task.work"] == [2]int64{} && c["orders.created"] == [2]int64{10, 0}
	})
	conflicts := strings.Count(second.errb.String(), "task enqueued already")
	if conflicts == 0 {
		t.Fatalf("the second relay met no task id conflict (pending at the kill: %d): the redelivery was not exercised", atKill)
	}
	waitFor(t, 60*time.Second, "the worker runs every task", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(runs) == n
	})
	var info *asynq.QueueInfo
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		info, err = ins.GetQueueInfo(queue)
		if err == nil && info.Pending+info.Active+info.Scheduled+info.Retry+info.Archived == 0 && info.Completed == n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("queue after the drain: %+v, %v; want %d completed and nothing else", info, err, n)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for _, id := range ids {
		if runs[id] != 1 {
			t.Fatalf("task %s ran %d times, want 1", id, runs[id])
		}
	}
	t.Logf("pending at the kill: %d; task id conflicts met by the second relay: %d", atKill, conflicts)
}

// TestParseAsynqURL: the asynq --to forms and the refused ones (no Redis involved).
func TestParseAsynqURL(t *testing.T) {
	d, err := parseDestURL("asynq+redis://:secret@127.0.0.1:6380/3?queue=emails&retention=2h&max-retry=4&dial_timeout=2s")
	if err != nil {
		t.Fatal(err)
	}
	opt, ok := d.asynq.Redis.(asynq.RedisClientOpt)
	if d.kind != destAsynq || !ok || opt.Addr != "127.0.0.1:6380" || opt.DB != 3 || opt.Password != "secret" || opt.DialTimeout != 2*time.Second ||
		d.asynq.Queue != "emails" || d.asynq.Retention != 2*time.Hour || d.asynq.MaxRetry != 4 || strings.Contains(d.shown, "secret") {
		t.Fatalf("parsed %+v, %+v (shown %q)", d, d.asynq, d.shown)
	}
	d, err = parseDestURL("asynq+redis://127.0.0.1:6379?max-retry=0")
	if err != nil || d.asynq.Queue != "" || len(d.asynq.Options) != 1 {
		t.Fatalf("max-retry=0: %+v, %v", d.asynq, err)
	}
	for _, bad := range []string{"asynq+redis://h:1?retention=soon", "asynq+redis://h:1?max-retry=x", "asynq+redis://h:1?max-retry=-2",
		"asynq+redis://h:1?retention=-1h", "asynq+redis://h:1?bogus=1", "asynq+redis://h:1/notadb"} {
		var ue *usageError
		if _, err := parseDestURL(bad); !errors.As(err, &ue) {
			t.Errorf("%s: %v, want a usage error", bad, err)
		}
	}
}
