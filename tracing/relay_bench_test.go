package tracing_test

import (
	"context"
	"os"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/forwarder"
	"github.com/watermill-outbox/outbox/metrics"
	"github.com/watermill-outbox/outbox/metrics/prom"
	"github.com/watermill-outbox/outbox/tracing"
)

// fakeOutbox is a forwarder.Subscriber without a database: Subscribe emits n messages built
// as the outbox Subscriber builds them (metadata, a cancelable context), at most concurrency
// out at a time, each answered message awaited on its own goroutine, and calls hooks as the
// Subscriber does (OnDelivered per ack, OnClaim and OnMark per 100 events). done is closed
// once every message was answered.
type fakeOutbox struct {
	n, concurrency int
	headers        map[string]string
	hooks          outbox.Hooks
	done           chan struct{}
	closed         chan struct{} // closed by Close: the message channel closes
}

func (f *fakeOutbox) Subscribe(ctx context.Context, _ string) (<-chan *message.Message, error) {
	out := make(chan *message.Message)
	go func() {
		defer close(out)
		sem := make(chan struct{}, f.concurrency)
		var wg sync.WaitGroup
		for i := range f.n {
			sem <- struct{}{}
			if i%100 == 0 && f.hooks.OnClaim != nil {
				f.hooks.OnClaim(outbox.ClaimInfo{Events: 100, Duration: time.Millisecond})
				f.hooks.OnMark(outbox.MarkInfo{Events: 100, Duration: time.Millisecond})
			}
			msg := message.NewMessage("0190a5e6-0000-7000-8000-"+strconv.Itoa(100000000000+i), []byte(`{"n":1,"text":"some event payload of a typical size"}`))
			for k, v := range f.headers {
				msg.Metadata[k] = v
			}
			msg.Metadata[outbox.MetadataEventID] = msg.UUID
			msg.Metadata[outbox.MetadataTopic] = "orders.created"
			msg.Metadata[outbox.MetadataOrderingKey] = "key-" + strconv.Itoa(i%100)
			msg.Metadata[outbox.MetadataSequence] = strconv.Itoa(i)
			msg.Metadata[outbox.MetadataAttempt] = "1"
			mctx, cancel := context.WithCancel(ctx)
			msg.SetContext(mctx)
			select {
			case out <- msg:
			case <-ctx.Done():
				cancel()
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer cancel()
				select {
				case <-msg.Acked():
					if f.hooks.OnDelivered != nil {
						f.hooks.OnDelivered(outbox.DeliveredInfo{Topic: "orders.created", Delay: time.Millisecond})
					}
				case <-msg.Nacked():
				}
				<-sem
			}()
		}
		wg.Wait()
		close(f.done)
		select {
		case <-ctx.Done():
		case <-f.closed:
		}
	}()
	return out, nil
}

func (f *fakeOutbox) SubscribeBatches(context.Context, string) (<-chan outbox.Batch, error) {
	return nil, nil
}

func (f *fakeOutbox) Close() error {
	close(f.closed)
	return nil
}

// cpuTime is this process's user and system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkRelayPathCost is the relay's per-message path without a database: a Forwarder
// (Watermill router, one goroutine per message) over a fake outbox emitting 20,000 messages
// to a destination that does nothing, with metrics (Prometheus recorder) and tracing
// (tracing.Publisher, SDK provider sampling every span, batching to a no-op exporter) off,
// metrics only, and both on; rounds alternate the order (ABC CBA …). It reports the process's
// CPU µs per message in each mode (medians) and what metrics and tracing add. The events'
// trace context is OUTBOX_BENCH_TRACE's (see benchTraceHeaders); OUTBOX_BENCH_EVENTS and
// OUTBOX_BENCH_ROUNDS set the messages per run (20,000) and the rounds (5).
func BenchmarkRelayPathCost(b *testing.B) {
	n, rounds := benchEnv("OUTBOX_BENCH_EVENTS", 20000), benchEnv("OUTBOX_BENCH_ROUNDS", 5)
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(tracetest.NewNoopExporter()))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	headers, cfg := benchTraceHeaders(b, tp)
	run := func(mode int) float64 {
		f := &fakeOutbox{n: n, concurrency: outbox.DefaultConcurrency, done: make(chan struct{}), closed: make(chan struct{}), headers: headers}
		var pub message.Publisher = forwarder.Func(func(context.Context, *message.Message) error { return nil })
		if mode >= 1 {
			rec, err := prom.New(prometheus.NewRegistry())
			if err != nil {
				b.Fatal(err)
			}
			obs, _ := metrics.New(rec, metrics.Config{})
			f.hooks = obs.Hooks()
		}
		if mode == 2 {
			pub = tracing.Publisher(pub, cfg)
		}
		fw, err := forwarder.New(f, pub, forwarder.Config{}, nil)
		if err != nil {
			b.Fatal(err)
		}
		cpu0 := cpuTime()
		go func() { _ = fw.Run(context.Background()) }()
		<-f.done
		cpu := cpuTime() - cpu0
		_ = fw.Close()
		return float64(cpu.Nanoseconds()) / 1000 / float64(n)
	}
	cpus := make([][]float64, 3)
	for range b.N {
		for r := range rounds {
			for i := range 3 {
				mode := i
				if r%2 == 1 {
					mode = 2 - i
				}
				cpus[mode] = append(cpus[mode], run(mode))
			}
		}
	}
	med := func(v []float64) float64 { v = slices.Clone(v); slices.Sort(v); return v[len(v)/2] }
	off, met, on := med(cpus[0]), med(cpus[1]), med(cpus[2])
	b.ReportMetric(off, "off-cpu-µs/msg")
	b.ReportMetric(met-off, "metrics-added-cpu-µs/msg")
	b.ReportMetric(on-off, "metrics+tracing-added-cpu-µs/msg")
	b.Logf("cpu µs/msg off %v metrics %v on %v", cpus[0], cpus[1], cpus[2])
}

func benchEnv(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// benchTraceHeaders returns the writer's trace headers of the benchmarks' events and the
// tracing.Config, by OUTBOX_BENCH_TRACE: "sampled" (the default; a sampled writer's
// traceparent, a recorded delivery span each), "unsampled" (a writer's traceparent, not
// sampled), "none" (no trace headers) or "roots" (none, with Config.RootSpans: a new trace
// per delivery).
func benchTraceHeaders(b *testing.B, tp *sdktrace.TracerProvider) (map[string]string, tracing.Config) {
	cfg := tracing.Config{TracerProvider: tp}
	headers := map[string]string{}
	ctx, span := tp.Tracer("app").Start(context.Background(), "write")
	span.End()
	switch mode := os.Getenv("OUTBOX_BENCH_TRACE"); mode {
	case "", "sampled":
	case "unsampled":
		ctx = trace.ContextWithSpanContext(ctx, span.SpanContext().WithTraceFlags(0))
	case "none":
		return headers, cfg
	case "roots":
		cfg.RootSpans = true
		return headers, cfg
	default:
		b.Fatalf("OUTBOX_BENCH_TRACE=%q: want sampled, unsampled, none or roots", mode)
	}
	tracing.InjectHeaders(nil)(ctx, func(k, v string) { headers[k] = v })
	return headers, cfg
}
