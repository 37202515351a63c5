// Package otel implements metrics.Recorder with OpenTelemetry metrics
// (go.opentelemetry.io/otel/metric). Instrument names are the Prometheus names of package
// metrics/prom with dots ("outbox.delivered" for outbox_delivered_total), units in UCUM
// ("s", "{event}"), and the same attributes (topic, destination); an OTel Prometheus exporter
// therefore exposes nearly the same series.
package otel

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/metrics"
)

// ScopeName is the instrumentation scope of the meter the Recorder uses.
const ScopeName = "github.com/watermill-outbox/outbox/metrics/otel"

// Recorder is a metrics.Recorder that records to OpenTelemetry instruments. Safe for
// concurrent use.
type Recorder struct {
	delivered, failed, dead, unavailable metric.Int64Counter
	leaseLost, markFailures, backlogErr  metric.Int64Counter
	delay, claimDur, markDur             metric.Float64Histogram
	claimSize                            metric.Int64Histogram
	pending, deadGauge, unavail, held    metric.Int64Gauge
	oldest                               metric.Float64Gauge
	destDown                             metric.Int64Gauge
	destHeld                             metric.Int64Counter
	destCall                             metric.Float64Histogram
	relayUp, subsRunning                 metric.Int64Gauge
	written, writeDup, writeInvalid      metric.Int64Counter
	writeDur                             metric.Float64Histogram

	topics  sync.Map     // topic → *topicOpts
	nTopics atomic.Int64 // entries in topics (bounded by maxCachedTopics)
}

// maxCachedTopics bounds the cache of topic attribute sets; topics beyond it get their set
// built per measurement. Topics are bounded labels already (metrics.Config), so the bound
// only matters for a Recorder used directly.
const maxCachedTopics = 1000

var _ metrics.Recorder = (*Recorder)(nil)

