package outbox_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/internal/claimlog"
	"github.com/watermill-outbox/outbox/internal/pgtest"
)

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// BenchmarkWritePath: 8 writers, each transaction a business INSERT plus one published event
// (with an ordering key), ours beside watermill-sql v4's publisher (default PostgreSQL schema)
// on the same database in the same run. The two alternate for OUTBOX_BENCH_ROUNDS rounds
// (default 3) so that noise on the shared machine hits both; it reports each one's median
// tx/s and the ratio. OUTBOX_BENCH_TX sets the transactions per round (default 4000).
// Round trips per transaction are equal: BEGIN, business INSERT, one INSERT, COMMIT.
// OUTBOX_BENCH_FILLFACTOR sets SchemaConfig.FillFactor (default: the config's default), here
// and in BenchmarkDrain.
func BenchmarkWritePath(b *testing.B) {
	pool := pgtest.Require(b)
	total := envInt("OUTBOX_BENCH_TX", 4000)
	rounds := envInt("OUTBOX_BENCH_ROUNDS", 3)
	const writers = 8
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS bench_biz (id bigserial PRIMARY KEY, v int)`); err != nil {
		b.Fatal(err)
	}
	run := func(publish func(tx pgx.Tx, i int) error) float64 {
		var next atomic.Int64
		var wg sync.WaitGroup
		start := time.Now()
		for range writers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					i := int(next.Add(1))
					if i > total {
						return
					}
					err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
						if _, err := tx.Exec(ctx, `INSERT INTO bench_biz (v) VALUES ($1)`, i); err != nil {
							return err
						}
						return publish(tx, i)
					})
					if err != nil {
						b.Error(err)
						return
					}
				}
			}()
		}
		wg.Wait()
		return float64(total) / time.Since(start).Seconds()
	}
	schema := outbox.SchemaConfig{Table: pgtest.Table(b), FillFactor: envInt("OUTBOX_BENCH_FILLFACTOR", 0)}
	if err := outbox.Migrate(ctx, pool, schema); err != nil {
		b.Fatal(err)
	}
	ours := func(tx pgx.Tx, i int) error {
		p, err := outbox.NewPublisher(tx, outbox.PublisherConfig{Schema: schema}, nil)
		if err != nil {
			return err
		}
		m := outbox.NewMessage([]byte(`{"order":` + strconv.Itoa(i) + `}`))
		outbox.SetOrderingKey(m, "customer-"+strconv.Itoa(i%1000))
		return p.Publish("orders", m)
	}
	topic := "wmbench_" + strconv.Itoa(os.Getpid())
	b.Cleanup(func() { pool.Exec(ctx, fmt.Sprintf(`DROP TABLE IF EXISTS "watermill_%s"`, topic)) })
	init, _ := wmsql.NewPublisher(wmsql.BeginnerFromPgx(pool), wmsql.PublisherConfig{SchemaAdapter: wmsql.DefaultPostgreSQLSchema{}, AutoInitializeSchema: true}, nil)
	if err := init.Publish(topic, message.NewMessage(watermill.NewUUID(), []byte(`{}`))); err != nil {
		b.Fatal(err)
	}
	theirs := func(tx pgx.Tx, i int) error {
		p, err := wmsql.NewPublisher(wmsql.TxFromPgx(tx), wmsql.PublisherConfig{SchemaAdapter: wmsql.DefaultPostgreSQLSchema{}}, nil)
		if err != nil {
			return err
		}
		return p.Publish(topic, message.NewMessage(watermill.NewUUID(), []byte(`{"order":`+strconv.Itoa(i)+`}`)))
	}
	for range b.N {
		var a, w []float64
		for range rounds {
			a = append(a, run(ours))
			w = append(w, run(theirs))
		}
		sort.Float64s(a)
		sort.Float64s(w)
		b.ReportMetric(a[len(a)/2], "outbox-tx/s")
		b.ReportMetric(w[len(w)/2], "watermill-sql-tx/s")
		b.ReportMetric(a[len(a)/2]/w[len(w)/2], "ratio")
	}
}

// drainShape is a backlog shape: keys = 0 means unordered.
type drainShape struct {
	name string
	keys int
}

// seedBacklog writes n pending events straight with SQL (the write path is measured above).
func seedBacklog(b *testing.B, pool *pgxpool.Pool, table string, n, keys int) {
	b.Helper()
	seedRows(b, pool, table, n, keys, "NULL")
}

// uuidV7SQL generates an RFC 9562 UUIDv7 in SQL (PostgreSQL 15 has no uuidv7()): the
// publisher's event ids are UUIDv7, time-ordered like the sequence, so seeded rows must be too —
// random (v4) ids spread every claim's and mark's index entries over the whole id index, a cost
// real outbox tables do not have (5M rows of history: 0.71× with v4 ids).
const uuidV7SQL = `(lpad(to_hex((extract(epoch FROM clock_timestamp()) * 1000)::bigint), 12, '0') || '7' || substr(md5(random()::text), 1, 3) || to_hex(8 + floor(random() * 4)::int) || substr(md5(random()::text), 1, 15))::uuid`

// seedRows inserts n events with published_at set to publishedAt (SQL text); ids are UUIDv7.
func seedRows(b *testing.B, pool *pgxpool.Pool, table string, n, keys int, publishedAt string) {
	b.Helper()
	key := "NULL"
	if keys > 0 {
		key = fmt.Sprintf("'k' || (g %% %d)", keys)
	}
	_, err := pool.Exec(ctx, fmt.Sprintf(`INSERT INTO %q (id, topic, payload, ordering_key, published_at) SELECT %s, 'bench', '{"n":1}', %s, %s FROM generate_series(1, %d) g`, table, uuidV7SQL, key, publishedAt, n))
	if err != nil {
		b.Fatal(err)
	}
	pool.Exec(ctx, fmt.Sprintf(`VACUUM ANALYZE %q`, table))
	// Flush the seed's dirty pages now, so that a checkpoint the seed's WAL triggered does not
	// run during the timed drain (5M rows of history write about 2 GB of WAL).
	pool.Exec(ctx, `CHECKPOINT`)
}

// drain runs drainRate and reports its events/s. The caller has stopped the timer.
func drain(b *testing.B, db any, schema outbox.SchemaConfig, n, relays int, pending func() int) {
	b.StartTimer()
	rate := drainRate(b, db, schema, n, relays, pending)
	b.StopTimer()
	b.ReportMetric(rate, "events/s")
}

// drainRate runs relays Subscribers on db (BatchSize 1000, MaxRunPerKey 100, Concurrency 100, 10 ms
// poll) with a handler that acks at once until n events are delivered and marked published
// (Hooks.OnDelivered runs once the mark statement returned), and returns events/s. Then,
// untimed, pending() must report 0: counting unpublished rows scans the whole table, about
// 0.4 s per count with 5M rows of history, which polling it inside the timed part added to
// the drain.
func drainRate(b *testing.B, db any, schema outbox.SchemaConfig, n, relays int, pending func() int) float64 {
	start := time.Now()
	var marked atomic.Int64
	done := make(chan struct{})
	var subs []*outbox.Subscriber
	polls := &claimlog.Log{}
	if os.Getenv("OUTBOX_BENCH_TRACE") != "" {
		polls.Print = os.Stderr
	}
	defer func() {
		n, perClaim, ms := polls.Summary()
		b.Logf("%d claims, %.1f events per claim, %.2f ms per claim", n, perClaim, ms)
	}()
	hooks := outbox.Hooks{OnDelivered: func(outbox.DeliveredInfo) {
		if marked.Add(1) == int64(n) {
			close(done)
		}
	}}
	for r := range relays {
		sub, err := outbox.NewSubscriber(db, outbox.SubscriberConfig{Schema: schema, BatchSize: 1000, MaxRunPerKey: 100, Concurrency: 100, KeyScan: envInt("OUTBOX_BENCH_KEYSCAN", 0), SyncCommit: os.Getenv("OUTBOX_BENCH_SYNC_COMMIT") != "",
			PollInterval: 10 * time.Millisecond, RelayName: fmt.Sprintf("bench-%d", r), Hooks: hooks}, polls)
		if err != nil {
			b.Fatal(err)
		}
		subs = append(subs, sub)
		ch, _ := sub.Subscribe(context.Background(), "bench")
		go func() {
			for msg := range ch {
				msg.Ack()
			}
		}()
	}
	select {
	case <-done:
	case <-time.After(10 * time.Minute):
		b.Fatalf("%d of %d events marked within 10 minutes", marked.Load(), n)
	}
	rate := float64(n) / time.Since(start).Seconds()
	for _, s := range subs {
		s.Close()
	}
	if left := pending(); left != 0 {
		b.Fatalf("%d events left unpublished after %d were marked delivered", left, n)
	}
	return rate
}

// BenchmarkDrain drains a backlog into an in-memory handler that acks at once: ours at
// BatchSize 1000 for several backlog shapes with one and two relays, beside two comparators on
// the same database — a raw pgx lease-1000/mark loop (order-blind) with one and two relays,
// and watermill-sql v4's subscriber (batch 1000, 10 ms poll).
//
// The machine's speed drifts by ±25 % within minutes, so the variants are interleaved: each
// of OUTBOX_BENCH_ROUNDS rounds (default 3) drains a fresh backlog (seeded, then VACUUM
// ANALYZE and CHECKPOINT) with every variant, in reverse order every other round, and the
// benchmark reports each variant's median events/s and the ratios of the medians (ours ÷ raw
// at 1 and 2 relays, ours ÷ watermill-sql, 2 relays ÷ 1, each keyed shape ÷ unordered), also
// printed as a table.
//
// OUTBOX_BENCH_EVENTS sets the backlog (default 100000); OUTBOX_BENCH_HISTORY adds that many
// published rows first (e.g. 5000000); OUTBOX_BENCH_SHAPE runs one shape only (unordered,
// 1000keys, distinctkeys, 10hotkeys) besides the comparators; OUTBOX_BENCH_KEYSCAN sets
// SubscriberConfig.KeyScan; OUTBOX_BENCH_SYNC_COMMIT=1 sets SubscriberConfig.SyncCommit;
// OUTBOX_BENCH_TRACE=1 prints every claim (time, token, events, duration) to stderr.
//
//	go test -run '^$' -bench 'BenchmarkDrain$' -benchtime 1x -timeout 60m .
func BenchmarkDrain(b *testing.B) {
	pool := pgtest.Require(b)
	n := envInt("OUTBOX_BENCH_EVENTS", 100000)
	history := envInt("OUTBOX_BENCH_HISTORY", 0)
	rounds := envInt("OUTBOX_BENCH_ROUNDS", 3)
	shapes := []drainShape{{"unordered", 0}, {"1000keys", 1000}, {"distinctkeys", n}, {"10hotkeys", 10}}
	if only := os.Getenv("OUTBOX_BENCH_SHAPE"); only != "" {
		shapes = slices.DeleteFunc(shapes, func(s drainShape) bool { return s.name != only })
	}
	fresh := func(keys int) outbox.SchemaConfig {
		schema := outbox.SchemaConfig{Table: pgtest.Table(b), FillFactor: envInt("OUTBOX_BENCH_FILLFACTOR", 0)}
		if err := outbox.Migrate(ctx, pool, schema); err != nil {
			b.Fatal(err)
		}
		if history > 0 {
			seedRows(b, pool, schema.Table, history, 0, "now()")
		}
		seedBacklog(b, pool, schema.Table, n, keys)
		return schema
	}
	drop := func(table string) { pool.Exec(ctx, fmt.Sprintf(`DROP TABLE IF EXISTS %q`, table)) }
	var variants []benchVariant
	for _, sh := range shapes {
		for _, relays := range []int{1, 2} {
			variants = append(variants, benchVariant{fmt.Sprintf("outbox/%s/relays=%d", sh.name, relays), func() float64 {
				schema := fresh(sh.keys)
				defer drop(schema.Table)
				return drainRate(b, pool, schema, n, relays, func() int {
					var left int
					pool.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM %q WHERE published_at IS NULL`, schema.Table)).Scan(&left)
					return left
				})
			}})
		}
	}
	for _, relays := range []int{1, 2} {
		variants = append(variants, benchVariant{fmt.Sprintf("rawpgx/unordered/relays=%d", relays), func() float64 {
			schema := fresh(0)
			defer drop(schema.Table)
			return rawDrain(b, pool, schema.Table, n, relays)
		}})
	}
	variants = append(variants, benchVariant{"watermill-sql/unordered/relays=1", func() float64 { return watermillSQLDrain(b, pool, n) }})

	med := runInterleaved(b, rounds, variants)
	var table strings.Builder
	fmt.Fprintf(&table, "\nmedians of %d interleaved rounds, %d events each:\n", rounds, n)
	fmt.Fprintf(&table, "%-34s %10s\n", "variant", "events/s")
	for _, v := range variants {
		fmt.Fprintf(&table, "%-34s %10.0f\n", v.name, med(v.name))
		b.ReportMetric(med(v.name), strings.NewReplacer("/", "-", "relays=", "r").Replace(v.name)+"-ev/s")
	}
	raw1, raw2, wm := med("rawpgx/unordered/relays=1"), med("rawpgx/unordered/relays=2"), med("watermill-sql/unordered/relays=1")
	unordered1, unordered2 := med("outbox/unordered/relays=1"), med("outbox/unordered/relays=2")
	for _, sh := range shapes {
		o1, o2 := med(fmt.Sprintf("outbox/%s/relays=1", sh.name)), med(fmt.Sprintf("outbox/%s/relays=2", sh.name))
		type ratio struct {
			name string
			v    float64
		}
		ratios := []ratio{{"÷raw-r1", o1 / raw1}, {"÷raw-r2", o2 / raw2}, {"÷watermill-sql", o1 / wm}, {"r2÷r1", o2 / o1}}
		if sh.keys > 0 && unordered1 > 0 {
			ratios = append(ratios, ratio{"÷unordered-r1", o1 / unordered1}, ratio{"÷unordered-r2", o2 / unordered2})
		}
		fmt.Fprintf(&table, "%-14s", sh.name)
		for _, r := range ratios {
			fmt.Fprintf(&table, "  %s %.2f", r.name, r.v)
			b.ReportMetric(r.v, sh.name+r.name)
		}
		table.WriteString("\n")
	}
	b.Log(table.String())
}

