package outbox_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/internal/pgtest"
	"github.com/watermill-outbox/outbox/wakeup"
)

// tenantTables migrates n fresh outbox tables of b's dialect and returns their names.
func tenantTables(t *testing.T, b *backend, n int) []string {
	t.Helper()
	names := make([]string, n)
	for i := range names {
		names[i] = b.tableName(t, fmt.Sprintf("tenant_%d", i))
		if err := outbox.Migrate(ctx, b.db, outbox.SchemaConfig{Table: names[i], Dialect: b.dialect}); err != nil {
			t.Fatal(err)
		}
	}
	return names
}

// TestMultiSubscriber: one relay over three tables delivers every event once with its table in
// MetadataTable, keeps each table's ordering keys in order (the same key in two tables is two
// keys), marks them published in their own table, and serves the tables in turn: the two small
// tables' events all arrive while the big table's backlog is still mostly undelivered.
func TestMultiSubscriber(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		tables := tenantTables(t, b, 3)
		big, small := b.scale(3000, 3), 20
		for i, tb := range tables {
			n := small
			if i == 0 {
				n = big
			}
			b.seed(t, outbox.SchemaConfig{Table: tb, Dialect: b.dialect}, "invoices", n, []string{"k1", "k2", ""})
		}
		cfg := fastCfg(outbox.SchemaConfig{Dialect: b.dialect})
		cfg.Schema.Table = ""
		var claims sync.Map // table → *atomic.Int64
		m, err := outbox.NewMultiSubscriber(b.db, outbox.MultiSubscriberConfig{Tables: tables, Subscriber: cfg,
			HooksFor: func(table string) outbox.Hooks {
				n := new(atomic.Int64)
				claims.Store(table, n)
				return outbox.Hooks{OnClaim: func(ci outbox.ClaimInfo) { n.Add(int64(ci.Events)) }}
			}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		ch, err := m.Subscribe(ctx, "*")
		if err != nil {
			t.Fatal(err)
		}
		type got struct {
			table, key string
			i          int
		}
		var seen []got
		bigWhenSmallDone := -1
		smallSeen := 0
		deadline := time.After(2 * time.Minute)
		for len(seen) < big+2*small {
			select {
			case msg := <-ch:
				var p struct{ I int }
				if err := json.Unmarshal(msg.Payload, &p); err != nil {
					t.Fatal(err)
				}
				g := got{msg.Metadata.Get(outbox.MetadataTable), msg.Metadata.Get(outbox.MetadataOrderingKey), p.I}
				seen = append(seen, g)
				msg.Ack()
				if g.table != tables[0] {
					if smallSeen++; smallSeen == 2*small {
						bigWhenSmallDone = len(seen) - smallSeen
					}
				}
			case <-deadline:
				t.Fatalf("%d of %d events delivered within 2 minutes", len(seen), big+2*small)
			}
		}
		// Exactly once each, per table; in order per (table, key).
		last := map[string]int{}
		count := map[string]int{}
		ids := map[string]bool{}
		for _, g := range seen {
			if !slices.Contains(tables, g.table) {
				t.Fatalf("MetadataTable %q is not a relayed table", g.table)
			}
			id := g.table + "/" + strconv.Itoa(g.i)
			if ids[id] {
				t.Fatalf("event %s delivered twice", id)
			}
			ids[id] = true
			count[g.table]++
			if g.key != "" {
				k := g.table + "/" + g.key
				if prev, ok := last[k]; ok && g.i < prev {
					t.Fatalf("key %s: event %d after %d", k, g.i, prev)
				}
				last[k] = g.i
			}
		}
		if count[tables[0]] != big || count[tables[1]] != small || count[tables[2]] != small {
			t.Fatalf("delivered per table %v, want %d, %d, %d", count, big, small, small)
		}
		// Fair turns: each small table's 20 events need about 20 turns of the big table
		// (plus a claim's worth while their relays start); without them they would wait for
		// the whole backlog. SQLite under the race detector is exempt: its relays' claims and
		// marks then hold the file's single write lock tens of times longer, and SQLite's busy
		// wait (sleeps of up to 100 ms) is not first come, first served, so the small tables'
		// claims wait behind the big table's for reasons outside the merge.
		t.Logf("the small tables finished after %d of the big table's %d events", bigWhenSmallDone, big)
		if limit := big / 2; (b.dialect == outbox.DialectPostgreSQL || !raceEnabled) && (bigWhenSmallDone < 0 || bigWhenSmallDone > limit) {
			t.Fatalf("the small tables finished after %d of the big table's %d events, want at most %d", bigWhenSmallDone, big, limit)
		}
		for i, tb := range tables {
			want := small
			if i == 0 {
				want = big
			}
			pgtest.Eventually(t, 10*time.Second, "marks written", func() bool {
				return b.count(t, `SELECT count(*) FROM `+tb+` WHERE published_at IS NOT NULL`) == want
			})
			if n, _ := claims.Load(tb); n.(*atomic.Int64).Load() != int64(want) {
				t.Fatalf("table %s: hooks counted %d claimed events, want %d", tb, n.(*atomic.Int64).Load(), want)
			}
		}
		if err := m.Close(); err != nil {
			t.Fatal(err)
		}
		if _, ok := <-ch; ok {
			t.Fatal("channel open after Close")
		}
		if _, err := m.Subscribe(ctx, "*"); !errors.Is(err, outbox.ErrClosed) {
			t.Fatalf("Subscribe after Close: %v", err)
		}
	})
}

