package asynq_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/hibiken/asynq"
	_ "modernc.org/sqlite"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/forwarder"
	outboxasynq "github.com/watermill-outbox/outbox/forwarder/asynq"
	_ "github.com/watermill-outbox/outbox/sqlite"
)

// Relay the outbox's task events to asynq: an event of topic "task.email:welcome" becomes a
// task of type "email:welcome" whose id is the event id, so a redelivered event does not
// enqueue the task twice. Redis at 127.0.0.1:6379 (or OUTBOX_TEST_REDIS_ADDR).
func ExampleNewPublisher() {
	ctx := context.Background()
	addr := os.Getenv("OUTBOX_TEST_REDIS_ADDR")
	if addr == "" {
		addr = "127.0.0.1:6379"
	}
	redisOpt := asynq.RedisClientOpt{Addr: addr}
	queue := fmt.Sprintf("example-%d", time.Now().UnixNano()) // a queue of its own
	inspector := asynq.NewInspector(redisOpt)
	defer inspector.Close()
	defer inspector.DeleteQueue(queue, true)

	dir, _ := os.MkdirTemp("", "outbox-example")
	defer os.RemoveAll(dir)
	db, _ := sql.Open("sqlite", outbox.SQLiteDSN(filepath.Join(dir, "app.db")))
	defer db.Close()
	schema := outbox.SchemaConfig{Dialect: outbox.DialectSQLite}
	if err := outbox.Migrate(ctx, db, schema); err != nil {
		panic(err)
	}
	writer, _ := outbox.NewPublisher(db, outbox.PublisherConfig{Schema: schema}, nil)
	msg := outbox.NewMessage([]byte(`{"user":42}`))
	if err := writer.Publish("task.email:welcome", msg); err != nil {
		panic(err)
	}

	pub, err := outboxasynq.NewPublisher(outboxasynq.Config{Redis: redisOpt, Queue: queue}, nil)
	if err != nil {
		panic(err)
	}
	defer pub.Close()
	sub, _ := outbox.NewSubscriber(db, outbox.SubscriberConfig{Schema: schema}, nil)
	fwd, err := forwarder.New(sub, pub, forwarder.Config{SubscribeTopic: outboxasynq.DefaultTopicPrefix + "*"}, nil)
	if err != nil {
		panic(err)
	}
	go func() { _ = fwd.Run(ctx) }()
	defer fwd.Close()

	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		tasks, err := inspector.ListPendingTasks(queue)
		if err == nil && len(tasks) == 1 {
			fmt.Println(tasks[0].Type, string(tasks[0].Payload), tasks[0].ID == msg.UUID)
			break
		}
	}
	// Output:
	// email:welcome {"user":42} true
}