// benchVariant is one contender of an interleaved benchmark: run drains a fresh backlog once
// and returns events/s.
type benchVariant struct {
	name string
	run  func() float64
}

// runInterleaved runs every variant once per round, b.N × rounds times, in reverse order every
// other round (so that the machine's drift hits all alike), logs each result, and returns the
// median events/s of a variant by name (0 for one that never ran).
func runInterleaved(b *testing.B, rounds int, variants []benchVariant) (median func(name string) float64) {
	results := map[string][]float64{}
	for range b.N {
		for r := range rounds {
			order := slices.Clone(variants)
			if r%2 == 1 {
				slices.Reverse(order)
			}
			for _, v := range order {
				rate := v.run()
				results[v.name] = append(results[v.name], rate)
				b.Logf("round %d %-34s %8.0f events/s", r+1, v.name, rate)
			}
		}
	}
	return func(name string) float64 {
		xs := slices.Clone(results[name])
		if len(xs) == 0 {
			return 0
		}
		slices.Sort(xs)
		return xs[len(xs)/2]
	}
}

// rawDrain drains table with relays goroutines running the order-blind comparator: lease the
// oldest 1,000 claimable rows with FOR UPDATE SKIP LOCKED (through a pending index of its own),
// then mark them in one UPDATE.
// Returns events/s.
func rawDrain(b *testing.B, pool *pgxpool.Pool, table string, n, relays int) float64 {
	// The index a hand-written loop on this table would have: without it the lease walks the
	// primary key through every row already published (14k buffers per lease halfway through
	// a 100k drain, 1.2–1.4k with it; see rawIndex in cmd/outbox), and the loop slows as it
	// drains. Built before the timed part, then flushed like the seed.
	if _, err := pool.Exec(ctx, fmt.Sprintf(`CREATE INDEX %q ON %q ("sequence") WHERE "published_at" IS NULL AND "dead_lettered_at" IS NULL`, table+"_raw_pending_idx", table)); err != nil {
		b.Fatal(err)
	}
	pool.Exec(ctx, `CHECKPOINT`)
	start := time.Now()
	claim := fmt.Sprintf(`UPDATE %[1]q SET lease_until = now() + interval '60 seconds', leased_by = $1 WHERE sequence IN (
		SELECT sequence FROM %[1]q WHERE published_at IS NULL AND dead_lettered_at IS NULL AND (lease_until IS NULL OR lease_until < now())
		ORDER BY sequence LIMIT 1000 FOR UPDATE SKIP LOCKED) RETURNING sequence, id, topic, payload, headers`, table)
	mark := fmt.Sprintf(`UPDATE %q SET published_at = now(), lease_until = NULL, leased_by = NULL WHERE sequence = ANY($1)`, table)
	var wg sync.WaitGroup
	var done atomic.Int64
	for r := range relays {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				rows, err := pool.Query(ctx, claim, pgx.QueryExecModeExec, strconv.Itoa(r))
				if err != nil {
					b.Error(err)
					return
				}
				var seqs []int64
				for rows.Next() {
					var seq int64
					var id, topic string
					var payload, headers []byte
					rows.Scan(&seq, &id, &topic, &payload, &headers)
					seqs = append(seqs, seq)
				}
				rows.Close()
				if len(seqs) == 0 {
					return
				}
				if _, err := pool.Exec(ctx, mark, pgx.QueryExecModeExec, seqs); err != nil {
					b.Error(err)
					return
				}
				done.Add(int64(len(seqs)))
			}
		}()
	}
	wg.Wait()
	rate := float64(n) / time.Since(start).Seconds()
	if got := done.Load(); got != int64(n) {
		b.Fatalf("raw loop marked %d events, want %d", got, n)
	}
	return rate
}

