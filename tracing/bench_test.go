package tracing_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/forwarder"
	"github.com/watermill-outbox/outbox/metrics"
	"github.com/watermill-outbox/outbox/metrics/prom"
	"github.com/watermill-outbox/outbox/tracing"
)

// BenchmarkPerEventCost measures what metrics and tracing add to one delivery, without a
// database: a tracing.Publisher publish (batching no-op exporter) plus the metrics hooks of a
// delivered event and its share of a claim and a mark, against a bare publish, in one run.
// It reports the bare cost and what metrics, and metrics with tracing, add (ns/event).
func BenchmarkPerEventCost(b *testing.B) {
	rec, err := prom.New(prometheus.NewRegistry())
	if err != nil {
		b.Fatal(err)
	}
	obs, _ := metrics.New(rec, metrics.Config{})
	hooks := obs.Hooks()
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(tracetest.NewNoopExporter()))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	ctx, span := tp.Tracer("app").Start(context.Background(), "write")
	span.End()
	headers := map[string]string{}
	tracing.InjectHeaders(nil)(ctx, func(k, v string) { headers[k] = v })
	bare := forwarder.Func(func(context.Context, *message.Message) error { return nil })
	traced := tracing.Publisher(bare, tracing.Config{TracerProvider: tp})
	msg := func() *message.Message {
		m := message.NewMessage("0190a5e6-0000-7000-8000-000000000000", []byte(`{"n":1}`))
		for k, v := range headers {
			m.Metadata[k] = v
		}
		m.Metadata[outbox.MetadataTopic] = "orders.created"
		m.Metadata[outbox.MetadataAttempt] = "1"
		return m
	}
	// mode 0: bare publish; 1: plus the metrics hooks; 2: plus tracing.
	run := func(n, mode int) time.Duration {
		start := time.Now()
		for i := range n {
			m := msg()
			if mode == 2 {
				_ = traced.Publish("orders.created", m)
			} else {
				_ = bare.Publish("orders.created", m)
			}
			if mode >= 1 {
				hooks.OnDelivered(outbox.DeliveredInfo{Topic: "orders.created", Delay: time.Millisecond})
				if i%100 == 0 {
					hooks.OnClaim(outbox.ClaimInfo{Events: 100, Duration: time.Millisecond})
					hooks.OnMark(outbox.MarkInfo{Events: 100, Duration: time.Millisecond})
				}
			}
		}
		return time.Since(start)
	}
	b.ResetTimer()
	var took [3]time.Duration
	for range b.N {
		for mode := range 3 {
			took[mode] += run(1000, mode)
		}
	}
	n := float64(b.N * 1000)
	b.ReportMetric(float64(took[0].Nanoseconds())/n, "off-ns/event")
	b.ReportMetric(float64((took[1]-took[0]).Nanoseconds())/n, "metrics-added-ns/event")
	b.ReportMetric(float64((took[2]-took[0]).Nanoseconds())/n, "metrics+tracing-added-ns/event")
}

// BenchmarkSpans measures the relay's spans alone (SDK provider sampling every span, batching
// to a no-op exporter), per event: "process" is a Publish of one event with a sampled writer's
// context (one process span), "send" a PublishBatch of 1,000 such events (one send span with
// 1,000 links), "skip" a Publish of an event whose writer's context is not sampled.
func BenchmarkSpans(b *testing.B) {
	limits := sdktrace.NewSpanLimits()
	limits.LinkCountLimit = 1000
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(tracetest.NewNoopExporter()), sdktrace.WithRawSpanLimits(limits))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	sampled, _ := writerHeaders(b, true)
	unsampled, _ := writerHeaders(b, false)
	bare := forwarder.Func(func(context.Context, *message.Message) error { return nil })
	traced := tracing.Publisher(bare, tracing.Config{TracerProvider: tp})
	b.Run("process", func(b *testing.B) {
		m := eventMessage("0190a5e6-0000-7000-8000-000000000000", sampled)
		b.ReportAllocs()
		for range b.N {
			_ = traced.Publish("orders.created", m)
		}
	})
	b.Run("skip", func(b *testing.B) {
		m := eventMessage("0190a5e6-0000-7000-8000-000000000000", unsampled)
		b.ReportAllocs()
		for range b.N {
			_ = traced.Publish("orders.created", m)
		}
	})
	b.Run("send", func(b *testing.B) {
		bp := tracing.Publisher(nopBatch{}, tracing.Config{TracerProvider: tp}).(forwarder.BatchPublisher)
		batch := make([]forwarder.Outgoing, 1000)
		for i := range batch {
			batch[i] = forwarder.Outgoing{Topic: "orders.created", Message: eventMessage("0190a5e6-0000-7000-8000-"+strconv.Itoa(100000000000+i), sampled)}
		}
		b.ReportAllocs()
		for range b.N {
			_ = bp.PublishBatch(context.Background(), batch)
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(batch)), "ns/event")
	})
}

// nopBatch is a BatchPublisher that takes every message and does nothing.
type nopBatch struct{ forwarder.Func }

func (nopBatch) PublishBatch(_ context.Context, batch []forwarder.Outgoing) []error {
	return make([]error, len(batch))
}