// New returns a Recorder whose instruments come from mp's meter ScopeName; nil mp means the
// global otel.GetMeterProvider(). Errors: an instrument's creation error.
func New(mp metric.MeterProvider) (*Recorder, error) {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	m := mp.Meter(ScopeName)
	r := &Recorder{}
	var err error
	ev := metric.WithUnit("{event}")
	counter := func(dst *metric.Int64Counter, name, desc string) {
		if err == nil {
			*dst, err = m.Int64Counter(name, metric.WithDescription(desc), ev)
		}
	}
	counter(&r.delivered, "outbox.delivered", "Events delivered and marked published.")
	counter(&r.failed, "outbox.failed", "Failed deliveries that will be retried.")
	counter(&r.dead, "outbox.dead_lettered", "Events dead-lettered.")
	counter(&r.unavailable, "outbox.unavailable", "Events released because their destination was unavailable (no attempt counted).")
	counter(&r.leaseLost, "outbox.lease_lost.events", "Events whose lease another relay took over while this one held them.")
	if err == nil {
		r.markFailures, err = m.Int64Counter("outbox.mark.failures", metric.WithDescription("Mark statements that failed."), metric.WithUnit("{statement}"))
	}
	if err == nil {
		r.backlogErr, err = m.Int64Counter("outbox.backlog.sample_failures", metric.WithDescription("Backlog samples that failed."), metric.WithUnit("{sample}"))
	}
	hist := func(dst *metric.Float64Histogram, name, desc string, bounds []float64) {
		if err == nil {
			*dst, err = m.Float64Histogram(name, metric.WithDescription(desc), metric.WithUnit("s"), metric.WithExplicitBucketBoundaries(bounds...))
		}
	}
	hist(&r.delay, "outbox.delivery.delay", "Time from the event's commit (created_at) to its mark as published, database clock.", delayBounds)
	hist(&r.claimDur, "outbox.claim.duration", "Duration of claim statements.", durationBounds)
	hist(&r.markDur, "outbox.mark.duration", "Duration of mark statements.", durationBounds)
	hist(&r.destCall, "outbox.destination.call.duration", "Duration of calls to the destination (one message, or one batch); attribute outcome ok or error.", callBounds)
	if err == nil {
		r.claimSize, err = m.Int64Histogram("outbox.claim.events", metric.WithDescription("Events leased per claim statement."), ev,
			metric.WithExplicitBucketBoundaries(0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000))
	}
	gauge := func(dst *metric.Int64Gauge, name, desc string) {
		if err == nil {
			*dst, err = m.Int64Gauge(name, metric.WithDescription(desc), ev)
		}
	}
	gauge(&r.pending, "outbox.pending.events", "Events neither published nor dead-lettered (last Backlog sample).")
	gauge(&r.deadGauge, "outbox.dead_lettered.events", "Dead-lettered events in the table (last Backlog sample).")
	gauge(&r.held, "outbox.held.events", "Pending events waiting behind a dead-lettered or failed (attempts > 0) head of their ordering key (last Backlog sample).")
	gauge(&r.unavail, "outbox.unavailable.events", "Pending events held by an unavailable destination: every pending event of a topic whose destination answered unavailable at the last delivery (last Backlog sample).")
	if err == nil {
		r.oldest, err = m.Float64Gauge("outbox.oldest_pending.age", metric.WithDescription("Age of the oldest pending event, database clock (last Backlog sample)."), metric.WithUnit("s"))
	}
	if err == nil {
		r.destHeld, err = m.Int64Counter("outbox.destination.held", metric.WithDescription("Events held back for their destination (not sent, no attempt counted); attributes destination, reason (outage, rate, in_flight)."), metric.WithUnit("{event}"))
	}
	if err == nil {
		r.destDown, err = m.Int64Gauge("outbox.destination.unavailable", metric.WithDescription("1 while a subscription treats the destination as unavailable, else 0."))
	}
	counter(&r.written, "outbox.written", "Events written to the outbox table by Publishers (inside a transaction: before its COMMIT).")
	counter(&r.writeDup, "outbox.write.duplicates", "Events a Publisher was given whose idempotency key existed already (nothing stored).")
	if err == nil {
		r.writeInvalid, err = m.Int64Counter("outbox.write.validation_errors", metric.WithDescription("Publisher calls refused by validation before any SQL; attribute field."), metric.WithUnit("{call}"))
	}
	hist(&r.writeDur, "outbox.write.duration", "Duration of Publisher calls; attribute outcome ok, invalid or error.", durationBounds)
	if err == nil {
		r.relayUp, err = m.Int64Gauge("outbox.relay.up", metric.WithDescription("1 while every subscription of the relay is running, else 0."))
	}
	if err == nil {
		r.subsRunning, err = m.Int64Gauge("outbox.subscriptions.running", metric.WithDescription("Subscriptions of the relay that are running."), metric.WithUnit("{subscription}"))
	}
	if err != nil {
		return nil, err
	}
	return r, nil
}

// delayBounds and durationBounds match metrics/prom's DelayBuckets and DurationBuckets.
var (
	delayBounds    = exp(0.005, 3, 13)
	durationBounds = exp(0.0005, 2.5, 11)
	callBounds     = append(durationBounds[:len(durationBounds):len(durationBounds)], 10, 30, 60)
)

func exp(start, factor float64, n int) []float64 {
	out := make([]float64, n)
	for i := range out {
		out[i] = start
		start *= factor
	}
	return out
}

// ctx is the context of every measurement: hooks carry none, and no exemplar is wanted.
var ctx = context.Background()

// topicOpts are the measurement options of one topic's attribute set, built once: with
// metric.WithAttributes each measurement would build (sort, hash, allocate) the set, and a
// variadic option list allocates its slice on every call.
type topicOpts struct {
	add []metric.AddOption
	rec []metric.RecordOption
}

// topicAttr returns topic's measurement options.
func (r *Recorder) topicAttr(topic string) *topicOpts {
	if o, ok := r.topics.Load(topic); ok {
		return o.(*topicOpts)
	}
	a := metric.WithAttributeSet(attribute.NewSet(attribute.String("topic", topic)))
	o := &topicOpts{add: []metric.AddOption{a}, rec: []metric.RecordOption{a}}
	if r.nTopics.Load() < maxCachedTopics {
		if v, loaded := r.topics.LoadOrStore(topic, o); loaded {
			return v.(*topicOpts)
		}
		r.nTopics.Add(1)
	}
	return o
}

