package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/internal/pgtest"
)

func TestTopicPatterns(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		schema := b.table(t)
		topics := []string{"a_b", "axb", "a%c", "abc", "lib.x", "lib.y", "libz", "lib.skip"}
		for _, tp := range topics {
			b.seed(t, schema, tp, 1, []string{""})
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
				b.raw.ExecContext(ctx, fmt.Sprintf(`UPDATE %q SET %s`, schema.Table, b.setPublished("NULL")))
				cfg := fastCfg(schema)
				cfg.ExcludeTopics = c.exclude
				sub := b.newSub(t, cfg)
				ch, err := sub.Subscribe(ctx, c.pattern)
				if err != nil {
					t.Fatal(err)
				}
				rec := &recorder{}
				rec.consume(ch, ack)
				pgtest.Eventually(t, 5*time.Second, "pattern's events published", func() bool {
					return b.count(t, fmt.Sprintf(`SELECT count(*) FROM %q WHERE published_at IS NOT NULL`, schema.Table)) == len(c.want)
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
			if _, err := b.newSub(t, fastCfg(schema)).Subscribe(ctx, bad); !errors.Is(err, outbox.ErrConfig) {
				t.Errorf("pattern %q: err = %v, want config error", bad, err)
			}
		}
	})
}

// TestCloseDuringBatch: acks received before Close are written; messages still unanswered at
// CloseTimeout are released (no attempt, no delivery start counted) and another relay
// delivers them at once.
func TestCloseDuringBatch(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		schema := b.table(t)
		b.seed(t, schema, "t", 10, []string{""})
		cfg := fastCfg(schema)
		cfg.LeaseDuration, cfg.DeliveryTimeout, cfg.CloseTimeout = 20*time.Second, 10*time.Second, 200*time.Millisecond
		sub := b.newSub(t, cfg)
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
		if n := b.count(t, fmt.Sprintf(`SELECT count(*) FROM %q WHERE published_at IS NOT NULL`, schema.Table)); n != 4 {
			t.Fatalf("published after close = %d, want 4", n)
		}
		if n := b.count(t, fmt.Sprintf(`SELECT count(*) FROM %q WHERE published_at IS NULL AND lease_until IS NULL AND leased_by IS NULL AND attempts = 0 AND delivery_starts = 0`, schema.Table)); n != 6 {
			t.Fatalf("released = %d, want 6", n)
		}
		for _, m := range msgs[4:] {
			if m.Context().Err() == nil {
				t.Fatal("an unanswered message's context is live after Close")
			}
		}
		sub2 := b.newSub(t, cfg)
		ch2, _ := sub2.Subscribe(ctx, "t")
		rec := &recorder{}
		rec.consume(ch2, ack)
		pgtest.Eventually(t, 5*time.Second, "rest delivered by the next relay", func() bool {
			return b.count(t, fmt.Sprintf(`SELECT count(*) FROM %q WHERE published_at IS NOT NULL`, schema.Table)) == 10
		})
		if rec.count() != 6 {
			t.Fatalf("second relay delivered %d, want 6", rec.count())
		}
	})
}

