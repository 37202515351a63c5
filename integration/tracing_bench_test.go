package integration_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
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

// tcModes are the variants of BenchmarkTracingCost: both observability features off; metrics
// and tracing with every span sampled (provider AlwaysSample, every writer's context sampled);
// metrics and tracing with a parent-based 10 % sampler (provider
// ParentBased(TraceIDRatioBased(0.1)), 10 % of the writers' contexts sampled, as writers with
// the same sampler give).
var tcModes = []string{"off", "always", "ratio10"}

// tcParts are variants run only when OUTBOX_BENCH_MODES names them, to take the cost apart:
// metrics alone (no tracer), and tracing alone with every span sampled (no metrics).
var tcParts = []string{"metrics", "tracing"}

// tcBatchSize is the drains' SubscriberConfig.BatchSize (and so the largest batch).
const tcBatchSize = 1000

// BenchmarkTracingCost measures what metrics and tracing cost the relay draining 20,000 events
// (OUTBOX_BENCH_EVENTS) to a destination that does nothing, on the per-message path (a
// forwarder.Func: a process span per sampled event) and on the batch path (a BatchPublisher: a
// send span per call linking every event), in the variants of tcModes, interleaved in one run
// (each round runs them in a rotated order; OUTBOX_BENCH_ROUNDS rounds, default 3;
// OUTBOX_BENCH_PATH=per-message or batch runs one path only, OUTBOX_BENCH_MODES=always,off some
// variants only, e.g. for a CPU profile of one). It reports
// per path and variant the median events/s and this process's CPU µs per event (getrusage: the
// relay and the tracer, not the database), the ratios to off (by rate and by CPU: off CPU / on
// CPU), and the CPU ns per event each variant adds. Each traced drain fails unless exactly the
// expected spans (per-message) or links (batch, always) were recorded.
func BenchmarkTracingCost(b *testing.B) {
	n := fwdBenchEnv("OUTBOX_BENCH_EVENTS", 20000)
	rounds := fwdBenchEnv("OUTBOX_BENCH_ROUNDS", 3)
	for _, batch := range []bool{false, true} {
		name := "per-message"
		if batch {
			name = "batch"
		}
		if p := os.Getenv("OUTBOX_BENCH_PATH"); p != "" && p != name {
			continue
		}
		b.Run(name, func(b *testing.B) {
			rates := map[string][]float64{}
			cpus := map[string][]float64{}
			for range b.N {
				for r := range rounds {
					all := slices.Concat(tcModes, tcParts)
					for i := range all {
						mode := all[(i+r)%len(all)]
						only := os.Getenv("OUTBOX_BENCH_MODES")
						if only != "" && !slices.Contains(strings.Split(only, ","), mode) || only == "" && slices.Contains(tcParts, mode) {
							continue
						}
						rate, cpu := tcDrain(b, n, batch, mode)
						rates[mode] = append(rates[mode], rate)
						cpus[mode] = append(cpus[mode], cpu)
					}
				}
			}
			b.Logf("%s: rates %v; cpu µs/event %v", name, rates, cpus)
			if len(rates["off"]) == 0 {
				return // OUTBOX_BENCH_MODES without off: no ratios
			}
			off, cOff := median(rates["off"]), median(cpus["off"])
			b.ReportMetric(off, "off-events/s")
			b.ReportMetric(cOff, "off-cpu-µs/event")
			for _, mode := range slices.Concat(tcModes[1:], tcParts) {
				if len(rates[mode]) == 0 {
					continue
				}
				rate, cpu := median(rates[mode]), median(cpus[mode])
				b.ReportMetric(rate, mode+"-events/s")
				b.ReportMetric(cpu, mode+"-cpu-µs/event")
				b.ReportMetric(rate/off, mode+"-off-ratio")
				b.ReportMetric(cOff/cpu, mode+"-off-cpu-ratio")
				b.ReportMetric((cpu-cOff)*1000, mode+"-added-cpu-ns/event")
			}
		})
	}
}

// nopBatch is a BatchPublisher that takes every message and does nothing.
type nopBatch struct{ forwarder.Func }

func (nopBatch) PublishBatch(_ context.Context, batch []forwarder.Outgoing) []error {
	return make([]error, len(batch))
}

// tcDrain drains n events in mode (tcModes, tcParts) on the batch or the per-message path and returns
// events/s and this process's CPU µs per event.
func tcDrain(b *testing.B, n int, batch bool, mode string) (float64, float64) {
	b.Helper()
	pool := pgtest.Require(b)
	pct := 100
	if mode == "ratio10" {
		pct = 10
	}
	headers := fmt.Sprintf(`json_build_object('trace-id', 'bench', 'traceparent', '%s' || CASE WHEN g %% 100 < %d THEN '1' ELSE '0' END)`, obsWriterContext, pct)
	schema := fwdBenchSeedHeaders(b, "bench.tracing", n, 100, headers)
	var delivered atomic.Int64
	done := make(chan struct{})
	hooks := outbox.Hooks{OnDelivered: func(outbox.DeliveredInfo) {
		if delivered.Add(1) == int64(n) {
			close(done)
		}
	}}
	var pub message.Publisher = forwarder.Func(func(context.Context, *message.Message) error { return nil })
	if batch {
		pub = nopBatch{}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var obs *metrics.Observer
	var tp *sdktrace.TracerProvider
	var ended spanCounter
	if mode != "off" && mode != "tracing" {
		rec, err := prom.New(prometheus.NewRegistry())
		if err != nil {
			b.Fatal(err)
		}
		if obs, err = metrics.New(rec, metrics.Config{}); err != nil {
			b.Fatal(err)
		}
		hooks = metrics.ComposeHooks(hooks, obs.Hooks())
	}
	if mode != "off" && mode != "metrics" {
		sampler := sdktrace.AlwaysSample()
		if mode == "ratio10" {
			sampler = sdktrace.ParentBased(sdktrace.TraceIDRatioBased(0.1))
		}
		limits := sdktrace.NewSpanLimits()
		limits.LinkCountLimit = tcBatchSize // a send span links every event of a batch
		tp = sdktrace.NewTracerProvider(sdktrace.WithSampler(sampler), sdktrace.WithRawSpanLimits(limits),
			sdktrace.WithBatcher(tracetest.NewNoopExporter()), sdktrace.WithSpanProcessor(&ended))
		pub = tracing.Publisher(pub, tracing.Config{TracerProvider: tp})
	}
	took, cpu := timedDrain(ctx, b, pool, outbox.SubscriberConfig{Schema: schema, BatchSize: tcBatchSize, PollInterval: 10 * time.Millisecond, Hooks: hooks}, obs, pub, done, &delivered, n)
	if tp != nil {
		_ = tp.Shutdown(context.Background())
		var sampled int64 // events g (1…n) with g % 100 < pct, as the seeded headers
		for g := 1; g <= n; g++ {
			if g%100 < pct {
				sampled++
			}
		}
		switch {
		case !batch && ended.n.Load() != sampled:
			b.Fatalf("%s: %d process spans recorded, want %d", mode, ended.n.Load(), sampled)
		case batch && mode == "always" && (ended.links.Load() != int64(n) || ended.dropped.Load() != 0):
			b.Fatalf("%s: send spans linked %d events (%d links dropped), want %d", mode, ended.links.Load(), ended.dropped.Load(), n)
		}
	}
	return float64(n) / took.Seconds(), float64(cpu.Microseconds()) / float64(n)
}
