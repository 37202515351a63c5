package pgnotify_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/internal/claimlog"
	"github.com/watermill-outbox/outbox/internal/pgtest"
	"github.com/watermill-outbox/outbox/wakeup"
	"github.com/watermill-outbox/outbox/wakeup/internal/wakeuptest"
	"github.com/watermill-outbox/outbox/wakeup/pgnotify"
)

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// noWakeup is the writer side of "no wakeup": RunInTx with nothing to signal.
type noWakeup struct{ *wakeup.InProcess }

func (noWakeup) Signal(...string) {}

// OUTBOX_BENCH_WAKEUP_WINDOW (a Go duration) overrides the after-commit coalescing window in
// the benchmarks below.

// BenchmarkCommitToHandlerLatency measures commit → handler latency at a steady write rate:
// 8 writers commit one event per transaction (RunInTx) at OUTBOX_BENCH_WAKEUP_RATE
// transactions/s (default 1000) for OUTBOX_BENCH_WAKEUP_SECONDS (default 30); one relay
// (Subscribe, defaults) hands each message to a handler that records now − the time its
// COMMIT returned. Variants in one run: LISTEN/NOTIFY after commit (the default, relay poll
// interval 60 s), LISTEN/NOTIFY in the transaction (same), polling only at 1 s, and the
// in-process wakeup (no transport at all: the floor set by the relay itself on this machine),
// and the relay's own wake probe with no wakeup (probe-default: the Subscriber's defaults,
// PollInterval 5s; the other variants turn the probe off).
// Reports p50/p95/p99/max in ms, and p50/p99 of the first and the last minute of the run
// (each minute's are logged). OUTBOX_BENCH_WAKEUP_VARIANT runs one variant only (e.g.
// listen-aftercommit).
func BenchmarkCommitToHandlerLatency(b *testing.B) {
	pgtest.Require(b)
	seconds := envInt("OUTBOX_BENCH_WAKEUP_SECONDS", 30)
	rate := envInt("OUTBOX_BENCH_WAKEUP_RATE", 1000)
	for _, v := range []struct {
		name  string
		mode  pgnotify.Mode
		poll  time.Duration
		wake  bool
		probe bool
	}{
		{"listen-aftercommit", pgnotify.AfterCommit, time.Minute, true, false},
		{"listen-intransaction", pgnotify.InTransaction, time.Minute, true, false},
		{"poll-1s", 0, time.Second, false, false},
		{"inprocess-floor", -1, time.Minute, true, false},
		{"probe-default", 0, 0, false, true},
	} {
		if only := os.Getenv("OUTBOX_BENCH_WAKEUP_VARIANT"); only != "" && only != v.name {
			continue
		}
		b.Run(v.name, func(b *testing.B) {
			for range b.N {
				var w wakeup.Wakeup = noWakeup{wakeup.NewInProcess()}
				if v.mode == -1 {
					w = wakeup.NewInProcess()
				} else if v.wake {
					w = newBenchWakeup(b, v.mode)
				}
				lat, byMinute := measureLatency(b, w, v.wake, v.probe, v.poll, rate, time.Duration(seconds)*time.Second)
				_ = w.Close()
				logMinutes(b, byMinute)
				p := func(q float64) float64 { return float64(lat[int(q*float64(len(lat)-1))]) / float64(time.Millisecond) }
				b.ReportMetric(p(0.50), "p50-ms")
				b.ReportMetric(p(0.95), "p95-ms")
				b.ReportMetric(p(0.99), "p99-ms")
				b.ReportMetric(p(1), "max-ms")
				b.ReportMetric(float64(len(lat))/float64(seconds), "events/s")
				b.Logf("%s: %d events, p50 %.2f ms, p95 %.2f ms, p99 %.2f ms, max %.2f ms", v.name, len(lat), p(0.5), p(0.95), p(0.99), p(1))
			}
		})
	}
}

func newBenchWakeup(b *testing.B, mode pgnotify.Mode) *pgnotify.Wakeup {
	cc, err := pgx.ParseConfig(pgtest.DSN())
	if err != nil {
		b.Fatal(err)
	}
	window, _ := time.ParseDuration(os.Getenv("OUTBOX_BENCH_WAKEUP_WINDOW")) // "" = default
	w, err := pgnotify.New(context.Background(), cc, pgnotify.Config{Channel: wakeuptest.UniqueName(b, "bench"), Mode: mode, Window: window}, nil)
	if err != nil {
		b.Fatal(err)
	}
	return w
}

type stamp struct {
	mu                sync.Mutex
	committed, handed time.Time
}

