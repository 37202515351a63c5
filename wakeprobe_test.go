package outbox_test

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/internal/pgtest"
)

// arrivals records when each event id reached the handler, per delivery.
type arrivals struct {
	mu sync.Mutex
	at map[string][]time.Time
}

func (a *arrivals) get(id string) []time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]time.Time(nil), a.at[id]...)
}

// TestWakeProbeDeliversWithinPollInterval: a Subscriber with the default config (PollInterval
// 5s, no Wakeup) delivers events committed by a plain Publisher on a pgx.Tx well within a
// second of the COMMIT — also when the writer's transaction stays open after its INSERT, when
// two writers commit out of sequence order, after RetryDeadLettered, and while a REPEATABLE
// READ transaction sits idle — because it probes the table's sequence. Each event is committed right after the previous one was delivered, so
// the next poll by PollInterval is 5 s away: only a wakeup can deliver it within a second.
func TestWakeProbeDeliversWithinPollInterval(t *testing.T) {
	pool := pgtest.Require(t)
	schema := outbox.SchemaConfig{Table: pgtest.Table(t)}
	if err := outbox.Migrate(ctx, pool, schema); err != nil {
		t.Fatal(err)
	}
	var emptyClaims atomic.Int64
	hooks := outbox.Hooks{OnClaim: func(c outbox.ClaimInfo) {
		if c.Events == 0 {
			emptyClaims.Add(1)
		}
	}}
	sub, err := outbox.NewSubscriber(pool, outbox.SubscriberConfig{Schema: schema, MaxAttempts: 1, Hooks: hooks}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	ch, err := sub.Subscribe(ctx, "*")
	if err != nil {
		t.Fatal(err)
	}
	arr := &arrivals{at: map[string][]time.Time{}}
	failOnce := map[string]bool{}
	var failMu sync.Mutex
	go func() {
		for msg := range ch {
			now := time.Now()
			arr.mu.Lock()
			arr.at[msg.UUID] = append(arr.at[msg.UUID], now)
			arr.mu.Unlock()
			failMu.Lock()
			fail := failOnce[msg.UUID]
			delete(failOnce, msg.UUID)
			failMu.Unlock()
			if fail {
				msg.Nack()
			} else {
				msg.Ack()
			}
		}
	}()
	// writeMsg inserts msg in a transaction of its own; before runs in it first, between
	// after the INSERT and before COMMIT. It returns the id and when COMMIT returned.
	writeMsg := func(msg *message.Message, before, between func(tx pgx.Tx)) (string, time.Time) {
		t.Helper()
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		if before != nil {
			before(tx)
		}
		pub, err := outbox.NewPublisher(tx, outbox.PublisherConfig{Schema: schema}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := pub.Publish("probe.test", msg); err != nil {
			t.Fatal(err)
		}
		if between != nil {
			between(tx)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		return msg.UUID, time.Now()
	}
	write := func(before, between func(tx pgx.Tx)) (string, time.Time) {
		t.Helper()
		return writeMsg(outbox.NewMessage([]byte(`{}`)), before, between)
	}
	// delivered waits (bounded) for id's n-th delivery and requires it within a second of at.
	delivered := func(what, id string, n int, at time.Time) {
		t.Helper()
		pgtest.Eventually(t, 10*time.Second, what+" delivered", func() bool { return len(arr.get(id)) >= n })
		if d := arr.get(id)[n-1].Sub(at); d > time.Second {
			t.Fatalf("%s: delivered %s after it became claimable (PollInterval is 5s); want well within 1s", what, d)
		}
	}

	// A snapshot held open throughout (an idle REPEATABLE READ transaction that ran a query)
	// changes nothing: the probe reads no table rows.
	held, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Rollback(ctx)
	if _, err := held.Exec(ctx, "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ"); err != nil {
		t.Fatal(err)
	}
	if _, err := held.Exec(ctx, "SELECT count(*) FROM "+pgx.Identifier{schema.Table}.Sanitize()); err != nil {
		t.Fatal(err)
	}

	// The subscription's first poll may find the first event by itself.
	id, at := write(nil, nil)
	pgtest.Eventually(t, 10*time.Second, "first event delivered", func() bool { return len(arr.get(id)) == 1 })

	for i := range 5 {
		id, at = write(nil, nil)
		delivered("plain commit "+string(rune('0'+i)), id, 1, at)
	}

	// The transaction stays open after its INSERT: the sequence moved long before the COMMIT.
	open := func(pgx.Tx) { time.Sleep(300 * time.Millisecond) }
	id, at = write(nil, open)
	delivered("commit 300ms after the insert", id, 1, at)
	// The same, with the transaction's id assigned by an earlier write.
	id, at = write(func(tx pgx.Tx) {
		if _, err := tx.Exec(ctx, "SELECT txid_current()"); err != nil {
			t.Fatal(err)
		}
	}, open)
	delivered("commit 300ms after the insert, id assigned before", id, 1, at)

	// Two writers commit out of sequence order: the first inserts, the second inserts and
	// commits (and is delivered), then the first commits.
	idA, atA := write(nil, func(pgx.Tx) {
		id, at := write(nil, nil)
		delivered("the later writer", id, 1, at)
	})
	delivered("the earlier writer, committed last", idA, 1, atA)

	// A dead letter given a fresh attempt goes out at once.
	dead := outbox.NewMessage([]byte(`{}`))
	failMu.Lock()
	failOnce[dead.UUID] = true
	failMu.Unlock()
	writeMsg(dead, nil, nil)
	pgtest.Eventually(t, 10*time.Second, "event dead-lettered", func() bool {
		b, err := sub.Backlog(ctx)
		return err == nil && b.DeadLettered == 1
	})
	// Then the relay waits: an empty claim after the dead letter was written.
	empty := emptyClaims.Load()
	pgtest.Eventually(t, 10*time.Second, "an empty claim after the dead letter", func() bool { return emptyClaims.Load() > empty })
	n, err := sub.RetryDeadLettered(ctx, outbox.RetryFilter{IDs: []uuid.UUID{uuid.MustParse(dead.UUID)}})
	if err != nil || n != 1 {
		t.Fatalf("RetryDeadLettered = %d, %v", n, err)
	}
	delivered("dead letter after RetryDeadLettered", dead.UUID, 2, time.Now())
}

// TestWakeProbeConfig: the probe's settings in Watermill style.
func TestWakeProbeConfig(t *testing.T) {
	var ce *outbox.ConfigError
	for _, c := range []struct {
		cfg   outbox.SubscriberConfig
		field string
	}{
		{outbox.SubscriberConfig{}, ""},
		{outbox.SubscriberConfig{DisableWakeProbe: true}, ""},
		{outbox.SubscriberConfig{WakeProbeInterval: time.Millisecond}, ""},
		{outbox.SubscriberConfig{WakeProbeInterval: -1}, "SubscriberConfig.WakeProbeInterval"},
		{outbox.SubscriberConfig{WakeProbeInterval: 500 * time.Microsecond}, "SubscriberConfig.WakeProbeInterval"},
		{outbox.SubscriberConfig{WakeProbeInterval: 5 * time.Millisecond, DisableWakeProbe: true}, "SubscriberConfig.WakeProbeInterval"},
		{outbox.SubscriberConfig{Schema: outbox.SchemaConfig{Dialect: outbox.DialectSQLite}}, ""},
		{outbox.SubscriberConfig{Schema: outbox.SchemaConfig{Dialect: outbox.DialectSQLite}, WakeProbeInterval: 5 * time.Millisecond}, "SubscriberConfig.WakeProbeInterval"},
		{outbox.SubscriberConfig{Schema: outbox.SchemaConfig{Dialect: outbox.DialectMySQL}, WakeProbeInterval: 5 * time.Millisecond}, "SubscriberConfig.WakeProbeInterval"},
	} {
		err := c.cfg.Validate()
		switch {
		case c.field == "" && err != nil:
			t.Errorf("%+v: %v", c.cfg, err)
		case c.field != "" && (!errors.As(err, &ce) || ce.Field != c.field):
			t.Errorf("%+v: %v, want a ConfigError on %s", c.cfg, err, c.field)
		}
	}
}

// TestWakeProbeLogs: the probe says once that it is on (INFO) and warns once when the table's
// sequence has a cache above 1 (writes served from it do not move the sequence).
func TestWakeProbeLogs(t *testing.T) {
	pool := pgtest.Require(t)
	schema := outbox.SchemaConfig{Table: pgtest.Table(t)}
	if err := outbox.Migrate(ctx, pool, schema); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `ALTER TABLE `+pgx.Identifier{schema.Table}.Sanitize()+` ALTER COLUMN sequence SET CACHE 10`); err != nil {
		t.Fatal(err)
	}
	l := &levelLog{}
	sub, err := outbox.NewSubscriber(pool, outbox.SubscriberConfig{Schema: schema}, l)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	if _, err := sub.Subscribe(ctx, "*"); err != nil {
		t.Fatal(err)
	}
	cache := "WARN outbox: the wake probe misses writes served from the sequence's cache"
	pgtest.Eventually(t, 10*time.Second, "cache warning", func() bool { return l.count(cache) == 1 })
	if n := l.count("INFO outbox: wake probe on"); n != 1 {
		t.Fatalf("%d start lines", n)
	}
}