func TestOperations(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		schema := b.table(t)
		b.seed(t, schema, "t", 2600, []string{"", "k1", "k2"})
		// States set directly: 2100 published long ago, 100 published now, 150 dead long ago,
		// 50 dead now, 200 pending (100 of them created an hour ago).
		for _, q := range []string{
			`UPDATE %[1]q SET %[5]s WHERE sequence IN (SELECT sequence FROM (SELECT sequence FROM %[1]q ORDER BY sequence LIMIT 2100) x)`,
			`UPDATE %[1]q SET %[6]s WHERE sequence IN (SELECT sequence FROM (SELECT sequence FROM %[1]q WHERE published_at IS NULL ORDER BY sequence LIMIT 100) x)`,
			`UPDATE %[1]q SET dead_lettered_at = %[2]s, attempts = 5 WHERE sequence IN (SELECT sequence FROM (SELECT sequence FROM %[1]q WHERE published_at IS NULL ORDER BY sequence LIMIT 150) x)`,
			`UPDATE %[1]q SET dead_lettered_at = %[3]s, attempts = 5 WHERE sequence IN (SELECT sequence FROM (SELECT sequence FROM %[1]q WHERE published_at IS NULL AND dead_lettered_at IS NULL ORDER BY sequence LIMIT 50) x)`,
			`UPDATE %[1]q SET created_at = %[4]s WHERE sequence IN (SELECT sequence FROM (SELECT sequence FROM %[1]q WHERE published_at IS NULL AND dead_lettered_at IS NULL ORDER BY sequence LIMIT 100) x)`,
		} {
			b.exec(t, fmt.Sprintf(q, schema.Table, b.at(-2*time.Hour), b.at(0), b.at(-time.Hour), b.setPublished(b.at(-2*time.Hour)), b.setPublished(b.at(0))))
		}
		sub := b.newSub(t, fastCfg(schema))
		bl, err := sub.Backlog(ctx)
		if err != nil {
			t.Fatal(err)
		}
		// The 200 pending events are sequences 2401-2600: 67 unordered, 133 of keys k1 and k2,
		// whose heads are dead-lettered: all 133 are held.
		if bl.Pending != 200 || bl.DeadLettered != 200 || bl.Held != 133 || bl.OldestPendingAge < time.Hour || bl.OldestPendingAge > time.Hour+time.Minute {
			t.Fatalf("backlog %+v", bl)
		}
		// The counts are what the cleanups then delete.
		if n, err := sub.CountPublished(ctx, time.Hour); err != nil || n != 2100 {
			t.Fatalf("count published: %d %v", n, err)
		}
		if n, err := sub.CountDeadLetteredOlder(ctx, time.Hour); err != nil || n != 150 {
			t.Fatalf("count dead: %d %v", n, err)
		}
		if _, err := sub.CountPublished(ctx, -time.Second); !errors.Is(err, outbox.ErrConfig) {
			t.Fatalf("count with a negative age: %v", err)
		}
		n, err := sub.CleanupPublished(ctx, time.Hour)
		if err != nil || n != 2100 {
			t.Fatalf("cleanup published: %d %v", n, err)
		}
		n, err = sub.CleanupDeadLettered(ctx, time.Hour)
		if err != nil || n != 150 {
			t.Fatalf("cleanup dead: %d %v", n, err)
		}
		left := b.count(t, fmt.Sprintf(`SELECT count(*) FROM %q`, schema.Table))
		if left != 350 || b.count(t, fmt.Sprintf(`SELECT count(*) FROM %q WHERE published_at IS NOT NULL`, schema.Table)) != 100 {
			t.Fatalf("rows left %d", left)
		}
		if _, err := sub.RetryDeadLettered(ctx, outbox.RetryFilter{}); !errors.Is(err, outbox.ErrEmptyFilter) {
			t.Fatalf("empty filter: %v", err)
		}
		if _, err := sub.PurgeDeadLettered(ctx, outbox.DeadLetterFilter{Topics: []string{"*"}, OlderThan: -time.Second}); !errors.Is(err, outbox.ErrConfig) {
			t.Fatalf("negative OlderThan: %v", err)
		}

		// Dead letters on a second topic: list, older-than, ids, purge — each exact.
		u := b.publisher(t, outbox.PublisherConfig{Schema: schema})
		evs, err := u.EnqueueMany(ctx, []outbox.EventInput{
			{Topic: "u.a", Payload: map[string]int{"n": 1}, Headers: map[string]string{"h": "1"}},
			{Topic: "u.b", Payload: map[string]int{"n": 2}},
			{Topic: "u.b", Payload: map[string]int{"n": 3}},
			{Topic: "v", Payload: map[string]int{"n": 4}},
		})
		if err != nil {
			t.Fatal(err)
		}
		b.exec(t, fmt.Sprintf(`UPDATE %q SET dead_lettered_at = %s, attempts = 3, last_error = 'boom' WHERE topic <> 't'`, schema.Table, b.at(-10*time.Minute)))
		b.exec(t, fmt.Sprintf(`UPDATE %q SET dead_lettered_at = %s WHERE topic = 'v'`, schema.Table, b.at(0)))
		list, err := sub.ListDeadLettered(ctx, outbox.DeadLetterFilter{Topics: []string{"u.*"}}, 10)
		if err != nil || len(list) != 3 {
			t.Fatalf("list u.*: %d %v", len(list), err)
		}
		if list[0].ID != evs[0].ID || list[0].Topic != "u.a" || list[0].Attempts != 3 || list[0].LastError != "boom" || list[0].Headers["h"] != "1" ||
			list[0].DeadLetteredAt.IsZero() || time.Since(list[0].DeadLetteredAt) < 9*time.Minute || string(list[0].Payload) != `{"n": 1}` && string(list[0].Payload) != `{"n":1}` {
			t.Fatalf("first dead letter %+v", list[0])
		}
		if l, _ := sub.ListDeadLettered(ctx, outbox.DeadLetterFilter{Topics: []string{"*"}, OlderThan: 5 * time.Minute}, 10000); len(l) != 3 {
			t.Fatalf("older than 5m: %d dead letters, want the 3 u.* ones", len(l))
		}
		if _, err := sub.ListDeadLettered(ctx, outbox.DeadLetterFilter{Topics: []string{"*"}}, 0); !errors.Is(err, outbox.ErrConfig) {
			t.Fatalf("limit 0: %v", err)
		}
		byTopic, err := sub.BacklogByTopic(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if got := fmt.Sprint(byTopic); got != fmt.Sprintf("[{t {200 %s 50 0 133}} {u.a {0 0s 1 0 0}} {u.b {0 0s 2 0 0}} {v {0 0s 1 0 0}}]", byTopic[0].OldestPendingAge) ||
			byTopic[0].OldestPendingAge < time.Hour {
			t.Fatalf("backlog by topic %v", got)
		}
		// The overview under its limit is BacklogByTopic; over it (PostgreSQL), it counts the
		// oldest events of each kind only and says so.
		ov, err := sub.BacklogOverview(ctx, outbox.DefaultOverviewLimit)
		if err != nil {
			t.Fatal(err)
		}
		noAge := func(tb []outbox.TopicBacklog) string {
			var out []outbox.TopicBacklog
			for _, x := range tb {
				x.OldestPendingAge = x.OldestPendingAge.Round(time.Hour)
				out = append(out, x)
			}
			return fmt.Sprint(out)
		}
		if noAge(ov.Topics) != noAge(byTopic) || ov.Capped() || ov.Total.Pending != 200 || ov.Total.DeadLettered != 54 || ov.Total.Held != 133 ||
			ov.Total.OldestPendingAge.Round(time.Hour) != time.Hour {
			t.Fatalf("overview %+v, want the backlog by topic %v, uncapped", ov, byTopic)
		}
		if _, err := sub.BacklogOverview(ctx, 0); !errors.Is(err, outbox.ErrConfig) {
			t.Fatalf("overview limit 0: %v", err)
		}
		if b.dialect == outbox.DialectPostgreSQL {
			// 67 unordered and 133 keyed pending (all held behind the dead heads of k1 and
			// k2), 54 dead letters: 40 of each read.
			ov, err := sub.BacklogOverview(ctx, 40)
			if err != nil {
				t.Fatal(err)
			}
			if !ov.PendingCapped || !ov.DeadCapped || ov.HeldCapped || ov.Total.Pending != 80 || ov.Total.Held != 40 || ov.Total.DeadLettered != 40 ||
				ov.Topics[0].Topic != "t" || ov.Topics[0].Pending != 80 || ov.Total.OldestPendingAge.Round(time.Hour) != time.Hour {
				t.Fatalf("overview capped at 40: %+v", ov)
			}
		}
		for _, tc := range []struct {
			f    outbox.DeadLetterFilter
			want int64
		}{
			{outbox.DeadLetterFilter{IDs: []uuid.UUID{evs[1].ID}, Topics: []string{"v"}}, 2},
			{outbox.DeadLetterFilter{Topics: []string{"*"}, OlderThan: 5 * time.Minute}, 3},
			{outbox.DeadLetterFilter{Topics: []string{"*"}}, 54},
		} {
			if n, err := sub.CountDeadLettered(ctx, tc.f); err != nil || n != tc.want {
				t.Fatalf("count dead letters %+v: %d %v, want %d", tc.f, n, err, tc.want)
			}
		}
		if _, err := sub.CountDeadLettered(ctx, outbox.DeadLetterFilter{}); !errors.Is(err, outbox.ErrEmptyFilter) {
			t.Fatalf("count with an empty filter: %v", err)
		}
		n, err = sub.PurgeDeadLettered(ctx, outbox.DeadLetterFilter{IDs: []uuid.UUID{evs[1].ID}, Topics: []string{"v"}})
		if err != nil || n != 2 {
			t.Fatalf("purge by id and topic: %d %v", n, err)
		}
		n, err = sub.RetryDeadLettered(ctx, outbox.RetryFilter{Topics: []string{"u.b"}})
		if err != nil || n != 1 {
			t.Fatalf("retry u.b: %d %v", n, err)
		}
		n, err = sub.RetryDeadLettered(ctx, outbox.RetryFilter{Topics: []string{"*"}})
		if err != nil || n != 51 {
			t.Fatalf("retry all: %d %v", n, err)
		}
		bl, _ = sub.Backlog(ctx)
		if bl.Pending != 252 || bl.DeadLettered != 0 || bl.Held != 0 {
			t.Fatalf("backlog after retry %+v", bl)
		}
		if err := outbox.CheckTable(ctx, b.db, schema); err != nil {
			t.Fatalf("check existing table: %v", err)
		}
		missing := schema
		missing.Table = "no_such_outbox"
		if err := outbox.CheckTable(ctx, b.db, missing); !errors.Is(err, outbox.ErrTableNotFound) {
			t.Fatalf("check missing table: %v", err)
		}
	})
}

