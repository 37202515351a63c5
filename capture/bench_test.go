package capture_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/capture"
	"github.com/watermill-outbox/outbox/internal/pgtest"
)

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

func median(xs []float64) float64 {
	sort.Float64s(xs)
	return xs[len(xs)/2]
}

// benchSetup migrates a fresh outbox table and creates tables (id int PRIMARY KEY, status
// text, amount int) with rows 1..rows each.
func benchSetup(b *testing.B, pool *pgxpool.Pool, rows int, names ...*string) outbox.SchemaConfig {
	schema := outbox.SchemaConfig{Table: pgtest.Table(b)}
	if err := outbox.Migrate(ctx, pool, schema); err != nil {
		b.Fatal(err)
	}
	for _, n := range names {
		*n = pgtest.Table(b)
		if _, err := pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE %[1]s (id int PRIMARY KEY, status text NOT NULL, amount int NOT NULL);
			INSERT INTO %[1]s SELECT g, 'new', 0 FROM generate_series(1, %[2]d) g; ANALYZE %[1]s`, *n, rows)); err != nil {
			b.Fatal(err)
		}
	}
	return schema
}

// BenchmarkOneRowUpdate: 8 writers, each transaction one business UPDATE of a random row of
// 10,000. Captured: the trigger writes the event. Published: the same UPDATE on an uncaptured
// twin table, then Publish of the equivalent event (the same envelope shape and ordering
// key) — one more round trip. Rounds alternate (OUTBOX_BENCH_ROUNDS, default 3; OUTBOX_BENCH_TX
// transactions each, default 4000); it reports the median tx/s of each and their ratio.
func BenchmarkOneRowUpdate(b *testing.B) {
	pool := pgtest.Require(b)
	total, rounds := envInt("OUTBOX_BENCH_TX", 4000), envInt("OUTBOX_BENCH_ROUNDS", 3)
	const writers, rows = 8, 10000
	var captured, plain string
	schema := benchSetup(b, pool, rows, &captured, &plain)
	if err := capture.Install(ctx, pool, schema, capture.Table{Name: captured}); err != nil {
		b.Fatal(err)
	}
	run := func(write func(tx pgx.Tx, id, i int) error) float64 {
		var next atomic.Int64
		var wg sync.WaitGroup
		start := time.Now()
		for w := range writers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rnd := rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
				for {
					i := int(next.Add(1))
					if i > total {
						return
					}
					if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return write(tx, 1+rnd.IntN(rows), i) }); err != nil {
						b.Error(err)
						return
					}
				}
			}()
		}
		wg.Wait()
		return float64(total) / time.Since(start).Seconds()
	}
	byTrigger := func(tx pgx.Tx, id, i int) error {
		_, err := tx.Exec(ctx, fmt.Sprintf(`UPDATE %s SET amount = $1 WHERE id = $2`, captured), i, id)
		return err
	}
	byPublish := func(tx pgx.Tx, id, i int) error {
		var status string
		if err := tx.QueryRow(ctx, fmt.Sprintf(`UPDATE %s SET amount = $1 WHERE id = $2 RETURNING status`, plain), i, id).Scan(&status); err != nil {
			return err
		}
		p, err := outbox.NewPublisher(tx, outbox.PublisherConfig{Schema: schema}, nil)
		if err != nil {
			return err
		}
		_, err = p.Enqueue(ctx, outbox.EventInput{Topic: plain + ".updated", OrderingKey: plain + ":" + strconv.Itoa(id), Payload: map[string]any{
			"table": "public." + plain, "operation": "updated", "pk": id, "changed": []string{"amount"},
			"after": map[string]any{"id": id, "status": status, "amount": i}, "occurred_at": time.Now().UTC().Format("2006-01-02T15:04:05.000000+00:00")}})
		return err
	}
	for range b.N {
		var c, p []float64
		for range rounds {
			c = append(c, run(byTrigger))
			p = append(p, run(byPublish))
		}
		mc, mp := median(c), median(p)
		b.ReportMetric(mc, "captured-tx/s")
		b.ReportMetric(mp, "published-tx/s")
		b.ReportMetric(mc/mp, "ratio")
	}
}

// BenchmarkBulkUpdate: one UPDATE of every row of a 100,000-row table (OUTBOX_BENCH_ROWS),
// captured (100,000 events written by the trigger) against the same UPDATE of an uncaptured
// twin table alone ("plain", the comparator) and followed, in the same transaction, by
// EnqueueMany of the 100,000 equivalent events in calls of 1,000 ("published": what writing
// the same events costs without capture). The published events carry no ordering key: with
// one key per row the Publisher's per-key locks (100,000 in one transaction) exhaust
// PostgreSQL's shared lock table ("out of shared memory"), so this comparator is a lower bound. Rounds alternate (OUTBOX_BENCH_ROUNDS, default 3);
// it reports the median seconds of each and the ratios captured/plain and
// captured/published (lower is better).
func BenchmarkBulkUpdate(b *testing.B) {
	pool := pgtest.Require(b)
	rows, rounds := envInt("OUTBOX_BENCH_ROWS", 100000), envInt("OUTBOX_BENCH_ROUNDS", 3)
	var captured, plain string
	schema := benchSetup(b, pool, rows, &captured, &plain)
	if err := capture.Install(ctx, pool, schema, capture.Table{Name: captured}); err != nil {
		b.Fatal(err)
	}
	run := func(table string, round int, publish bool) float64 {
		// An empty outbox and a vacuumed table first, so every run starts alike.
		if _, err := pool.Exec(ctx, fmt.Sprintf(`TRUNCATE %q`, schema.Table)); err != nil {
			b.Fatal(err)
		}
		if _, err := pool.Exec(ctx, fmt.Sprintf(`VACUUM %s`, table)); err != nil {
			b.Fatal(err)
		}
		status := "round-" + strconv.Itoa(round)
		start := time.Now()
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			tag, err := tx.Exec(ctx, fmt.Sprintf(`UPDATE %s SET amount = amount + 1, status = $1`, table), status)
			if err != nil || tag.RowsAffected() != int64(rows) {
				return fmt.Errorf("update: %v (%d rows)", err, tag.RowsAffected())
			}
			if !publish {
				return nil
			}
			p, err := outbox.NewPublisher(tx, outbox.PublisherConfig{Schema: schema}, nil)
			if err != nil {
				return err
			}
			at := time.Now().UTC().Format("2006-01-02T15:04:05.000000+00:00")
			ins := make([]outbox.EventInput, 0, 1000)
			for id := 1; id <= rows; id++ {
				ins = append(ins, outbox.EventInput{Topic: table + ".updated", Payload: map[string]any{
					"table": "public." + table, "operation": "updated", "pk": id, "changed": []string{"status", "amount"},
					"after": map[string]any{"id": id, "status": status, "amount": round}, "occurred_at": at}})
				if len(ins) == cap(ins) || id == rows {
					if _, err := p.EnqueueMany(ctx, ins); err != nil {
						return err
					}
					ins = ins[:0]
				}
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
		took := time.Since(start).Seconds()
		want := 0
		if publish || table == captured {
			want = rows
		}
		var n int
		if err := pool.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM %q`, schema.Table)).Scan(&n); err != nil || n != want {
			b.Fatalf("%d events, want %d (%v)", n, want, err)
		}
		return took
	}
	for range b.N {
		var c, p, pub []float64
		for r := range rounds {
			c = append(c, run(captured, r, false))
			p = append(p, run(plain, 2*r, false))
			pub = append(pub, run(plain, 2*r+1, true))
		}
		mc, mp, mpub := median(c), median(p), median(pub)
		b.ReportMetric(mc, "captured-s")
		b.ReportMetric(mp, "plain-s")
		b.ReportMetric(mpub, "published-s")
		b.ReportMetric(mc/mp, "ratio")
		b.ReportMetric(mc/mpub, "ratio-vs-published")
	}
}

