package asynq_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/hibiken/asynq"

	"github.com/watermill-outbox/outbox"
	outboxasynq "github.com/watermill-outbox/outbox/forwarder/asynq"
	"github.com/watermill-outbox/outbox/internal/brokertest"
	"github.com/watermill-outbox/outbox/internal/pgtest"
)

// redisDB is the Redis database of these tests (queues are named per test as well).
const redisDB = 9

func TestConfigValidate(t *testing.T) {
	r := asynq.RedisClientOpt{Addr: "127.0.0.1:6379"}
	for _, tc := range []struct {
		name  string
		cfg   outboxasynq.Config
		field string
	}{
		{"redis", outboxasynq.Config{Redis: r}, ""},
		{"neither", outboxasynq.Config{}, "asynq.Config.Redis"},
		{"both", outboxasynq.Config{Redis: r, Client: asynq.NewClient(r)}, "asynq.Config.Client"},
		{"negative retention", outboxasynq.Config{Redis: r, Retention: -time.Second}, "asynq.Config.Retention"},
		{"negative max retry", outboxasynq.Config{Redis: r, MaxRetry: -1}, "asynq.Config.MaxRetry"},
		{"queue with spaces", outboxasynq.Config{Redis: r, Queue: " q"}, "asynq.Config.Queue"},
		{"task id option", outboxasynq.Config{Redis: r, Options: []asynq.Option{asynq.TaskID("x")}}, "asynq.Config.Options[0]"},
		{"nil option", outboxasynq.Config{Redis: r, Options: []asynq.Option{nil}}, "asynq.Config.Options[0]"},
		{"timeout option", outboxasynq.Config{Redis: r, Options: []asynq.Option{asynq.Timeout(time.Minute)}}, ""},
		{"queue option", outboxasynq.Config{Redis: r, Options: []asynq.Option{asynq.Timeout(time.Minute), asynq.Queue("q")}}, "asynq.Config.Options[1]"},
		{"group option", outboxasynq.Config{Redis: r, Options: []asynq.Option{asynq.Group("g")}}, "asynq.Config.Options[0]"},
		{"unique with client", outboxasynq.Config{Client: asynq.NewClient(r), Options: []asynq.Option{asynq.Unique(time.Hour)}}, "asynq.Config.Options[0]"},
		{"unique with redis", outboxasynq.Config{Redis: r, Options: []asynq.Option{asynq.Unique(time.Hour)}}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			var ce *outbox.ConfigError
			switch {
			case tc.field == "" && err != nil:
				t.Fatal(err)
			case tc.field != "" && (!errors.As(err, &ce) || ce.Field != tc.field):
				t.Fatalf("Validate = %v, want a ConfigError on %s", err, tc.field)
			}
		})
	}
}

// queueName is a queue unique to this test run, deleted at the end.
func queueName(t *testing.T, addr string) string {
	t.Helper()
	q := fmt.Sprintf("outbox-test-%d-%d", os.Getpid(), time.Now().UnixNano())
	t.Cleanup(func() {
		ins := asynq.NewInspector(asynq.RedisClientOpt{Addr: addr, DB: redisDB})
		defer ins.Close()
		_ = ins.DeleteQueue(q, true)
	})
	return q
}

