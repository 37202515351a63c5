package asynq_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/forwarder"
	outboxasynq "github.com/watermill-outbox/outbox/forwarder/asynq"
	"github.com/watermill-outbox/outbox/internal/brokertest"
	"github.com/watermill-outbox/outbox/internal/pgtest"
)

// TestUniqueDuplicate: under asynq.Unique, asynq answers "task already exists" both for a
// redelivered event (its own task holds the uniqueness lock) and for another event of the same
// type and payload. The first is delivered (a conflict, no second task); the second is permanent
// with ErrUniqueHeld naming the holding task. Both were ordinary failures: a redelivered event
// burnt its attempts and was dead-lettered, holding its key until then.
func TestUniqueDuplicate(t *testing.T) {
	addr := brokertest.RequireRedis(t)
	queue := queueName(t, addr)
	pub, err := outboxasynq.NewPublisher(outboxasynq.Config{
		Redis: asynq.RedisClientOpt{Addr: addr, DB: redisDB}, Queue: queue,
		Options: []asynq.Option{asynq.Unique(time.Hour)},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()

	first := outbox.NewMessage([]byte(`{"user":7}`))
	for i := range 2 {
		if err := pub.Publish("task.email:welcome", first); err != nil {
			t.Fatalf("publish %d of the same event: %v, want nil (a redelivery is delivered)", i+1, err)
		}
	}
	if s := pub.Stats(); s != (outboxasynq.Stats{Enqueued: 1, Conflicts: 1}) {
		t.Fatalf("stats %+v, want 1 enqueued, 1 conflict", s)
	}
	other := outbox.NewMessage([]byte(`{"user":7}`))
	err = pub.Publish("task.email:welcome", other)
	if !errors.Is(err, outbox.ErrPermanent) || !errors.Is(err, outboxasynq.ErrUniqueHeld) || !strings.Contains(err.Error(), first.UUID) {
		t.Fatalf("another event, same type and payload: %v, want ErrPermanent and ErrUniqueHeld naming task %s", err, first.UUID)
	}
	// Another payload is another task.
	if err := pub.Publish("task.email:welcome", outbox.NewMessage([]byte(`{"user":8}`))); err != nil {
		t.Fatal(err)
	}
	ins := asynq.NewInspector(asynq.RedisClientOpt{Addr: addr, DB: redisDB})
	defer ins.Close()
	q, err := ins.GetQueueInfo(queue)
	if err != nil {
		t.Fatal(err)
	}
	if q.Pending != 2 {
		t.Fatalf("%d pending tasks, want 2", q.Pending)
	}
}

// TestUniqueThroughRelay: through a real relay on PostgreSQL, of two events of the same task
// type and payload the one that asynq.Unique refuses (another event's task holds the lock) is
// dead-lettered at its first attempt with the reason, and the one holding the lock is delivered.
func TestUniqueThroughRelay(t *testing.T) {
	pool := pgtest.Require(t)
	addr := brokertest.RequireRedis(t)
	queue := queueName(t, addr)
	ctx := t.Context()
	schema := outbox.SchemaConfig{Table: pgtest.Table(t)}
	if err := outbox.Migrate(ctx, pool, schema); err != nil {
		t.Fatal(err)
	}
	writer, err := outbox.NewPublisher(pool, outbox.PublisherConfig{Schema: schema}, nil)
	if err != nil {
		t.Fatal(err)
	}
	first, err := writer.Enqueue(ctx, outbox.EventInput{Topic: "task.report", Payload: map[string]int{"day": 1}})
	if err != nil {
		t.Fatal(err)
	}
	second, err := writer.Enqueue(ctx, outbox.EventInput{Topic: "task.report", Payload: map[string]int{"day": 1}})
	if err != nil {
		t.Fatal(err)
	}
	sub, err := outbox.NewSubscriber(pool, outbox.SubscriberConfig{Schema: schema, PollInterval: 20 * time.Millisecond}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	dest, err := outboxasynq.NewPublisher(outboxasynq.Config{
		Redis: asynq.RedisClientOpt{Addr: addr, DB: redisDB}, Queue: queue,
		Options: []asynq.Option{asynq.Unique(time.Hour)},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	fw, err := forwarder.New(sub, dest, forwarder.Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = fw.Run(runCtx) }()
	defer func() { cancel(); <-done; _ = fw.Close() }()

	var dead []outbox.DeadLetter
	pgtest.Eventually(t, 20*time.Second, "one event is dead-lettered", func() bool {
		dead, err = sub.ListDeadLettered(ctx, outbox.DeadLetterFilter{Topics: []string{"*"}}, 10)
		if err != nil {
			t.Fatal(err)
		}
		return len(dead) > 0
	})
	// The two events are unordered, so either may be enqueued first; the other is refused.
	holder := first.ID
	if len(dead) == 1 && dead[0].ID == first.ID {
		holder = second.ID
	}
	if len(dead) != 1 || dead[0].Attempts != 1 ||
		!strings.Contains(dead[0].LastError, "asynq.Unique") || !strings.Contains(dead[0].LastError, holder.String()) {
		t.Fatalf("dead letters %+v, want one of %s, %s at attempt 1 with the reason naming the other's task", dead, first.ID, second.ID)
	}
	pgtest.Eventually(t, 20*time.Second, "the other event is delivered", func() bool {
		b, err := sub.Backlog(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return b.Pending == 0
	})
	if s := dest.Stats(); s != (outboxasynq.Stats{Enqueued: 1}) {
		t.Fatalf("destination stats %+v, want 1 enqueued", s)
	}
}
