package wal_test

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/capture"
	"github.com/watermill-outbox/outbox/capture/wal"
	"github.com/watermill-outbox/outbox/forwarder"
	"github.com/watermill-outbox/outbox/forwarder/kafka"
	"github.com/watermill-outbox/outbox/internal/brokertest"
)

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

func median(xs []float64) float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	return s[len(s)/2]
}

// counter is a no-op destination that counts messages and, when lat is set, records each
// message's commit→delivery delay from its envelope's occurred_at (the commit time).
type counter struct {
	n   atomic.Int64
	mu  sync.Mutex
	lat []time.Duration
	rec bool
}

func (c *counter) Publish(_ string, msgs ...*message.Message) error {
	if c.rec {
		now := time.Now()
		c.mu.Lock()
		for _, m := range msgs {
			ch, err := capture.Decode(m)
			if err != nil {
				c.mu.Unlock()
				return err
			}
			c.lat = append(c.lat, now.Sub(ch.OccurredAt))
		}
		c.mu.Unlock()
	}
	c.n.Add(int64(len(msgs)))
	return nil
}

func (c *counter) Close() error { return nil }

// benchTable creates table name (id int PRIMARY KEY, status text, amount int) with rows.
func benchTable(b *testing.B, pool *pgxpool.Pool, name string, rows int) {
	exec(b, pool, fmt.Sprintf(`CREATE TABLE %[1]s (id int PRIMARY KEY, status text NOT NULL, amount int NOT NULL);
		INSERT INTO %[1]s SELECT g, 'new', 0 FROM generate_series(1, %[2]d) g; ANALYZE %[1]s`, name, rows))
}

// BenchmarkWALBulkUpdate: one UPDATE of every row of a 100,000-row table (OUTBOX_BENCH_ROWS),
// timed to COMMIT, on a private server with wal_level = logical: plain (no capture), WAL (the
// table in the source's publication with REPLICA IDENTITY FULL, the source running and
// delivering to a no-op destination), and trigger (capture.Install). Rounds alternate
// (OUTBOX_BENCH_ROUNDS, default 3); it reports the median seconds of each, the ratios wal/plain
// and trigger/plain, and the median seconds from COMMIT until the source delivered the
// 100,000th change (wal-drain-s).
func BenchmarkWALBulkUpdate(b *testing.B) {
	_, pool := logicalPG(b)
	rows, rounds := envInt("OUTBOX_BENCH_ROWS", 100000), envInt("OUTBOX_BENCH_ROUNDS", 3)
	for _, t := range []string{"plain", "walt", "trig"} {
		benchTable(b, pool, t, rows)
	}
	trigSchema := outbox.SchemaConfig{Table: "trigger_outbox"}
	if err := outbox.Migrate(ctx, pool, trigSchema); err != nil {
		b.Fatal(err)
	}
	if err := capture.Install(ctx, pool, trigSchema, capture.Table{Name: "trig"}); err != nil {
		b.Fatal(err)
	}
	tables := []capture.Table{{Name: "walt"}}
	if err := wal.Setup(ctx, pool, wal.Config{Tables: tables}); err != nil {
		b.Fatal(err)
	}
	dest := &counter{}
	src, err := wal.New(pool, wal.Config{Tables: tables, Destination: dest, Concurrency: 16})
	if err != nil {
		b.Fatal(err)
	}
	stop := run(b, src)
	defer stop()
	update := func(table string, round int) float64 {
		exec(b, pool, `TRUNCATE trigger_outbox`, `VACUUM `+table)
		start := time.Now()
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			tag, err := tx.Exec(ctx, fmt.Sprintf(`UPDATE %s SET amount = amount + 1, status = $1`, table), "round-"+strconv.Itoa(round))
			if err == nil && tag.RowsAffected() != int64(rows) {
				err = fmt.Errorf("%d rows", tag.RowsAffected())
			}
			return err
		})
		if err != nil {
			b.Fatal(err)
		}
		return time.Since(start).Seconds()
	}
	for range b.N {
		var p, w, tr, drain []float64
		for r := range rounds {
			p = append(p, update("plain", r))
			before := dest.n.Load()
			w = append(w, update("walt", r))
			commit := time.Now()
			waitFor(b, 10*time.Minute, "the WAL source to deliver the update", func() bool { return dest.n.Load() == before+int64(rows) })
			drain = append(drain, time.Since(commit).Seconds())
			tr = append(tr, update("trig", r))
		}
		mp, mw, mt := median(p), median(w), median(tr)
		b.ReportMetric(mp, "plain-s")
		b.ReportMetric(mw, "wal-s")
		b.ReportMetric(mt, "trigger-s")
		b.ReportMetric(mw/mp, "wal/plain")
		b.ReportMetric(mt/mp, "trigger/plain")
		b.ReportMetric(median(drain), "wal-drain-s")
		b.Logf("plain %v, wal %v, trigger %v, wal drain after commit %v", p, w, tr, drain)
	}
}

