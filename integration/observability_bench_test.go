package integration_test

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/forwarder"
	"github.com/watermill-outbox/outbox/internal/pgtest"
	"github.com/watermill-outbox/outbox/metrics"
	"github.com/watermill-outbox/outbox/metrics/prom"
	"github.com/watermill-outbox/outbox/tracing"
)

// BenchmarkObservabilityOverhead measures, in one run, the relay's drain rate to a destination
// that does nothing (the worst case: the relay's own work is all there is) with metrics only
// (Prometheus recorder, backlog sampler) and with metrics and tracing (tracing.Publisher, an SDK
// tracer provider sampling every span, batching to a no-op exporter) against the drain with
// both off; and the write path with trace capture (PublisherConfig.InjectHeaders, a sampled
// span in ctx) on against off. Rounds alternate the order (ABC CBA …, ABBA for the write
// path); medians and their ratios are reported (target: on-off-ratio ≥ 0.95 drain, ≥ 0.97
// write). The drain also reports this process's CPU time per event in each mode (getrusage:
// the relay's and the tracer's goroutines, not the database's), which the machine's load
// drifts far less than wall-clock rates. OUTBOX_BENCH_EVENTS sets the events per drain
// (default 20000), OUTBOX_BENCH_ROUNDS the rounds (default 3), OUTBOX_BENCH_TRACE the
// writers' trace context in the events (see obsTraceMode; default: every event's writer
// sampled, a recorded delivery span each, the worst case).
func BenchmarkObservabilityOverhead(b *testing.B) {
	n := fwdBenchEnv("OUTBOX_BENCH_EVENTS", 20000)
	rounds := fwdBenchEnv("OUTBOX_BENCH_ROUNDS", 3)
	headers, roots, pct := obsTraceMode(b)
	b.Run("drain", func(b *testing.B) {
		// Modes: 0 off, 1 metrics only, 2 metrics and tracing; each round runs them in
		// order, the next round in reverse (ABC CBA …).
		rates := make([][]float64, 3)
		cpus := make([][]float64, 3)
		for range b.N {
			for r := range rounds {
				for i := range 3 {
					mode := i
					if r%2 == 1 {
						mode = 2 - i
					}
					rate, cpu := obsDrain(b, n, headers, mode >= 1, mode == 2, roots, pct)
					rates[mode] = append(rates[mode], rate)
					cpus[mode] = append(cpus[mode], cpu)
				}
			}
		}
		off, met, on := median(rates[0]), median(rates[1]), median(rates[2])
		b.ReportMetric(off, "off-events/s")
		b.ReportMetric(met, "metrics-events/s")
		b.ReportMetric(on, "on-events/s")
		b.ReportMetric(met/off, "metrics-off-ratio")
		b.ReportMetric(on/off, "on-off-ratio")
		cOff, cMet, cOn := median(cpus[0]), median(cpus[1]), median(cpus[2])
		b.ReportMetric(cOff, "off-cpu-µs/event")
		b.ReportMetric(cMet, "metrics-cpu-µs/event")
		b.ReportMetric(cOn, "on-cpu-µs/event")
		b.Logf("OUTBOX_BENCH_TRACE=%q (%d %% of deliveries record a span): rates off %v metrics %v on %v; cpu µs/event off %v metrics %v on %v", os.Getenv("OUTBOX_BENCH_TRACE"), pct, rates[0], rates[1], rates[2], cpus[0], cpus[1], cpus[2])
	})
	b.Run("write", func(b *testing.B) {
		var off, on, cpuOff, cpuOn []float64
		for range b.N {
			for r := range 2 * rounds {
				runtime.GC()
				cpu0 := cpuTime()
				rate := obsWrite(b, 2000, abba(r))
				cpu := float64((cpuTime() - cpu0).Microseconds()) / 2000
				if abba(r) {
					on, cpuOn = append(on, rate), append(cpuOn, cpu)
				} else {
					off, cpuOff = append(off, rate), append(cpuOff, cpu)
				}
			}
		}
		mOff, mOn := median(off), median(on)
		b.ReportMetric(mOff, "off-tx/s")
		b.ReportMetric(mOn, "on-tx/s")
		b.ReportMetric(mOn/mOff, "on-off-ratio")
		b.ReportMetric(median(cpuOff), "off-cpu-µs/tx")
		b.ReportMetric(median(cpuOn), "on-cpu-µs/tx")
		b.Logf("rates off %v on %v; cpu µs/tx off %v on %v", off, on, cpuOff, cpuOn)
	})
}