// logMinutes logs p50 and p99 of each minute of the run (by commit time) and reports the
// first and the last minute's, so that a trend over the run shows.
func logMinutes(b *testing.B, byMinute [][]time.Duration) {
	ms := func(lat []time.Duration, q float64) float64 {
		return float64(lat[int(q*float64(len(lat)-1))]) / float64(time.Millisecond)
	}
	var full [][]time.Duration
	for i, lat := range byMinute {
		if len(lat) == 0 {
			continue
		}
		slices.Sort(lat)
		b.Logf("minute %d: %d events, p50 %.2f ms, p99 %.2f ms", i+1, len(lat), ms(lat, 0.5), ms(lat, 0.99))
		full = append(full, lat)
	}
	if len(full) > 1 {
		first, last := full[0], full[len(full)-1]
		b.ReportMetric(ms(first, 0.5), "first-min-p50-ms")
		b.ReportMetric(ms(first, 0.99), "first-min-p99-ms")
		b.ReportMetric(ms(last, 0.5), "last-min-p50-ms")
		b.ReportMetric(ms(last, 0.99), "last-min-p99-ms")
	}
}

// measureLatency returns the commit → handler delays of the run, sorted, and the same grouped
// by the minute of the run in which each event was committed.
func measureLatency(b *testing.B, w wakeup.Wakeup, wake, probe bool, poll time.Duration, rate int, d time.Duration) ([]time.Duration, [][]time.Duration) {
	pool := pgtest.Require(b)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	schema := outbox.SchemaConfig{Table: pgtest.Table(b)}
	if err := outbox.Migrate(ctx, pool, schema); err != nil {
		b.Fatal(err)
	}
	cfg := outbox.SubscriberConfig{Schema: schema, PollInterval: poll, SyncCommit: os.Getenv("OUTBOX_BENCH_SYNC_COMMIT") != "", KeyScan: envInt("OUTBOX_BENCH_KEYSCAN", 0),
		DisableWakeProbe: !probe}
	if wake {
		cfg.Wakeup = w
	}
	polls := &claimlog.Log{}
	sub, err := outbox.NewSubscriber(pool, cfg, polls)
	if err != nil {
		b.Fatal(err)
	}
	defer sub.Close()
	defer func() {
		n, perPoll, ms := polls.Summary()
		b.ReportMetric(float64(n)/d.Seconds(), "polls/s")
		b.Logf("relay: %d polls, %.1f events per poll, %.2f ms per claim", n, perPoll, ms)
	}()
	msgs, err := sub.Subscribe(ctx, "bench.latency")
	if err != nil {
		b.Fatal(err)
	}
	var (
		stamps    sync.Map // event id → *stamp
		mu        sync.Mutex
		latencies []time.Duration
		byMinute  = make([][]time.Duration, max(1, int(d/time.Minute))) // the last takes any overrun
		delivered atomic.Int64
		start     time.Time // set before the first write
	)
	record := func(id string, committed bool) {
		now := time.Now()
		v, _ := stamps.LoadOrStore(id, &stamp{})
		s := v.(*stamp)
		s.mu.Lock()
		defer s.mu.Unlock()
		if committed {
			s.committed = now
		} else {
			s.handed = now
		}
		if s.committed.IsZero() || s.handed.IsZero() {
			return
		}
		l := max(0, s.handed.Sub(s.committed))
		minute := min(int(s.committed.Sub(start)/time.Minute), len(byMinute)-1)
		mu.Lock()
		latencies = append(latencies, l)
		byMinute[minute] = append(byMinute[minute], l)
		mu.Unlock()
	}
	go func() {
		for m := range msgs {
			record(m.UUID, false)
			m.Ack()
			delivered.Add(1)
		}
	}()
	if wake {
		// The relay's listener is shared: once this channel has its "subscribed" value, the
		// relay's has too.
		lctx, stop := context.WithCancel(ctx)
		<-w.Listen(lctx, nil)
		stop()
	}

	jobs := make(chan struct{}, rate*int(d/time.Second+1))
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range jobs {
				m := outbox.NewMessage([]byte(`{"bench":true}`))
				err := wakeup.RunInTx(ctx, pool, w, outbox.PublisherConfig{Schema: schema}, func(tx pgx.Tx, pub *outbox.Publisher) error {
					return pub.Publish("bench.latency", m)
				})
				if err != nil {
					b.Error(err)
					return
				}
				record(m.UUID, true)
			}
		}()
	}
	total := int(d.Seconds() * float64(rate))
	interval := time.Second / time.Duration(rate)
	start = time.Now()
	for i := range total {
		// Pace by the schedule, not by a ticker: a late tick does not lower the rate.
		if wait := time.Until(start.Add(time.Duration(i) * interval)); wait > 0 {
			time.Sleep(wait)
		}
		jobs <- struct{}{}
	}
	close(jobs)
	wg.Wait()
	deadline := time.Now().Add(poll + 10*time.Second)
	for delivered.Load() < int64(total) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := delivered.Load(); n != int64(total) {
		b.Fatalf("delivered %d of %d", n, total)
	}
	mu.Lock()
	defer mu.Unlock()
	lat := slices.Clone(latencies)
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	return lat, byMinute
}