// BenchmarkWALThroughput: a backlog of OUTBOX_BENCH_EVENTS (default 20,000) changes — 20
// UPDATEs of every row of a 1,000-row table, one ordering key per row — drained into a no-op
// destination by the WAL source (from its slot) and by the polling relay (the same payloads,
// keys and order published into the outbox table), settings as capture's
// BenchmarkDrainCaptured. Rounds (OUTBOX_BENCH_ROUNDS, default 2) alternate which drains first;
// it reports each side's events/s and the ratio wal/relay. OUTBOX_BENCH_DEST=kafka drains into
// an in-process kfake cluster (8 partitions) through forwarder/kafka instead, the relay through
// a forwarder.Forwarder (PublishBatch per claimed batch), the WAL source through PublishBatch per
// batch.
func BenchmarkWALThroughput(b *testing.B) {
	kafkaDest := os.Getenv("OUTBOX_BENCH_DEST") == "kafka"
	newKafka := func() *kafka.Publisher {
		c := brokertest.Kafka(b, kfake.SeedTopics(8, "walt.updated"))
		pub, err := kafka.NewPublisher(kafka.Config{Brokers: c.ListenAddrs()}, nil)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = pub.Close() })
		return pub
	}
	_, pool := logicalPG(b)
	n, rounds := envInt("OUTBOX_BENCH_EVENTS", 20000), envInt("OUTBOX_BENCH_ROUNDS", 2)
	const keys = 1000
	benchTable(b, pool, "walt", keys)
	tables := []capture.Table{{Name: "walt"}}
	cfg := wal.Config{Tables: tables}
	// backlog makes a fresh slot, writes the changes behind it and publishes their envelopes
	// into a fresh outbox table in the same order.
	backlog := func(round int) outbox.SchemaConfig {
		if err := wal.Drop(ctx, pool, cfg); err != nil {
			b.Fatal(err)
		}
		if err := wal.Setup(ctx, pool, cfg); err != nil {
			b.Fatal(err)
		}
		for range n / keys {
			exec(b, pool, `UPDATE walt SET amount = amount + 1`)
		}
		schema := outbox.SchemaConfig{Table: fmt.Sprintf("relay_outbox_%d", round)}
		if err := outbox.Migrate(ctx, pool, schema); err != nil {
			b.Fatal(err)
		}
		p, err := outbox.NewPublisher(pool, outbox.PublisherConfig{Schema: schema}, nil)
		if err != nil {
			b.Fatal(err)
		}
		var ins []outbox.EventInput
		for u := range n / keys {
			for id := 1; id <= keys; id++ {
				ins = append(ins, outbox.EventInput{Topic: "walt.updated", OrderingKey: "walt:" + strconv.Itoa(id), Payload: []byte(fmt.Sprintf(
					`{"table":"public.walt","operation":"updated","pk":%d,"changed":["amount"],"occurred_at":"2026-12-06T10:00:00.000000+00:00","after":{"id":%d,"status":"new","amount":%d}}`, id, id, u+1))})
				if len(ins) == 1000 {
					if _, err := p.EnqueueMany(ctx, ins); err != nil {
						b.Fatal(err)
					}
					ins = ins[:0]
				}
			}
		}
		exec(b, pool, fmt.Sprintf(`VACUUM ANALYZE %q`, schema.Table))
		return schema
	}
	drainWAL := func() time.Duration {
		var dest message.Publisher = &counter{}
		if kafkaDest {
			dest = newKafka()
		}
		src, err := wal.New(pool, wal.Config{Tables: tables, Destination: dest, Concurrency: 16})
		if err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		stop := run(b, src)
		waitFor(b, 10*time.Minute, "the WAL backlog", func() bool { return src.Stats().Delivered >= uint64(n) })
		took := time.Since(start)
		if err := stop(); err != nil {
			b.Fatal(err)
		}
		return took
	}
	drainRelay := func(schema outbox.SchemaConfig) time.Duration {
		sub, err := outbox.NewSubscriber(pool, outbox.SubscriberConfig{Schema: schema, BatchSize: 1000, MaxRunPerKey: 100, Concurrency: 100, PollInterval: 10 * time.Millisecond}, nil)
		if err != nil {
			b.Fatal(err)
		}
		defer sub.Close()
		sctx, cancel := context.WithCancel(ctx)
		defer cancel()
		start := time.Now()
		if kafkaDest {
			fwd, err := forwarder.New(sub, newKafka(), forwarder.Config{}, nil)
			if err != nil {
				b.Fatal(err)
			}
			go func() { _ = fwd.Run(sctx) }()
			waitFor(b, 10*time.Minute, "the relay backlog", func() bool {
				var left int
				_ = pool.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM %q WHERE published_at IS NULL`, schema.Table)).Scan(&left)
				return left == 0
			})
			took := time.Since(start)
			_ = fwd.Close()
			return took
		}
		ch, err := sub.Subscribe(sctx, "*")
		if err != nil {
			b.Fatal(err)
		}
		for range n {
			(<-ch).Ack()
		}
		return time.Since(start)
	}
	for range b.N {
		var tw, tr time.Duration
		for r := range rounds {
			schema := backlog(r)
			if r%2 == 0 {
				tw += drainWAL()
				tr += drainRelay(schema)
			} else {
				tr += drainRelay(schema)
				tw += drainWAL()
			}
		}
		ew, er := float64(n*rounds)/tw.Seconds(), float64(n*rounds)/tr.Seconds()
		b.ReportMetric(ew, "wal-events/s")
		b.ReportMetric(er, "relay-events/s")
		b.ReportMetric(ew/er, "ratio")
	}
}

// pacedUpdates commits total single-row UPDATEs of table at rate per second from 4 writers and
// returns the rate achieved.
func pacedUpdates(b *testing.B, pool *pgxpool.Pool, table string, keys, rate, total int) float64 {
	var next atomic.Int64
	start := time.Now()
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for {
				i := next.Add(1)
				if i > int64(total) {
					return
				}
				// Paced: the i-th update is due at start + i/rate.
				if d := time.Until(start.Add(time.Duration(i) * time.Second / time.Duration(rate))); d > 0 {
					time.Sleep(d)
				}
				if _, err := pool.Exec(ctx, fmt.Sprintf(`UPDATE %s SET amount = amount + 1 WHERE id = $1`, table), 1+(int(i)*7+w)%keys); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	return float64(total) / time.Since(start).Seconds()
}

// percentiles returns p50, p99 and max of lat in milliseconds.
func percentiles(lat []time.Duration) (p50, p99, mx float64) {
	lat = append([]time.Duration(nil), lat...)
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	ms := func(q float64) float64 { return float64(lat[int(q*float64(len(lat)-1))].Microseconds()) / 1000 }
	return ms(0.5), ms(0.99), ms(1)
}

// BenchmarkWALLatency: single-row UPDATEs committed at OUTBOX_BENCH_RATE per second (default
// 1,000) for OUTBOX_BENCH_SECONDS (default 20) by 4 writers, first on a table the WAL source
// streams, then on a table captured by triggers and relayed by the polling relay (default
// SubscriberConfig: it wakes within milliseconds after COMMIT on PostgreSQL). The destination
// records now minus the envelope's occurred_at (WAL: the commit time; trigger: the transaction's
// start, which for these one-statement transactions is within the statement's duration of the
// commit); one machine, one clock. It reports p50, p99 and max in milliseconds of each, and the
// ratio of the p99s.
func BenchmarkWALLatency(b *testing.B) {
	_, pool := logicalPG(b)
	rate, secs := envInt("OUTBOX_BENCH_RATE", 1000), envInt("OUTBOX_BENCH_SECONDS", 20)
	const keys = 10000
	benchTable(b, pool, "walt", keys)
	benchTable(b, pool, "trig", keys)
	tables := []capture.Table{{Name: "walt"}}
	if err := wal.Setup(ctx, pool, wal.Config{Tables: tables}); err != nil {
		b.Fatal(err)
	}
	trigSchema := outbox.SchemaConfig{Table: "trigger_outbox"}
	if err := outbox.Migrate(ctx, pool, trigSchema); err != nil {
		b.Fatal(err)
	}
	if err := capture.Install(ctx, pool, trigSchema, capture.Table{Name: "trig"}); err != nil {
		b.Fatal(err)
	}
	total := rate * secs
	for range b.N {
		dest := &counter{rec: true}
		src, err := wal.New(pool, wal.Config{Tables: tables, Destination: dest})
		if err != nil {
			b.Fatal(err)
		}
		stop := run(b, src)
		achieved := pacedUpdates(b, pool, "walt", keys, rate, total)
		waitFor(b, time.Minute, "every change", func() bool { return dest.n.Load() >= int64(total) })
		if err := stop(); err != nil {
			b.Fatal(err)
		}
		w50, w99, wmax := percentiles(dest.lat)

		relayed := &counter{rec: true}
		sub, err := outbox.NewSubscriber(pool, outbox.SubscriberConfig{Schema: trigSchema}, nil)
		if err != nil {
			b.Fatal(err)
		}
		sctx, cancel := context.WithCancel(ctx)
		msgs, err := sub.Subscribe(sctx, "*")
		if err != nil {
			b.Fatal(err)
		}
		go func() {
			for m := range msgs {
				_ = relayed.Publish("", m)
				m.Ack()
			}
		}()
		pacedUpdates(b, pool, "trig", keys, rate, total)
		waitFor(b, time.Minute, "every relayed change", func() bool { return relayed.n.Load() >= int64(total) })
		cancel()
		_ = sub.Close()
		r50, r99, rmax := percentiles(relayed.lat)
		b.ReportMetric(w50, "wal-p50-ms")
		b.ReportMetric(w99, "wal-p99-ms")
		b.ReportMetric(wmax, "wal-max-ms")
		b.ReportMetric(r50, "relay-p50-ms")
		b.ReportMetric(r99, "relay-p99-ms")
		b.ReportMetric(rmax, "relay-max-ms")
		b.ReportMetric(w99/r99, "p99-wal/relay")
		b.ReportMetric(achieved, "changes/s")
	}
}