// abba orders the rounds off, on, on, off, off, on, … so that a drift of the machine's load
// weighs on both sides alike.
func abba(r int) bool { return r%4 == 1 || r%4 == 2 }

func median(v []float64) float64 {
	v = slices.Clone(v)
	slices.Sort(v)
	return v[len(v)/2]
}

// Writer trace context of the drained events (W3C traceparent; the writer's span is the same
// for all, which the relay does not care about).
const obsWriterContext = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0"

// obsTraceMode reads OUTBOX_BENCH_TRACE and returns the SQL expression of the drained events'
// headers and whether tracing.Config.RootSpans is set: "sampled" (the default: every event
// carries a sampled writer's traceparent, so every delivery records a span), "sampled:P"
// (P % of the events carry a sampled writer's traceparent, the others an unsampled one: what
// a writer-side ratio sampler gives), "unsampled" (sampled:0), "none" (no trace headers) or
// "roots" (none, with RootSpans: every delivery records a new trace).
func obsTraceMode(b *testing.B) (headers string, roots bool, sampledPct int) {
	mode := os.Getenv("OUTBOX_BENCH_TRACE")
	pct := 100
	switch {
	case mode == "" || mode == "sampled":
	case mode == "unsampled":
		pct = 0
	case strings.HasPrefix(mode, "sampled:"):
		p, err := strconv.Atoi(strings.TrimPrefix(mode, "sampled:"))
		if err != nil || p < 0 || p > 100 {
			b.Fatalf("OUTBOX_BENCH_TRACE=%q: want sampled:P with P in 0…100", mode)
		}
		pct = p
	case mode == "none":
		return `'{"trace-id":"bench"}'`, false, 0
	case mode == "roots":
		return `'{"trace-id":"bench"}'`, true, 100
	default:
		b.Fatalf("OUTBOX_BENCH_TRACE=%q: want sampled, sampled:P, unsampled, none or roots", mode)
	}
	return fmt.Sprintf(`json_build_object('trace-id', 'bench', 'traceparent', '%s' || CASE WHEN g %% 100 < %d THEN '1' ELSE '0' END)`, obsWriterContext, pct), false, pct
}

// obsDrain drains n events (headers: the SQL expression of their headers) to a destination
// that does nothing, with metrics (observe) and tracing (trace; roots: Config.RootSpans) on
// or off, and returns events/s and this process's CPU µs per event. With tracing, it fails
// unless exactly pct % of the deliveries ended a recorded process span (and, with roots, a
// create span each).
func obsDrain(b *testing.B, n int, headers string, observe, trace, roots bool, pct int) (float64, float64) {
	b.Helper()
	pool := pgtest.Require(b)
	schema := fwdBenchSeedHeaders(b, "bench.obs", n, 100, headers)
	var delivered atomic.Int64
	done := make(chan struct{})
	hooks := outbox.Hooks{OnDelivered: func(outbox.DeliveredInfo) {
		if delivered.Add(1) == int64(n) {
			close(done)
		}
	}}
	var pub message.Publisher = forwarder.Func(func(context.Context, *message.Message) error { return nil })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var obs *metrics.Observer
	if observe {
		rec, err := prom.New(prometheus.NewRegistry())
		if err != nil {
			b.Fatal(err)
		}
		if obs, err = metrics.New(rec, metrics.Config{}); err != nil {
			b.Fatal(err)
		}
		hooks = metrics.ComposeHooks(hooks, obs.Hooks())
	}
	var tp *sdktrace.TracerProvider
	var ended spanCounter
	if trace {
		tp = sdktrace.NewTracerProvider(sdktrace.WithBatcher(tracetest.NewNoopExporter()), sdktrace.WithSpanProcessor(&ended))
		pub = tracing.Publisher(pub, tracing.Config{TracerProvider: tp, RootSpans: roots})
	}
	took, cpu := timedDrain(ctx, b, pool, outbox.SubscriberConfig{Schema: schema, BatchSize: 1000, PollInterval: 10 * time.Millisecond, Hooks: hooks}, obs, pub, done, &delivered, n)
	if tp != nil {
		_ = tp.Shutdown(context.Background())
		var want int64 // events g (1…n) with g % 100 < pct, as obsTraceMode's headers
		for g := 1; g <= n; g++ {
			if g%100 < pct {
				want++
			}
		}
		if roots {
			want *= 2 // a create span and a process span per event
		}
		if ended.n.Load() != want {
			b.Fatalf("%d spans recorded, want %d (%d %% of %d events)", ended.n.Load(), want, pct, n)
		}
	}
	return float64(n) / took.Seconds(), float64(cpu.Microseconds()) / float64(n)
}