// BenchmarkDrainCaptured: the relay drains a backlog of captured events (OUTBOX_BENCH_EVENTS,
// default 20,000: 20 updates of each of 1,000 rows, default ordering key per row) and an
// equal backlog of published events of the same keys, payloads and order, each from its own
// outbox table, into a handler that acks at once. Rounds (OUTBOX_BENCH_ROUNDS, default 2)
// alternate which drains first; it reports the total events/s of each and the ratio
// captured/published.
func BenchmarkDrainCaptured(b *testing.B) {
	pool := pgtest.Require(b)
	n, rounds := envInt("OUTBOX_BENCH_EVENTS", 20000), envInt("OUTBOX_BENCH_ROUNDS", 2)
	const keys = 1000
	backlogs := func() (captured, published outbox.SchemaConfig, events int) {
		var table string
		captured = benchSetup(b, pool, keys, &table)
		if err := capture.Install(ctx, pool, captured, capture.Table{Name: table}); err != nil {
			b.Fatal(err)
		}
		for r := 0; r < n/keys; r++ {
			if _, err := pool.Exec(ctx, fmt.Sprintf(`UPDATE %s SET amount = amount + 1`, table)); err != nil {
				b.Fatal(err)
			}
		}
		published = outbox.SchemaConfig{Table: pgtest.Table(b)}
		if err := outbox.Migrate(ctx, pool, published); err != nil {
			b.Fatal(err)
		}
		// The published backlog: the captured rows' payloads and keys in sequence order,
		// inserted by the Publisher in batches of 1,000.
		rows, err := pool.Query(ctx, fmt.Sprintf(`SELECT payload::text, ordering_key FROM %q ORDER BY sequence`, captured.Table))
		if err != nil {
			b.Fatal(err)
		}
		var ins []outbox.EventInput
		for rows.Next() {
			var payload, key string
			if err := rows.Scan(&payload, &key); err != nil {
				b.Fatal(err)
			}
			ins = append(ins, outbox.EventInput{Topic: table + ".updated", OrderingKey: key, Payload: []byte(payload)})
		}
		rows.Close()
		p, err := outbox.NewPublisher(pool, outbox.PublisherConfig{Schema: published}, nil)
		if err != nil {
			b.Fatal(err)
		}
		for i := 0; i < len(ins); i += 1000 {
			if _, err := p.EnqueueMany(ctx, ins[i:min(i+1000, len(ins))]); err != nil {
				b.Fatal(err)
			}
		}
		for _, t := range []string{captured.Table, published.Table} {
			if _, err := pool.Exec(ctx, fmt.Sprintf(`VACUUM ANALYZE %q`, t)); err != nil {
				b.Fatal(err)
			}
		}
		return captured, published, len(ins)
	}
	drain := func(schema outbox.SchemaConfig, events int) time.Duration {
		sub, err := outbox.NewSubscriber(pool, outbox.SubscriberConfig{Schema: schema, BatchSize: 1000, MaxRunPerKey: 100, Concurrency: 100, PollInterval: 10 * time.Millisecond}, nil)
		if err != nil {
			b.Fatal(err)
		}
		defer sub.Close()
		sctx, cancel := context.WithCancel(ctx)
		defer cancel()
		start := time.Now()
		ch, err := sub.Subscribe(sctx, "*")
		if err != nil {
			b.Fatal(err)
		}
		for range events {
			(<-ch).Ack()
		}
		return time.Since(start)
	}
	for range b.N {
		var tc, tp time.Duration
		events := 0
		for r := range rounds {
			c, p, m := backlogs()
			if r%2 == 0 {
				tc += drain(c, m)
				tp += drain(p, m)
			} else {
				tp += drain(p, m)
				tc += drain(c, m)
			}
			events += m
		}
		ec, ep := float64(events)/tc.Seconds(), float64(events)/tp.Seconds()
		b.ReportMetric(ec, "captured-events/s")
		b.ReportMetric(ep, "published-events/s")
		b.ReportMetric(ec/ep, "ratio")
	}
}