// TestMultiSubscriberConfig: the config rules, checked before any SQL.
func TestMultiSubscriberConfig(t *testing.T) {
	var ce *outbox.ConfigError
	for name, tc := range map[string]struct {
		cfg   outbox.MultiSubscriberConfig
		field string
	}{
		"no tables":      {outbox.MultiSubscriberConfig{}, "MultiSubscriberConfig.Tables"},
		"schema table":   {outbox.MultiSubscriberConfig{Tables: []string{"a"}, Subscriber: outbox.SubscriberConfig{Schema: outbox.SchemaConfig{Table: "x"}}}, "MultiSubscriberConfig.Subscriber.Schema.Table"},
		"twice":          {outbox.MultiSubscriberConfig{Tables: []string{"a.t", "b.t", "a.t"}}, "MultiSubscriberConfig.Tables[2]"},
		"bad table":      {outbox.MultiSubscriberConfig{Tables: []string{"a.b.c"}}, "MultiSubscriberConfig.Tables[0]"},
		"bad subscriber": {outbox.MultiSubscriberConfig{Tables: []string{"a"}, Subscriber: outbox.SubscriberConfig{BatchSize: -1}}, "MultiSubscriberConfig.Tables[0]"},
	} {
		if err := tc.cfg.Validate(); !errors.As(err, &ce) || ce.Field != tc.field {
			t.Errorf("%s: %v, want a *ConfigError on %s", name, err, tc.field)
		}
	}
}