// watermillSQLDrain publishes n messages with watermill-sql v4's publisher (untimed; then
// VACUUM ANALYZE and CHECKPOINT), then times its subscriber (batch 1000, 10 ms poll) receiving
// and acking all of them. Returns events/s.
func watermillSQLDrain(b *testing.B, pool *pgxpool.Pool, n int) float64 {
	topic := fmt.Sprintf("wmdrain_%d_%d", os.Getpid(), time.Now().UnixNano())
	defer pool.Exec(ctx, fmt.Sprintf(`DROP TABLE IF EXISTS "watermill_%s"; DROP TABLE IF EXISTS "watermill_offsets_%s"`, topic, topic))
	schemaAdapter := wmsql.DefaultPostgreSQLSchema{SubscribeBatchSize: 1000}
	pub, _ := wmsql.NewPublisher(wmsql.BeginnerFromPgx(pool), wmsql.PublisherConfig{SchemaAdapter: schemaAdapter, AutoInitializeSchema: true}, nil)
	wmPublish(b, pub, topic, n)
	pool.Exec(ctx, fmt.Sprintf(`VACUUM ANALYZE "watermill_%s"`, topic))
	pool.Exec(ctx, `CHECKPOINT`)
	sub, err := wmsql.NewSubscriber(wmsql.BeginnerFromPgx(pool), wmsql.SubscriberConfig{
		SchemaAdapter: schemaAdapter, OffsetsAdapter: wmsql.DefaultPostgreSQLOffsetsAdapter{},
		InitializeSchema: true, PollInterval: 10 * time.Millisecond,
	}, nil)
	if err != nil {
		b.Fatal(err)
	}
	return wmDrain(b, sub, topic, n)
}