// BenchmarkWriteThroughput measures the writer-side cost of each wakeup mode: 8 writers,
// durable commits (synchronous_commit as the server has it, on by default), each transaction a
// business INSERT plus one outbox event (3 topics) through RunInTx, with a relay-side listener
// LISTENing on the channel throughout. OUTBOX_BENCH_ROUNDS rounds (default 15), each running
// OUTBOX_BENCH_TX transactions (default 1500) per variant in a rotated order; short paired
// rounds keep a machine whose load drifts from favouring one variant. Reports each variant's
// median tx/s and the median over rounds of its ratio to "no wakeup" in the same round.
func BenchmarkWriteThroughput(b *testing.B) {
	pool := pgtest.Require(b)
	ctx := context.Background()
	var syncCommit, fsync string
	if err := pool.QueryRow(ctx, `SELECT current_setting('synchronous_commit'), current_setting('fsync')`).Scan(&syncCommit, &fsync); err != nil {
		b.Fatal(err)
	}
	b.Logf("synchronous_commit=%s fsync=%s", syncCommit, fsync)
	total := envInt("OUTBOX_BENCH_TX", 1500)
	rounds := envInt("OUTBOX_BENCH_ROUNDS", 15)
	biz := pgtest.Table(b)
	if _, err := pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE %q (id bigserial PRIMARY KEY, v int)`, biz)); err != nil {
		b.Fatal(err)
	}
	type variant struct {
		name   string
		w      wakeup.Wakeup
		schema outbox.SchemaConfig
		rates  []float64
		ratios []float64 // rate / the same round's "none" rate
	}
	variants := []*variant{
		{name: "none", w: noWakeup{wakeup.NewInProcess()}},
		{name: "intransaction", w: newBenchWakeup(b, pgnotify.InTransaction)},
		{name: "aftercommit", w: newBenchWakeup(b, pgnotify.AfterCommit)},
	}
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for _, v := range variants {
		v.schema = outbox.SchemaConfig{Table: pgtest.Table(b)}
		if err := outbox.Migrate(ctx, pool, v.schema); err != nil {
			b.Fatal(err)
		}
		defer v.w.Close()
		if _, ok := v.w.(*pgnotify.Wakeup); ok {
			ch := v.w.Listen(lctx, nil) // a relay's listener, drained
			go func() {
				for range ch {
				}
			}()
		}
	}
	run := func(v *variant) float64 {
		var next atomic.Int64
		var wg sync.WaitGroup
		start := time.Now()
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					i := next.Add(1)
					if i > int64(total) {
						return
					}
					err := wakeup.RunInTx(ctx, pool, v.w, outbox.PublisherConfig{Schema: v.schema}, func(tx pgx.Tx, pub *outbox.Publisher) error {
						if _, err := tx.Exec(ctx, fmt.Sprintf(`INSERT INTO %q (v) VALUES ($1)`, biz), i); err != nil {
							return err
						}
						return pub.Publish("bench.write."+strconv.FormatInt(i%3, 10), outbox.NewMessage([]byte(`{"v":1}`)))
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
	for range b.N {
		for r := range rounds {
			round := make([]float64, len(variants))
			for i := range variants {
				j := (i + r) % len(variants) // rotate the order per round
				round[j] = run(variants[j])
			}
			for j, v := range variants {
				v.rates = append(v.rates, round[j])
				v.ratios = append(v.ratios, round[j]/round[0])
			}
		}
	}
	median := func(xs []float64) float64 {
		s := slices.Clone(xs)
		slices.Sort(s)
		return s[len(s)/2]
	}
	for _, v := range variants {
		b.ReportMetric(median(v.rates), v.name+"-tx/s")
		if v != variants[0] {
			b.ReportMetric(median(v.ratios), v.name+"/none")
		}
		b.Logf("%-14s median %.0f tx/s, median paired ratio %.3f× none; rounds %v", v.name, median(v.rates), median(v.ratios), roundAll(v.rates))
	}
}

func roundAll(xs []float64) []int {
	out := make([]int, len(xs))
	for i, x := range xs {
		out[i] = int(x)
	}
	return out
}

// BenchmarkSignalToListen measures the after-commit transport alone: Signal → NOTIFY on the
// notifier connection → the listener's connection → the Listen channel, one signal at a time
// (coalescing window 1µs so that each goes out at once). ns/op is that latency.
func BenchmarkSignalToListen(b *testing.B) {
	cc, err := pgx.ParseConfig(pgtest.DSN())
	if err != nil {
		b.Fatal(err)
	}
	w, err := pgnotify.New(context.Background(), cc, pgnotify.Config{Channel: wakeuptest.UniqueName(b, "bench"), Window: time.Microsecond}, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer w.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch := w.Listen(ctx, func(topic string) bool { return topic == "bench.signal" })
	<-ch // subscribed
	b.ResetTimer()
	for range b.N {
		w.Signal("bench.signal")
		<-ch
	}
}