// TestPublisher: a task per event with type, payload, headers and the event id as task id; a
// second publish of the event is a conflict counted as delivered, and the worker runs the task
// once; a topic without the prefix is permanent; a Redis that does not answer is unavailable.
func TestPublisher(t *testing.T) {
	addr := brokertest.RequireRedis(t)
	queue := queueName(t, addr)
	pub, err := outboxasynq.NewPublisher(outboxasynq.Config{Redis: asynq.RedisClientOpt{Addr: addr, DB: redisDB}, Queue: queue}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()

	msg := outbox.NewMessage([]byte(`{"user":42}`))
	msg.Metadata.Set("trace", "abc")
	msg.Metadata.Set(outbox.MetadataEventID, msg.UUID)
	for range 2 {
		if err := pub.Publish("task.email:welcome", msg); err != nil {
			t.Fatal(err)
		}
	}
	if s := pub.Stats(); s != (outboxasynq.Stats{Enqueued: 1, Conflicts: 1}) {
		t.Fatalf("stats %+v, want 1 enqueued, 1 conflict", s)
	}

	type run struct {
		typ, payload, trace, eventID string
	}
	var (
		mu   sync.Mutex
		runs = map[string][]run{}
	)
	srv := worker(t, addr, queue, func(ctx context.Context, task *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		mu.Lock()
		runs[id] = append(runs[id], run{task.Type(), string(task.Payload()), task.Headers()["trace"], task.Headers()[outbox.MetadataEventID]})
		mu.Unlock()
		return nil
	})
	defer srv.Shutdown()
	pgtest.Eventually(t, 20*time.Second, "the worker runs the task", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(runs[msg.UUID]) > 0
	})
	// After the task ran, its id is retained: a redelivery is still recognised.
	if err := pub.Publish("task.email:welcome", msg); err != nil {
		t.Fatal(err)
	}
	ins := asynq.NewInspector(asynq.RedisClientOpt{Addr: addr, DB: redisDB})
	defer ins.Close()
	pgtest.Eventually(t, 10*time.Second, "the task is retained as completed", func() bool {
		info, err := ins.GetTaskInfo(queue, msg.UUID)
		return err == nil && info.State == asynq.TaskStateCompleted
	})
	mu.Lock()
	got := runs[msg.UUID]
	mu.Unlock()
	if want := (run{"email:welcome", `{"user":42}`, "abc", msg.UUID}); len(got) != 1 || got[0] != want {
		t.Fatalf("runs %+v, want one %+v", got, want)
	}
	if s := pub.Stats(); s.Conflicts != 2 {
		t.Fatalf("stats %+v, want 2 conflicts", s)
	}

	// Not a task topic: permanent.
	for _, topic := range []string{"orders.created", "task.", "task.  "} {
		if err := pub.Publish(topic, outbox.NewMessage([]byte(`1`))); !errors.Is(err, outbox.ErrPermanent) || !errors.Is(err, outboxasynq.ErrNotATask) {
			t.Fatalf("topic %q: %v, want ErrPermanent and ErrNotATask", topic, err)
		}
	}

	// Redis down: unavailable.
	down, err := outboxasynq.NewPublisher(outboxasynq.Config{Redis: asynq.RedisClientOpt{Addr: brokertest.ClosedPort(t), DialTimeout: time.Second}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer down.Close()
	var ue *outbox.UnavailableError
	if err := down.Publish("task.x", outbox.NewMessage([]byte(`1`))); !errors.As(err, &ue) || ue.Destination != outboxasynq.Destination {
		t.Fatalf("closed port: %v, want *outbox.UnavailableError of %q", err, outboxasynq.Destination)
	}

	if err := pub.Close(); err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish("task.x", outbox.NewMessage([]byte(`1`))); !errors.Is(err, outboxasynq.ErrClosed) {
		t.Fatalf("after Close: %v", err)
	}
}

// worker starts an asynq server on queue running h for every task type.
func worker(t *testing.T, addr, queue string, h asynq.HandlerFunc) *asynq.Server {
	t.Helper()
	srv := asynq.NewServer(asynq.RedisClientOpt{Addr: addr, DB: redisDB}, asynq.Config{
		Concurrency: 8, Queues: map[string]int{queue: 1}, LogLevel: asynq.ErrorLevel,
		TaskCheckInterval: 20 * time.Millisecond,
	})
	if err := srv.Start(h); err != nil {
		t.Fatal(err)
	}
	return srv
}

var _ message.Publisher = (*outboxasynq.Publisher)(nil)