// wmPublish publishes n messages {"n":1} on topic, 1,000 per call.
func wmPublish(b *testing.B, pub message.Publisher, topic string, n int) {
	for start := 0; start < n; start += 1000 {
		msgs := make([]*message.Message, 0, 1000)
		for range min(1000, n-start) {
			msgs = append(msgs, message.NewMessage(watermill.NewUUID(), []byte(`{"n":1}`)))
		}
		if err := pub.Publish(topic, msgs...); err != nil {
			b.Fatal(err)
		}
	}
}

// wmDrain times sub receiving and acking n messages of topic, closes it and returns events/s.
func wmDrain(b *testing.B, sub message.Subscriber, topic string, n int) float64 {
	defer sub.Close()
	start := time.Now()
	ch, err := sub.Subscribe(context.Background(), topic)
	if err != nil {
		b.Fatal(err)
	}
	for range n {
		msg := <-ch
		msg.Ack()
	}
	return float64(n) / time.Since(start).Seconds()
}

// enqueueBacklog writes n events on topic "bench" through pub, 1,000 per call, round-robin over
// the ordering keys "k0" … "k<keys-1>" (keys 0: unordered).
func enqueueBacklog(b *testing.B, pub *outbox.Publisher, n, keys int) {
	for start := 0; start < n; start += 1000 {
		ins := make([]outbox.EventInput, 0, 1000)
		for i := start; i < min(n, start+1000); i++ {
			in := outbox.EventInput{Topic: "bench", Payload: map[string]int{"n": i}}
			if keys > 0 {
				in.OrderingKey = fmt.Sprintf("k%d", i%keys)
			}
			ins = append(ins, in)
		}
		if _, err := pub.EnqueueMany(ctx, ins); err != nil {
			b.Fatal(err)
		}
	}
}
