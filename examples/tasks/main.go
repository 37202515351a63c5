// Command tasks turns outbox events into jobs: each of 100 transactions inserts a user row and
// a "task.email:welcome" event together, the relay enqueues every event as an asynq task (task
// id = event id), and an asynq worker runs the tasks. Redis comes from
// OUTBOX_EXAMPLE_REDIS_ADDR (default 127.0.0.1:6379, database 9), PostgreSQL from
// OUTBOX_EXAMPLE_POSTGRES_DSN.
//
//	go run ./examples/tasks
//
// It prints one line, "tasks=100 ran=100 twice=0", and exits non-zero when the numbers differ
// or it does not finish within 25 seconds.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/examples/internal/demo"
	outboxasynq "github.com/watermill-outbox/outbox/forwarder/asynq"
)

const users = 100

func main() { demo.Main(run) }

func run(ctx context.Context) (string, bool, error) {
	redisOpt := asynq.RedisClientOpt{Addr: demo.Env("OUTBOX_EXAMPLE_REDIS_ADDR", "127.0.0.1:6379"), DB: 9}
	queue := fmt.Sprintf("outbox-example-tasks-%d", os.Getpid())
	r, err := demo.Setup(ctx, "tasks")
	if err != nil {
		return "", false, err
	}
	defer r.Close()
	usersTable := "example_tasks_users_" + fmt.Sprint(os.Getpid())
	if _, err := r.Pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE %q (id int PRIMARY KEY, email text NOT NULL)`, usersTable)); err != nil {
		return "", false, err
	}
	defer r.Pool.Exec(context.Background(), fmt.Sprintf(`DROP TABLE %q`, usersTable))
	ins := asynq.NewInspector(redisOpt)
	defer ins.Close()
	defer ins.DeleteQueue(queue, true)

	// The worker: an ordinary asynq server; it counts how often each task id runs.
	var (
		mu   sync.Mutex
		runs = map[string]int{}
	)
	mux := asynq.NewServeMux()
	mux.HandleFunc("email:welcome", func(ctx context.Context, t *asynq.Task) error {
		var p struct {
			Email string `json:"email"`
		}
		if err := json.Unmarshal(t.Payload(), &p); err != nil || p.Email == "" {
			return fmt.Errorf("bad payload %q: %v", t.Payload(), err)
		}
		id, _ := asynq.GetTaskID(ctx)
		mu.Lock()
		runs[id]++
		mu.Unlock()
		return nil
	})
	srv := asynq.NewServer(redisOpt, asynq.Config{Concurrency: 4, Queues: map[string]int{queue: 1}, LogLevel: asynq.WarnLevel, TaskCheckInterval: 50 * time.Millisecond})
	if err := srv.Start(mux); err != nil {
		return "", false, err
	}
	defer srv.Shutdown()

	// The relay: outbox → asynq tasks.
	pub, err := outboxasynq.NewPublisher(outboxasynq.Config{Redis: redisOpt, Queue: queue}, nil)
	if err != nil {
		return "", false, err
	}
	defer pub.Close()
	stop, err := r.Relay(ctx, pub)
	if err != nil {
		return "", false, err
	}
	defer stop()

	// The business write and its job, in one transaction.
	for i := range users {
		err := pgx.BeginFunc(ctx, r.Pool, func(tx pgx.Tx) error {
			email := fmt.Sprintf("user%d@example.com", i)
			if _, err := tx.Exec(ctx, fmt.Sprintf(`INSERT INTO %q (id, email) VALUES ($1, $2)`, usersTable), i, email); err != nil {
				return err
			}
			p, err := outbox.NewPublisher(tx, outbox.PublisherConfig{Schema: r.Schema}, nil)
			if err != nil {
				return err
			}
			_, err = p.Enqueue(ctx, outbox.EventInput{Topic: "task.email:welcome", Payload: map[string]string{"email": email}})
			return err
		})
		if err != nil {
			return "", false, err
		}
	}

	// Wait until every task ran and asynq holds them as completed; "tasks" is how many tasks
	// the queue holds in any state (a second task for an event would show here).
	for {
		mu.Lock()
		ran, twice := len(runs), 0
		for _, n := range runs {
			if n > 1 {
				twice++
			}
		}
		mu.Unlock()
		tasks, completed := 0, 0
		if info, err := ins.GetQueueInfo(queue); err == nil {
			completed = info.Completed
			tasks = info.Pending + info.Active + info.Scheduled + info.Retry + info.Archived + info.Completed
		}
		line := fmt.Sprintf("tasks=%d ran=%d twice=%d", tasks, ran, twice)
		if ran == users && completed == users {
			return line, tasks == users && twice == 0, nil
		}
		select {
		case <-ctx.Done():
			return line, false, nil
		case <-time.After(20 * time.Millisecond):
		}
	}
}