func TestSubscriberConfigValidation(t *testing.T) {
	cases := map[string]outbox.SubscriberConfig{
		"BatchSize":       {BatchSize: 10001},
		"BatchSize neg":   {BatchSize: -1},
		"DeliveryTimeout": {LeaseDuration: 10 * time.Second, DeliveryTimeout: 10 * time.Second},
		"LeaseDuration":   {LeaseDuration: 10 * time.Millisecond},
		"CloseTimeout":    {CloseTimeout: -time.Second},
		"CloseTimeout >":  {DeliveryTimeout: time.Second, CloseTimeout: 2 * time.Second},
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
	eachBackend(t, func(t *testing.T, b *backend) {
		schema := b.table(t)
		b.seed(t, schema, "t", 1, []string{"k"})
		cfg := fastCfg(schema)
		cfg.MaxAttempts = 1
		sub := b.newSub(t, cfg)
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
			return b.count(t, fmt.Sprintf(`SELECT count(*) FROM %q WHERE last_error = $1 AND dead_lettered_at IS NOT NULL`, schema.Table), want) == 1
		})
	})
}

// TestSyncCommitBothWays drains the same backlog with the relay's statements committed
// asynchronously (the default over a pool) and synchronously (SyncCommit): the same exact
// outcome — every event published once, failures counted — either way.
func TestSyncCommitBothWays(t *testing.T) {
	b := pgBackend(t)
	for _, sync := range []bool{false, true} {
		t.Run(fmt.Sprintf("SyncCommit=%v", sync), func(t *testing.T) {
			schema := b.table(t)
			b.seed(t, schema, "t", 300, []string{"", "a", "b"})
			cfg := fastCfg(schema)
			cfg.SyncCommit = sync
			cfg.RetryBase, cfg.RetryMax = 10*time.Millisecond, 20*time.Millisecond
			ch, err := b.newSub(t, cfg).Subscribe(ctx, "t")
			if err != nil {
				t.Fatal(err)
			}
			var failed atomic.Bool
			rec := &recorder{}
			rec.consume(ch, func(m *message.Message) error {
				if !failed.CompareAndSwap(false, true) {
					return nil
				}
				return errors.New("first delivery fails")
			})
			pgtest.Eventually(t, 20*time.Second, "all published", func() bool {
				return b.count(t, fmt.Sprintf(`SELECT count(*) FROM %q WHERE published_at IS NULL`, schema.Table)) == 0
			})
			if n := b.count(t, fmt.Sprintf(`SELECT count(*) FROM %q WHERE attempts = 1`, schema.Table)); n != 1 {
				t.Fatalf("%d events with one failed attempt, want 1", n)
			}
			if n := len(rec.all()); n != 301 {
				t.Fatalf("%d deliveries, want 301 (300 + one retry)", n)
			}
		})
	}
}
