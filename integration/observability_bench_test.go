package integration_test

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
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
// (default 20000), OUTBOX_BENCH_ROUNDS the rounds (default 3).
func BenchmarkObservabilityOverhead(b *testing.B) {
	n := fwdBenchEnv("OUTBOX_BENCH_EVENTS", 20000)
	rounds := fwdBenchEnv("OUTBOX_BENCH_ROUNDS", 3)
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
					rate, cpu := obsDrain(b, n, mode >= 1, mode == 2)
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
		b.Logf("rates off %v metrics %v on %v; cpu µs/event off %v metrics %v on %v", rates[0], rates[1], rates[2], cpus[0], cpus[1], cpus[2])
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

// obsDrain drains n events to a destination that does nothing, with metrics (observe) and
// tracing (trace) on or off, and returns events/s and this process's CPU µs per event.
func obsDrain(b *testing.B, n int, observe, trace bool) (float64, float64) {
	b.Helper()
	pool := pgtest.Require(b)
	schema := fwdBenchSeed(b, "bench.obs", n, 100)
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
	if trace {
		tp = sdktrace.NewTracerProvider(sdktrace.WithBatcher(tracetest.NewNoopExporter()))
		pub = tracing.Publisher(pub, tracing.Config{TracerProvider: tp})
	}
	sub, err := outbox.NewSubscriber(pool, outbox.SubscriberConfig{Schema: schema, BatchSize: 1000, PollInterval: 10 * time.Millisecond, Hooks: hooks}, nil)
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
	took := time.Since(start)
	cpu := cpuTime() - cpu0
	_ = f.Close()
	if tp != nil {
		_ = tp.Shutdown(context.Background())
	}
	return float64(n) / took.Seconds(), float64(cpu.Microseconds()) / float64(n)
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