// Delivered implements metrics.Recorder.
func (r *Recorder) Delivered(topic string, delay time.Duration) {
	o := r.topicAttr(topic)
	r.delivered.Add(ctx, 1, o.add...)
	r.delay.Record(ctx, delay.Seconds(), o.rec...)
}

// Failed implements metrics.Recorder.
func (r *Recorder) Failed(topic string) { r.failed.Add(ctx, 1, r.topicAttr(topic).add...) }

// DeadLettered implements metrics.Recorder.
func (r *Recorder) DeadLettered(topic string) { r.dead.Add(ctx, 1, r.topicAttr(topic).add...) }

// Unavailable implements metrics.Recorder.
func (r *Recorder) Unavailable(topic string) { r.unavailable.Add(ctx, 1, r.topicAttr(topic).add...) }

// LeaseLost implements metrics.Recorder.
func (r *Recorder) LeaseLost(events int) { r.leaseLost.Add(ctx, int64(events)) }

// Claim implements metrics.Recorder.
func (r *Recorder) Claim(events int, d time.Duration) {
	r.claimDur.Record(ctx, d.Seconds())
	r.claimSize.Record(ctx, int64(events))
}

// Mark implements metrics.Recorder.
func (r *Recorder) Mark(d time.Duration, failed bool) {
	r.markDur.Record(ctx, d.Seconds())
	if failed {
		r.markFailures.Add(ctx, 1)
	}
}

// Backlog implements metrics.Recorder.
func (r *Recorder) Backlog(b outbox.Backlog) {
	r.pending.Record(ctx, b.Pending)
	r.deadGauge.Record(ctx, b.DeadLettered)
	r.oldest.Record(ctx, b.OldestPendingAge.Seconds())
	r.unavail.Record(ctx, b.Unavailable)
	r.held.Record(ctx, b.Held)
}

// BacklogFailed implements metrics.Recorder.
func (r *Recorder) BacklogFailed() { r.backlogErr.Add(ctx, 1) }

// DestinationCall implements metrics.Recorder.
func (r *Recorder) DestinationCall(destination string, d time.Duration, ok bool) {
	outcome := "ok"
	if !ok {
		outcome = "error"
	}
	r.destCall.Record(ctx, d.Seconds(), metric.WithAttributes(attribute.String("destination", destination), attribute.String("outcome", outcome)))
}

// Held implements metrics.HeldRecorder.
func (r *Recorder) Held(destination, reason string) {
	r.destHeld.Add(ctx, 1, metric.WithAttributes(attribute.String("destination", destination), attribute.String("reason", reason)))
}

// DestinationUnavailable implements metrics.Recorder.
func (r *Recorder) DestinationUnavailable(destination string, down bool) {
	var v int64
	if down {
		v = 1
	}
	r.destDown.Record(ctx, v, metric.WithAttributes(attribute.String("destination", destination)))
}

// Subscriptions implements metrics.Recorder.
func (r *Recorder) Subscriptions(running, total int) {
	var up int64
	if total > 0 && running == total {
		up = 1
	}
	r.relayUp.Record(ctx, up)
	r.subsRunning.Record(ctx, int64(running))
}

// Written implements metrics.Recorder.
func (r *Recorder) Written(topic string, duplicate bool) {
	if duplicate {
		r.writeDup.Add(ctx, 1, r.topicAttr(topic).add...)
		return
	}
	r.written.Add(ctx, 1, r.topicAttr(topic).add...)
}

// WriteInvalid implements metrics.Recorder.
func (r *Recorder) WriteInvalid(field string) {
	r.writeInvalid.Add(ctx, 1, metric.WithAttributes(attribute.String("field", field)))
}

// WriteCall implements metrics.Recorder.
func (r *Recorder) WriteCall(d time.Duration, outcome string) {
	r.writeDur.Record(ctx, d.Seconds(), metric.WithAttributes(attribute.String("outcome", outcome)))
}