// timedDrain forwards the table of cfg to pub (obs sampling the backlog when set) until done
// is closed, and returns the drain's wall and process CPU time.
func timedDrain(ctx context.Context, b *testing.B, pool *pgxpool.Pool, cfg outbox.SubscriberConfig, obs *metrics.Observer, pub message.Publisher, done <-chan struct{}, delivered *atomic.Int64, n int) (took, cpu time.Duration) {
	sub, err := outbox.NewSubscriber(pool, cfg, nil)
	if err != nil {
		b.Fatal(err)
	}
	if obs != nil {
		go obs.SampleBacklog(ctx, sub)
	}
	f, err := forwarder.New(sub, pub, forwarder.Config{}, nil)
	if err != nil {
		b.Fatal(err)
	}
	runtime.GC() // the previous drain's garbage is not this one's cost
	cpu0 := cpuTime()
	start := time.Now()
	go func() { _ = f.Run(ctx) }()
	select {
	case <-done:
	case <-time.After(5 * time.Minute):
		b.Fatalf("drain of %d events did not finish: %d delivered", n, delivered.Load())
	}
	took = time.Since(start)
	cpu = cpuTime() - cpu0
	_ = f.Close()
	return took, cpu
}

// cpuTime is this process's user and system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// obsWrite runs txs transactions of one Enqueue each, with a sampled span in ctx, and returns
// transactions/s.
func obsWrite(b *testing.B, txs int, capture bool) float64 {
	b.Helper()
	pool := pgtest.Require(b)
	ctx := context.Background()
	schema := outbox.SchemaConfig{Table: pgtest.Table(b)}
	if err := outbox.Migrate(ctx, pool, schema); err != nil {
		b.Fatal(err)
	}
	cfg := outbox.PublisherConfig{Schema: schema}
	if capture {
		cfg.InjectHeaders = tracing.InjectHeaders(nil)
	}
	tp := sdktrace.NewTracerProvider()
	sctx, span := tp.Tracer("bench").Start(ctx, "request")
	defer span.End()
	start := time.Now()
	for i := range txs {
		err := pgx.BeginFunc(sctx, pool, func(tx pgx.Tx) error {
			pub, err := outbox.NewPublisher(tx, cfg, nil)
			if err != nil {
				return err
			}
			_, err = pub.Enqueue(sctx, outbox.EventInput{Topic: "bench.write", Payload: map[string]any{"n": i}, OrderingKey: fmt.Sprintf("k%d", i%50)})
			return err
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	return float64(txs) / time.Since(start).Seconds()
}

// spanCounter is a span processor that counts the spans ended (recorded ones only: the SDK
// hands no other to its processors) and their links, kept and dropped.
type spanCounter struct{ n, links, dropped atomic.Int64 }

func (c *spanCounter) OnStart(context.Context, sdktrace.ReadWriteSpan) {}
func (c *spanCounter) OnEnd(s sdktrace.ReadOnlySpan) {
	c.n.Add(1)
	c.links.Add(int64(len(s.Links())))
	c.dropped.Add(int64(s.DroppedLinks()))
}
func (c *spanCounter) Shutdown(context.Context) error   { return nil }
func (c *spanCounter) ForceFlush(context.Context) error { return nil }
