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

// TestProbeTracker: when the probe's readings wake the relay, and when it asks for the list of
// transactions in progress.
func TestProbeTracker(t *testing.T) {
	t0 := time.Unix(1000, 0)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	p := outbox.NewProbeTracker(5 * time.Second)
	steps := []struct {
		counter    int64
		xmax       uint32
		inProgress []uint32
		running    []uint32 // what the probe listed (it lists when the counter moved or WantRunning)
		at         time.Time
		want       bool
		why        string
	}{
		{10, 100, []uint32{50}, nil, ms(0), false, "baseline"},
		{10, 100, []uint32{50}, nil, ms(5), false, "nothing changed"},
		// Writer 100 is above every completed transaction: the snapshot does not list it.
		{11, 100, []uint32{50}, []uint32{50, 100}, ms(10), true, "sequence moved"},
		{11, 101, []uint32{50, 100}, []uint32{50, 100, 101}, ms(15), true, "the probe after a change (101 started since: watched)"},
		{11, 102, []uint32{50, 100, 101}, nil, ms(20), false, "everyone still in progress"},
		{11, 102, []uint32{50, 101}, nil, ms(25), true, "writer 100 ended"},
		{11, 102, []uint32{50}, nil, ms(30), true, "101 ended"},
		{11, 102, []uint32{50}, nil, ms(35), false, "only 50 left, still in progress"},
		{11, 102, []uint32{50}, nil, ms(6000), false, "50 no longer watched after expire"},
		{11, 0, nil, nil, ms(6005), false, "50 ended, but it was dropped (no snapshot read)"},
		{12, 103, nil, []uint32{103}, ms(6010), true, "moved again, 103 in progress at or above xmax"},
		{12, 103, nil, []uint32{103}, ms(6015), true, "the probe after a change"},
		{12, 103, nil, nil, ms(6020), false, "103 still at or above xmax: in progress"},
		{12, 104, nil, nil, ms(6025), true, "103 below xmax and not listed: ended"},
		{12, 104, nil, nil, ms(6030), false, "idle"},
		// Transaction ids wrap around modulo 2^32.
		{13, 4294967295, nil, []uint32{4294967295}, ms(6035), true, "moved, writer at the top of the id space"},
		{13, 4294967295, nil, nil, ms(6040), true, "the probe after a change"},
		{13, 4294967295, nil, nil, ms(6045), false, "still in progress"},
		{13, 2, []uint32{1}, nil, ms(6050), true, "xmax wrapped past it: ended"},
	}
	for _, s := range steps {
		if got := p.Observe(s.counter, s.xmax, s.inProgress, s.running, s.at); got != s.want {
			t.Fatalf("%s: woke %v, want %v", s.why, got, s.want)
		}
		if s.why == "sequence moved" && !p.WantSnapshot() {
			t.Fatalf("after a change the next probe must read the snapshot")
		}
		if s.why == "idle" && (p.WantSnapshot() || p.Quiet(s.at, time.Second) || !p.Quiet(s.at.Add(time.Second), time.Second)) {
			t.Fatalf("idle: the next probe reads only the sequence; quiet a second after the last move")
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

// TestProbeSlowsAfterEmptyWakes: polls the probe starts that lease nothing (the writers write
// other topics) slow the probe down, doubling per empty poll beyond the first two, up to 8×
// the interval and never beyond the idle interval; one poll that leases resets it.
func TestProbeSlowsAfterEmptyWakes(t *testing.T) {
	const ms = time.Millisecond
	for _, c := range []struct {
		interval time.Duration
		leased   []bool
		want     time.Duration
	}{
		{5 * ms, nil, 5 * ms},
		{5 * ms, []bool{false, false}, 5 * ms},
		{5 * ms, []bool{false, true, false, true, false}, 5 * ms},
		{5 * ms, []bool{false, false, false}, 10 * ms},
		{5 * ms, []bool{false, false, false, false}, 20 * ms},
		{5 * ms, []bool{false, false, false, false, false, false, false, false, false}, 40 * ms},
		{5 * ms, []bool{false, false, false, false, false, true}, 5 * ms},
		{20 * ms, []bool{false, false, false, false, false, false}, 160 * ms},
		{40 * ms, []bool{false, false, false, false, false, false}, 320 * ms},
		{80 * ms, []bool{false, false, false, false, false, false}, 640 * ms},
		{100 * ms, []bool{false, false, false, false, false, false}, 800 * ms},
	} {
		if got := outbox.ProbeWait(c.interval, c.leased...); got != c.want {
			t.Errorf("interval %v after %v: wait %v, want %v", c.interval, c.leased, got, c.want)
		}
	}
}
