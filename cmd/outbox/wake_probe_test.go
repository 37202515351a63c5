package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/internal/pgtest"
	"github.com/watermill-outbox/outbox/internal/privatepgbouncer"
)

// TestRelayPostgresWakesOnCommit: `outbox relay` with default flags (--poll-interval 5s) in its
// own process delivers each event that this process commits through a plain outbox.Publisher
// on a pgx.Tx well within a second: the relay probes the table's sequence, with no signal from
// the writer. Each event is committed right after the previous one arrived, so the relay's next
// poll is 5 s away: only the wakeup can deliver it within a second. The same through PgBouncer
// in transaction mode (the probe is a plain statement; no LISTEN).
func TestRelayPostgresWakesOnCommit(t *testing.T) {
	for _, b := range []backend{
		postgresBackend(),
		dsnBackend("pgbouncer", func(t *testing.T) string {
			return privatepgbouncer.Start(t, pgtest.DSN()).DSN("default_query_exec_mode=exec")
		}),
	} {
		t.Run(b.name, func(t *testing.T) {
			db, table := b.fresh(t)
			mustRun(t, nil, "migrate", "--db", db, "--table", table)
			rcv := newReceiver(t, http.StatusOK)
			p := start(t, []string{"OUTBOX_SECRET=" + rcv.secret}, "relay", "--db", db, "--table", table, "--to", rcv.URL+"/hook",
				"--allow-prefix", "127.0.0.0/8")
			for i := range 10 {
				ids := b.publish(t, db, table, []testEvent{{topic: "orders.created", key: "k", n: i}})
				committed := time.Now()
				waitFor(t, 20*time.Second, fmt.Sprintf("event %d delivered", i), func() bool {
					if !p.running() {
						t.Fatalf("relay exited")
					}
					_, ok := rcv.arrived(ids[0])
					return ok
				})
				// The first event may be found by the relay's first poll.
				if at, _ := rcv.arrived(ids[0]); i > 0 && at.Sub(committed) > time.Second {
					t.Fatalf("event %d arrived %s after COMMIT; want well within 1s (--poll-interval is 5s)", i, at.Sub(committed))
				}
			}
			if code := p.stop(t); code != 0 {
				t.Fatalf("relay exit status %d", code)
			}
			if want := `wake-probe=5ms wake-probe-idle=50ms wakeup=probe`; !strings.Contains(p.errb.String(), want) {
				t.Fatalf("relay log lacks %q", want)
			}
		})
	}
}

// writeEvents commits one event per transaction through a plain outbox.Publisher on writers
// connections of pool, paced at rate per second (0: as fast as they can), for d; it returns
// when each transaction's COMMIT returned, by event id.
func writeEvents(tb testing.TB, pool *pgxpool.Pool, schema outbox.SchemaConfig, writers, rate int, d time.Duration) map[string]time.Time {
	jobs := make(chan struct{}, max(rate, writers))
	var (
		mu        sync.Mutex
		committed = map[string]time.Time{}
		wg        sync.WaitGroup
	)
	for range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range jobs {
				var id string
				err := pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error {
					pub, err := outbox.NewPublisher(tx, outbox.PublisherConfig{Schema: schema}, nil)
					if err != nil {
						return err
					}
					msg := outbox.NewMessage([]byte(`{"key":"","n":0}`))
					id = msg.UUID
					return pub.Publish("bench.latency", msg)
				})
				if err != nil {
					tb.Error(err)
					return
				}
				now := time.Now()
				mu.Lock()
				committed[id] = now
				mu.Unlock()
			}
		}()
	}
	start := time.Now()
	end := start.Add(d)
	if rate > 0 {
		// Paced by the schedule, not by a ticker (a ticker drops the ticks a busy machine
		// misses): each millisecond, the transactions due by then.
		sent := 0
		for now := start; now.Before(end); now = time.Now() {
			for due := int(now.Sub(start) * time.Duration(rate) / time.Second); sent < due; sent++ {
				jobs <- struct{}{}
			}
			time.Sleep(time.Millisecond)
		}
	} else {
		for time.Now().Before(end) {
			jobs <- struct{}{}
		}
	}
	close(jobs)
	wg.Wait()
	return committed
}

// benchRelay migrates a fresh table and starts `outbox relay` on it with default flags plus
// extra, delivering to a webhook receiver here.
func benchRelay(b *testing.B, extra ...string) (outbox.SchemaConfig, *receiver, *process) {
	table := pgtest.Table(b)
	schema := outbox.SchemaConfig{Table: table}
	if err := outbox.Migrate(context.Background(), pgtest.Require(b), schema); err != nil {
		b.Fatal(err)
	}
	rcv := newReceiver(b, http.StatusOK)
	p := start(b, []string{"OUTBOX_SECRET=" + rcv.secret}, append([]string{"relay", "--db", pgtest.DSN(), "--table", table, "--to", rcv.URL + "/hook",
		"--allow-prefix", "127.0.0.0/8"}, extra...)...)
	return schema, rcv, p
}