// BenchmarkMultiTenantTrickle measures issue 21's fairness target: one relay over 20 tenant
// schemas, one holding a backlog (OUTBOX_BENCH_BACKLOG events, default 100,000) and 19 with a
// trickle of 10 events/s each, every table with its own in-process wakeup. It reports the
// trickle events' p50/p99/max latency (write to receipt) while the backlog drains, and the
// drain rate. OUTBOX_BENCH_RATE sets the trickle's events/s per table (0: none, the drain
// rate's comparator). Run with -benchtime=1x.
func BenchmarkMultiTenantTrickle(b *testing.B) {
	pool := pgtest.Require(b)
	backlog := 100000
	if v, err := strconv.Atoi(os.Getenv("OUTBOX_BENCH_BACKLOG")); err == nil && v > 0 {
		backlog = v
	}
	const tenants = 20
	rate := 10
	if v, err := strconv.Atoi(os.Getenv("OUTBOX_BENCH_RATE")); err == nil && v >= 0 {
		rate = v // 0: no trickle, the comparator of the drain rate
	}
	for range b.N {
		b.StopTimer()
		tables := make([]string, tenants)
		wakes := map[string]*wakeup.InProcess{}
		for i := range tables {
			schema := fmt.Sprintf("mt_%d_%d", os.Getpid(), i)
			if _, err := pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+schema+` CASCADE; CREATE SCHEMA `+schema); err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _, _ = pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+schema+` CASCADE`) })
			tables[i] = schema + ".watermill_outbox"
			if err := outbox.Migrate(ctx, pool, outbox.SchemaConfig{Table: tables[i]}); err != nil {
				b.Fatal(err)
			}
			wakes[tables[i]] = wakeup.NewInProcess()
		}
		pubs := map[string]*outbox.Publisher{}
		for _, tb := range tables {
			w := wakes[tb]
			p, err := outbox.NewPublisher(pool, outbox.PublisherConfig{Schema: outbox.SchemaConfig{Table: tb}, OnInserted: func(topics []string) { w.Signal(topics...) }}, nil)
			if err != nil {
				b.Fatal(err)
			}
			pubs[tb] = p
		}
		for start := 0; start < backlog; start += 1000 {
			ins := make([]outbox.EventInput, min(1000, backlog-start))
			for i := range ins {
				ins[i] = outbox.EventInput{Topic: "invoices", Payload: map[string]int64{"t": 0}, OrderingKey: "k" + strconv.Itoa((start+i)%50)}
			}
			if _, err := pubs[tables[0]].EnqueueMany(ctx, ins); err != nil {
				b.Fatal(err)
			}
		}
		cfg := outbox.SubscriberConfig{PollInterval: time.Second}
		m, err := outbox.NewMultiSubscriber(pool, outbox.MultiSubscriberConfig{Tables: tables, Subscriber: cfg,
			WakeupFor: func(table string) outbox.Wakeup { return wakes[table] }}, nil)
		if err != nil {
			b.Fatal(err)
		}
		var ch <-chan *message.Message
		if os.Getenv("OUTBOX_BENCH_SINGLE") != "" {
			// Comparator: a plain Subscriber over the backlog table alone.
			one, err := outbox.NewSubscriber(pool, outbox.SubscriberConfig{Schema: outbox.SchemaConfig{Table: tables[0]}, PollInterval: time.Second}, nil)
			if err != nil {
				b.Fatal(err)
			}
			defer one.Close()
			ch, err = one.Subscribe(ctx, "*")
			if err != nil {
				b.Fatal(err)
			}
		} else if ch, err = m.Subscribe(ctx, "*"); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		start := time.Now()
		stop := make(chan struct{})
		var producers sync.WaitGroup
		var sent atomic.Int64
		for _, tb := range tables[1:] {
			if rate == 0 {
				break
			}
			producers.Add(1)
			go func() {
				defer producers.Done()
				tick := time.NewTicker(time.Second / time.Duration(rate))
				defer tick.Stop()
				for {
					select {
					case <-stop:
						return
					case <-tick.C:
						if _, err := pubs[tb].Enqueue(ctx, outbox.EventInput{Topic: "invoices", Payload: map[string]int64{"t": time.Now().UnixNano()}, OrderingKey: "k"}); err != nil {
							b.Error(err)
							return
						}
						sent.Add(1)
					}
				}
			}()
		}
		var lat []time.Duration
		drained := 0
		var drainTook time.Duration
		for drained < backlog {
			msg := <-ch
			var p struct{ T int64 }
			_ = json.Unmarshal(msg.Payload, &p)
			if tb := msg.Metadata.Get(outbox.MetadataTable); tb == tables[0] || tb == "" { // "": the comparator
				if drained++; drained == backlog {
					drainTook = time.Since(start)
				}
			} else {
				lat = append(lat, time.Since(time.Unix(0, p.T)))
			}
			msg.Ack()
		}
		close(stop)
		producers.Wait()
		b.StopTimer()
		_ = m.Close()
		sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
		b.ReportMetric(float64(backlog)/drainTook.Seconds(), "drain-events/s")
		if rate == 0 {
			continue
		}
		if len(lat) == 0 {
			b.Fatal("no trickle event delivered")
		}
		q := func(f float64) float64 {
			return float64(lat[min(len(lat)-1, int(f*float64(len(lat))))].Microseconds()) / 1000
		}
		b.ReportMetric(q(0.5), "p50-ms")
		b.ReportMetric(q(0.99), "p99-ms")
		b.ReportMetric(float64(lat[len(lat)-1].Microseconds())/1000, "max-ms")
		b.ReportMetric(float64(len(lat)), "trickle-events")
		b.Logf("backlog %d drained in %s; %d trickle events sent, %d received during the drain", backlog, drainTook, sent.Load(), len(lat))
	}
}

// TestMultiSubscriberWaitingUsesNoDeliveryTimeout: a consumer that takes 600 ms per message,
// one at a time, over 4 tables of 3 events with DeliveryTimeout 2 s: no event times out while it
// waits for its turn in the merge (only the next message is held, so at most one other message
// is processed while it waits; when each table held one, a message waited for the other three,
// 1.8 s, and its own 600 ms then overran its timeout).
func TestMultiSubscriberWaitingUsesNoDeliveryTimeout(t *testing.T) {
	b := pgBackend(t)
	tables := tenantTables(t, b, 4)
	for _, tb := range tables {
		b.seed(t, outbox.SchemaConfig{Table: tb}, "invoices", 3, []string{""})
	}
	cfg := fastCfg(outbox.SchemaConfig{})
	cfg.DeliveryTimeout = 2 * time.Second
	cfg.LeaseDuration = 10 * time.Second
	m, err := outbox.NewMultiSubscriber(b.db, outbox.MultiSubscriberConfig{Tables: tables, Subscriber: cfg}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	ch, err := m.Subscribe(ctx, "invoices")
	if err != nil {
		t.Fatal(err)
	}
	got := 0
	for got < 12 {
		select {
		case msg := <-ch:
			time.Sleep(600 * time.Millisecond) // a slow destination
			msg.Ack()
			got++
		case <-time.After(30 * time.Second):
			t.Fatalf("%d of 12 messages in 30 s", got)
		}
	}
	for _, tb := range tables {
		pgtest.Eventually(t, 10*time.Second, "all published with no attempt charged", func() bool {
			return b.count(t, fmt.Sprintf(`SELECT count(*) FROM %q WHERE published_at IS NOT NULL AND attempts = 0`, tb)) == 3
		})
	}
}
