package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/internal/pgtest"
)

func TestTopicPatterns(t *testing.T) {
	schema := newTable(t)
	topics := []string{"a_b", "axb", "a%c", "abc", "lib.x", "lib.y", "libz", "lib.skip"}
	for _, tp := range topics {
		seed(t, schema, tp, 1, []string{""})
	}
	cases := []struct {
		pattern string
		exclude []string
		want    []string
	}{
		{"a_b", nil, []string{"a_b"}},
		{"a%c", nil, []string{"a%c"}},
		{"a_*", nil, []string{"a_b"}},
		{"lib.*", nil, []string{"lib.skip", "lib.x", "lib.y"}},
		{"lib.*", []string{"lib.skip"}, []string{"lib.x", "lib.y"}},
		{"*", []string{"lib*", "a%*"}, []string{"a_b", "abc", "axb"}},
	}
	for _, c := range cases {
		t.Run(c.pattern, func(t *testing.T) {
			// Reset: every event pending again.
			pgtest.Require(t).Exec(ctx, fmt.Sprintf(`UPDATE %q SET published_at = NULL`, schema.Table))
			cfg := fastCfg(schema)
			cfg.ExcludeTopics = c.exclude
			sub := newSub(t, cfg)
			ch, err := sub.Subscribe(ctx, c.pattern)
			if err != nil {
				t.Fatal(err)
			}
			rec := &recorder{}
			rec.consume(ch, ack)
			pgtest.Eventually(t, 5*time.Second, "pattern's events published", func() bool {
				return count(t, fmt.Sprintf(`SELECT count(*) FROM %q WHERE published_at IS NOT NULL`, schema.Table)) == len(c.want)
			})
			sub.Close()
			var got []string
			for _, d := range rec.all() {
				got = append(got, d.topic)
			}
			sort.Strings(got)
			if fmt.Sprint(got) != fmt.Sprint(c.want) {
				t.Fatalf("got %v, want %v", got, c.want)
			}
		})
	}
	for _, bad := range []string{"a*b", "a?", "", "*x"} {
		if _, err := newSub(t, fastCfg(schema)).Subscribe(ctx, bad); !errors.Is(err, outbox.ErrConfig) {
			t.Errorf("pattern %q: err = %v, want config error", bad, err)
		}
	}
}

// TestCloseDuringBatch: acks received before Close are written; the rest stays leased and
// another relay delivers it after the lease expires.
func TestCloseDuringBatch(t *testing.T) {
	schema := newTable(t)
	seed(t, schema, "t", 10, []string{""})
	cfg := fastCfg(schema)
	cfg.LeaseDuration, cfg.DeliveryTimeout = 2*time.Second, time.Second
	sub := newSub(t, cfg)
	ch, _ := sub.Subscribe(ctx, "t")
	var msgs []*message.Message
	for range 10 {
		msgs = append(msgs, <-ch)
	}
	for _, m := range msgs[:4] {
		m.Ack()
	}
	sub.Close()
	if _, open := <-ch; open {
		t.Fatal("channel open after Close")
	}
	if n := count(t, fmt.Sprintf(`SELECT count(*) FROM %q WHERE published_at IS NOT NULL`, schema.Table)); n != 4 {
		t.Fatalf("published after close = %d, want 4", n)
	}
	if n := count(t, fmt.Sprintf(`SELECT count(*) FROM %q WHERE published_at IS NULL AND lease_until > now() AND attempts = 0`, schema.Table)); n != 6 {
		t.Fatalf("still leased = %d, want 6", n)
	}
	sub2 := newSub(t, fastCfg(schema))
	ch2, _ := sub2.Subscribe(ctx, "t")
	rec := &recorder{}
	rec.consume(ch2, ack)
	pgtest.Eventually(t, 10*time.Second, "rest delivered after lease expiry", func() bool {
		return count(t, fmt.Sprintf(`SELECT count(*) FROM %q WHERE published_at IS NOT NULL`, schema.Table)) == 10
	})
	if rec.count() != 6 {
		t.Fatalf("second relay delivered %d, want 6", rec.count())
	}
}