// waitReceived waits until rcv received n events, 30 s at most.
func waitReceived(b *testing.B, rcv *receiver, n int) {
	b.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for len(rcv.received()) < n {
		if time.Now().After(deadline) {
			b.Fatalf("%d of %d delivered within 30s", len(rcv.received()), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// BenchmarkRelayCommitToDelivery measures commit → delivery latency across processes: writers
// in this process commit one event per transaction through a plain outbox.Publisher (8
// connections) at a fixed rate for 10 s, after a 2 s warm-up at that rate that is not measured; `outbox relay` with default flags ("default") or with
// the wake probe off ("no-probe", --wake-probe 0: it polls every 5s) delivers them to a webhook
// receiver here. It reports the median and the 99th percentile of (arrival − COMMIT returned)
// in ms, and the rate the writers reached. Run with -benchtime=1x.
func BenchmarkRelayCommitToDelivery(b *testing.B) {
	pool := pgtest.Require(b)
	for _, rate := range []int{1000, 20} {
		for _, v := range []struct {
			name  string
			flags []string
		}{{"default", nil}, {"no-probe", []string{"--wake-probe", "0"}}} {
			b.Run(fmt.Sprintf("rate=%d/%s", rate, v.name), func(b *testing.B) {
				schema, rcv, p := benchRelay(b, v.flags...)
				const d = 10 * time.Second
				// A warm-up at the same rate, not measured: the relay's first claims, its
				// connections to the database and the receiver (the first second after a start
				// had a p99 of about 340 ms at 1,000 events/s, later seconds 10-70 ms).
				warm := writeEvents(b, pool, schema, 8, rate, 2*time.Second)
				waitReceived(b, rcv, len(warm))
				for range b.N {
					committed := writeEvents(b, pool, schema, 8, rate, d)
					waitReceived(b, rcv, len(warm)+len(committed))
					var lat []time.Duration
					for id, c := range committed {
						at, _ := rcv.arrived(id)
						lat = append(lat, at.Sub(c))
					}
					slices.Sort(lat)
					b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
					b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
					b.ReportMetric(float64(len(lat))/d.Seconds(), "events/s")
				}
				if code := p.stop(b); code != 0 {
					b.Fatalf("relay exit status %d", code)
				}
			})
		}
	}
}

// BenchmarkWritePathBesideRelay measures what a relay's wake probe costs writers: 8 writers
// commit as fast as they can (one event per transaction, durable commits) while `outbox relay`
// drains the table, with default flags or with --wake-probe 0 (it then claims every 5 s:
// rounds are long enough for it to drain too), in pairs of rounds of WAKE_BENCH_SECONDS
// (default 12) each, the order alternating per pair, WAKE_BENCH_ROUNDS pairs (default 5). It
// reports each variant's median rate and the median of the pairs' ratios (default / no-probe).
func BenchmarkWritePathBesideRelay(b *testing.B) {
	pool := pgtest.Require(b)
	pairs, seconds := 5, 12
	if n, err := strconv.Atoi(os.Getenv("WAKE_BENCH_ROUNDS")); err == nil && n > 0 {
		pairs = n
	}
	if n, err := strconv.Atoi(os.Getenv("WAKE_BENCH_SECONDS")); err == nil && n > 0 {
		seconds = n
	}
	d := time.Duration(seconds) * time.Second
	// WAKE_BENCH_TOPICS=PATTERN makes the relay serve only that pattern (one the writers do not
	// write): it then probes, wakes and claims but delivers nothing, so the ratio is the wake
	// probe's cost to the writers without the relay's delivery work competing for the cores.
	var topics []string
	if t := os.Getenv("WAKE_BENCH_TOPICS"); t != "" {
		topics = []string{"--topics", t}
	}
	round := func(flags ...string) float64 {
		schema, _, p := benchRelay(b, append(flags, topics...)...)
		n := len(writeEvents(b, pool, schema, 8, 0, d))
		if code := p.stop(b); code != 0 {
			b.Fatalf("relay exit status %d", code)
		}
		return float64(n) / d.Seconds()
	}
	median := func(v []float64) float64 {
		v = slices.Clone(v)
		slices.Sort(v)
		if len(v)%2 == 0 {
			return (v[len(v)/2-1] + v[len(v)/2]) / 2
		}
		return v[len(v)/2]
	}
	for range b.N {
		var def, off, ratios []float64
		for i := range pairs {
			var a, c float64
			if i%2 == 0 {
				a = round()
				c = round("--wake-probe", "0")
			} else {
				c = round("--wake-probe", "0")
				a = round()
			}
			def, off, ratios = append(def, a), append(off, c), append(ratios, a/c)
		}
		b.ReportMetric(median(def), "default-tx/s")
		b.ReportMetric(median(off), "no-probe-tx/s")
		b.ReportMetric(median(ratios), "ratio")
		b.Logf("pairs (default, no-probe): %v %v; ratios %v", def, off, ratios)
	}
}