func TestOperations(t *testing.T) {
	schema := newTable(t)
	pool := pgtest.Require(t)
	seed(t, schema, "t", 2600, []string{"", "k1", "k2"})
	// States set directly: 2100 published long ago, 100 published now, 150 dead long ago,
	// 50 dead now, 200 pending (100 of them created an hour ago).
	_, err := pool.Exec(ctx, fmt.Sprintf(`
		UPDATE %[1]q SET published_at = now() - interval '2 hours' WHERE sequence IN (SELECT sequence FROM %[1]q ORDER BY sequence LIMIT 2100);
		UPDATE %[1]q SET published_at = now() WHERE sequence IN (SELECT sequence FROM %[1]q WHERE published_at IS NULL ORDER BY sequence LIMIT 100);
		UPDATE %[1]q SET dead_lettered_at = now() - interval '2 hours', attempts = 5 WHERE sequence IN (SELECT sequence FROM %[1]q WHERE published_at IS NULL ORDER BY sequence LIMIT 150);
		UPDATE %[1]q SET dead_lettered_at = now(), attempts = 5 WHERE sequence IN (SELECT sequence FROM %[1]q WHERE published_at IS NULL AND dead_lettered_at IS NULL ORDER BY sequence LIMIT 50);
		UPDATE %[1]q SET created_at = now() - interval '1 hour' WHERE sequence IN (SELECT sequence FROM %[1]q WHERE published_at IS NULL AND dead_lettered_at IS NULL ORDER BY sequence LIMIT 100);`, schema.Table))
	if err != nil {
		t.Fatal(err)
	}
	sub := newSub(t, fastCfg(schema))
	b, err := sub.Backlog(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if b.Pending != 200 || b.DeadLettered != 200 || b.OldestPendingAge < time.Hour || b.OldestPendingAge > time.Hour+time.Minute {
		t.Fatalf("backlog %+v", b)
	}
	n, err := sub.CleanupPublished(ctx, time.Hour)
	if err != nil || n != 2100 {
		t.Fatalf("cleanup published: %d %v", n, err)
	}
	n, err = sub.CleanupDeadLettered(ctx, time.Hour)
	if err != nil || n != 150 {
		t.Fatalf("cleanup dead: %d %v", n, err)
	}
	left := count(t, fmt.Sprintf(`SELECT count(*) FROM %q`, schema.Table))
	if left != 350 || count(t, fmt.Sprintf(`SELECT count(*) FROM %q WHERE published_at IS NOT NULL`, schema.Table)) != 100 {
		t.Fatalf("rows left %d", left)
	}
	if _, err := sub.RetryDeadLettered(ctx, outbox.RetryFilter{}); !errors.Is(err, outbox.ErrEmptyFilter) {
		t.Fatalf("empty filter: %v", err)
	}
	n, err = sub.RetryDeadLettered(ctx, outbox.RetryFilter{Topics: []string{"*"}})
	if err != nil || n != 50 {
		t.Fatalf("retry all: %d %v", n, err)
	}
	b, _ = sub.Backlog(ctx)
	if b.Pending != 250 || b.DeadLettered != 0 {
		t.Fatalf("backlog after retry %+v", b)
	}
}

func TestSubscriberConfigValidation(t *testing.T) {
	cases := map[string]outbox.SubscriberConfig{
		"BatchSize":       {BatchSize: 10001},
		"BatchSize neg":   {BatchSize: -1},
		"DeliveryTimeout": {LeaseDuration: 10 * time.Second, DeliveryTimeout: 10 * time.Second},
		"LeaseDuration":   {LeaseDuration: 10 * time.Millisecond},
		"PollInterval":    {PollInterval: -time.Second},
		"RetryBase":       {RetryBase: -time.Second},
		"RetryMax":        {RetryBase: 10 * time.Second, RetryMax: time.Second},
		"MaxAttempts":     {MaxAttempts: -1},
		"Concurrency":     {Concurrency: -1},
		"MaxRunPerKey":    {BatchSize: 10, MaxRunPerKey: 11},
		"ExcludeTopics":   {ExcludeTopics: []string{"a*b"}},
		"Schema":          {Schema: outbox.SchemaConfig{Table: "a.b.c"}},
	}
	for name, c := range cases {
		err := c.Validate()
		var ce *outbox.ConfigError
		if !errors.As(err, &ce) {
			t.Errorf("%s: err = %v, want *ConfigError", name, err)
		}
	}
	if err := (outbox.SubscriberConfig{}).Validate(); err != nil {
		t.Fatalf("zero config: %v", err)
	}
	tx, _ := pgtest.Require(t).Begin(ctx)
	defer tx.Rollback(ctx)
	if _, err := outbox.NewSubscriber(tx, outbox.SubscriberConfig{}, nil); !errors.Is(err, outbox.ErrUnsupportedDB) {
		t.Fatalf("tx accepted: %v", err)
	}
}

// TestRouterRecordError runs the subscriber under a real Watermill router with the RecordError
// middleware: the handler's error lands in last_error and the full Event is in the context.
func TestRouterRecordError(t *testing.T) {
	schema := newTable(t)
	seed(t, schema, "t", 1, []string{"k"})
	cfg := fastCfg(schema)
	cfg.MaxAttempts = 1
	sub := newSub(t, cfg)
	r, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	r.AddMiddleware(outbox.RecordError)
	gotEvent := make(chan *outbox.Event, 1)
	r.AddConsumerHandler("h", "t", sub, func(msg *message.Message) error {
		ev, _ := outbox.EventFromContext(msg.Context())
		gotEvent <- ev
		return fmt.Errorf("handler refused %s", msg.UUID)
	})
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go r.Run(rctx)
	ev := <-gotEvent
	if ev == nil || ev.OrderingKey != "k" || ev.Topic != "t" || ev.Attempts != 0 {
		t.Fatalf("event in context: %+v", ev)
	}
	want := "handler refused " + ev.ID.String()
	pgtest.Eventually(t, 5*time.Second, "last_error stored", func() bool {
		return count(t, fmt.Sprintf(`SELECT count(*) FROM %q WHERE last_error = $1 AND dead_lettered_at IS NOT NULL`, schema.Table), want) == 1
	})
}
