// Package prom implements metrics.Recorder with Prometheus (github.com/prometheus/client_golang).
// Metric names and meanings are listed in the README's "Operating the relay" section; every
// name starts with "outbox_".
package prom

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/metrics"
)

// DelayBuckets are the buckets (seconds) of outbox_delivery_delay_seconds: 5ms to about 1h.
var DelayBuckets = prometheus.ExponentialBuckets(0.005, 3, 13)

// DurationBuckets are the buckets (seconds) of the claim and mark durations: 0.5ms to about 4.8s.
var DurationBuckets = prometheus.ExponentialBuckets(0.0005, 2.5, 11)

// CallBuckets are the buckets (seconds) of outbox_destination_call_duration_seconds:
// DurationBuckets plus 10s, 30s and 60s, so that calls up to webhook.DefaultTimeout and the
// Subscriber's DeliveryTimeout (30s) are measured, not folded into +Inf.
var CallBuckets = append(DurationBuckets[:len(DurationBuckets):len(DurationBuckets)], 10, 30, 60)

// SizeBuckets are the buckets (events) of outbox_claim_events.
var SizeBuckets = []float64{0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000}

// Recorder is a metrics.Recorder that updates Prometheus collectors. Safe for concurrent use.
type Recorder struct {
	delivered, failed, dead, unavailable *prometheus.CounterVec
	leaseLost, markFailures, backlogErr  prometheus.Counter
	delay                                *prometheus.HistogramVec
	claimDur, claimSize, markDur         prometheus.Histogram
	pending, deadGauge, oldest, unavail  prometheus.Gauge
	held                                 prometheus.Gauge
	destDown                             *prometheus.GaugeVec
	destHeld                             *prometheus.CounterVec
	destCall                             *prometheus.HistogramVec
	relayUp, subsRunning                 prometheus.Gauge
	written, writeDup, writeInvalid      *prometheus.CounterVec
	writeDur                             *prometheus.HistogramVec

	byTopic sync.Map // topic → *topicSeries
}

// topicSeries are the children of one topic label, looked up once.
type topicSeries struct {
	delivered prometheus.Counter
	delay     prometheus.Observer
}

func (r *Recorder) series(topic string) *topicSeries {
	if s, ok := r.byTopic.Load(topic); ok {
		return s.(*topicSeries)
	}
	s, _ := r.byTopic.LoadOrStore(topic, &topicSeries{delivered: r.delivered.WithLabelValues(topic), delay: r.delay.WithLabelValues(topic)})
	return s.(*topicSeries)
}

var _ metrics.Recorder = (*Recorder)(nil)

// New returns a Recorder whose collectors are registered with reg (nil means
// prometheus.DefaultRegisterer). Errors: the registry's error, for example an
// AlreadyRegisteredError when reg already holds outbox metrics.
func New(reg prometheus.Registerer) (*Recorder, error) {
	if reg == nil {
		reg = prometheus.DefaultRegisterer
	}
	topic := []string{"topic"}
	r := &Recorder{
		delivered:    prometheus.NewCounterVec(prometheus.CounterOpts{Name: "outbox_delivered_total", Help: "Events delivered and marked published."}, topic),
		failed:       prometheus.NewCounterVec(prometheus.CounterOpts{Name: "outbox_failed_total", Help: "Failed deliveries that will be retried."}, topic),
		dead:         prometheus.NewCounterVec(prometheus.CounterOpts{Name: "outbox_dead_lettered_total", Help: "Events dead-lettered."}, topic),
		unavailable:  prometheus.NewCounterVec(prometheus.CounterOpts{Name: "outbox_unavailable_total", Help: "Events released because their destination was unavailable (no attempt counted)."}, topic),
		leaseLost:    prometheus.NewCounter(prometheus.CounterOpts{Name: "outbox_lease_lost_events_total", Help: "Events whose lease another relay took over while this one held them."}),
		markFailures: prometheus.NewCounter(prometheus.CounterOpts{Name: "outbox_mark_failures_total", Help: "Mark statements that failed."}),
		backlogErr:   prometheus.NewCounter(prometheus.CounterOpts{Name: "outbox_backlog_sample_failures_total", Help: "Backlog samples that failed (the backlog gauges keep their last value)."}),
		delay:        prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "outbox_delivery_delay_seconds", Help: "Time from the event's commit (created_at) to its mark as published, database clock.", Buckets: DelayBuckets}, topic),
		claimDur:     prometheus.NewHistogram(prometheus.HistogramOpts{Name: "outbox_claim_duration_seconds", Help: "Duration of claim statements.", Buckets: DurationBuckets}),
		claimSize:    prometheus.NewHistogram(prometheus.HistogramOpts{Name: "outbox_claim_events", Help: "Events leased per claim statement (0 for an empty claim).", Buckets: SizeBuckets}),
		markDur:      prometheus.NewHistogram(prometheus.HistogramOpts{Name: "outbox_mark_duration_seconds", Help: "Duration of mark statements.", Buckets: DurationBuckets}),
		pending:      prometheus.NewGauge(prometheus.GaugeOpts{Name: "outbox_pending_events", Help: "Events neither published nor dead-lettered (last Backlog sample)."}),
		deadGauge:    prometheus.NewGauge(prometheus.GaugeOpts{Name: "outbox_dead_lettered_events", Help: "Dead-lettered events in the table (last Backlog sample)."}),
		oldest:       prometheus.NewGauge(prometheus.GaugeOpts{Name: "outbox_oldest_pending_age_seconds", Help: "Age of the oldest pending event, database clock; 0 when nothing is pending (last Backlog sample)."}),
		unavail:      prometheus.NewGauge(prometheus.GaugeOpts{Name: "outbox_unavailable_events", Help: "Pending events held by an unavailable destination: every pending event of a topic whose destination answered unavailable at the last delivery (last Backlog sample)."}),
		held:         prometheus.NewGauge(prometheus.GaugeOpts{Name: "outbox_held_events", Help: "Pending events waiting behind a dead-lettered or failed (attempts > 0) head of their ordering key (last Backlog sample)."}),
		destDown:     prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "outbox_destination_unavailable", Help: "1 while a subscription of this relay treats the destination as unavailable, else 0."}, []string{"destination"}),
		destHeld: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "outbox_destination_held_total",
			Help: "Events held back for their destination (not sent, no attempt counted); reason outage, rate or in_flight."}, []string{"destination", "reason"}),
		destCall: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "outbox_destination_call_duration_seconds",
			Help: "Duration of calls to the destination (one message, or one batch for batching destinations); outcome ok or error.", Buckets: CallBuckets}, []string{"destination", "outcome"}),
		relayUp:     prometheus.NewGauge(prometheus.GaugeOpts{Name: "outbox_relay_up", Help: "1 while every subscription of the relay is running, else 0."}),
		subsRunning: prometheus.NewGauge(prometheus.GaugeOpts{Name: "outbox_subscriptions_running", Help: "Subscriptions of the relay that are running."}),
		written:     prometheus.NewCounterVec(prometheus.CounterOpts{Name: "outbox_written_events_total", Help: "Events written to the outbox table by Publishers (inside a transaction: before its COMMIT)."}, topic),
		writeDup:    prometheus.NewCounterVec(prometheus.CounterOpts{Name: "outbox_write_duplicates_total", Help: "Events a Publisher was given whose idempotency key existed already (nothing stored)."}, topic),
		writeInvalid: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "outbox_write_validation_errors_total",
			Help: "Publisher calls refused by validation before any SQL, by the refused part of the event."}, []string{"field"}),
		writeDur: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "outbox_write_duration_seconds",
			Help: "Duration of Publisher calls (Publish, Enqueue …); outcome ok, invalid or error.", Buckets: DurationBuckets}, []string{"outcome"}),
	}
	var registered []prometheus.Collector
	for _, c := range []prometheus.Collector{r.relayUp, r.subsRunning, r.written, r.writeDup, r.writeInvalid, r.writeDur,
		r.delivered, r.failed, r.dead, r.unavailable, r.leaseLost, r.markFailures, r.backlogErr,
		r.delay, r.claimDur, r.claimSize, r.markDur, r.pending, r.deadGauge, r.oldest, r.unavail, r.held, r.destDown, r.destHeld, r.destCall} {
		if err := reg.Register(c); err != nil {
			for _, done := range registered { // all or nothing: no orphan series
				reg.Unregister(done)
			}
			return nil, err
		}
		registered = append(registered, c)
	}
	return r, nil
}

// Delivered implements metrics.Recorder.
func (r *Recorder) Delivered(topic string, delay time.Duration) {
	s := r.series(topic)
	s.delivered.Inc()
	s.delay.Observe(delay.Seconds())
}

// Failed implements metrics.Recorder.
func (r *Recorder) Failed(topic string) { r.failed.WithLabelValues(topic).Inc() }

// DeadLettered implements metrics.Recorder.
func (r *Recorder) DeadLettered(topic string) { r.dead.WithLabelValues(topic).Inc() }

// Unavailable implements metrics.Recorder.
func (r *Recorder) Unavailable(topic string) { r.unavailable.WithLabelValues(topic).Inc() }

// LeaseLost implements metrics.Recorder.
func (r *Recorder) LeaseLost(events int) { r.leaseLost.Add(float64(events)) }

// Claim implements metrics.Recorder.
func (r *Recorder) Claim(events int, d time.Duration) {
	r.claimDur.Observe(d.Seconds())
	r.claimSize.Observe(float64(events))
}

// Mark implements metrics.Recorder.
func (r *Recorder) Mark(d time.Duration, failed bool) {
	r.markDur.Observe(d.Seconds())
	if failed {
		r.markFailures.Inc()
	}
}

// Backlog implements metrics.Recorder.
func (r *Recorder) Backlog(b outbox.Backlog) {
	r.pending.Set(float64(b.Pending))
	r.deadGauge.Set(float64(b.DeadLettered))
	r.oldest.Set(b.OldestPendingAge.Seconds())
	r.unavail.Set(float64(b.Unavailable))
	r.held.Set(float64(b.Held))
}

// BacklogFailed implements metrics.Recorder.
func (r *Recorder) BacklogFailed() { r.backlogErr.Inc() }

// DestinationCall implements metrics.Recorder.
func (r *Recorder) DestinationCall(destination string, d time.Duration, ok bool) {
	outcome := "ok"
	if !ok {
		outcome = "error"
	}
	r.destCall.WithLabelValues(destination, outcome).Observe(d.Seconds())
}

// DestinationUnavailable implements metrics.Recorder.
func (r *Recorder) DestinationUnavailable(destination string, down bool) {
	v := 0.0
	if down {
		v = 1
	}
	r.destDown.WithLabelValues(destination).Set(v)
}

// Held implements metrics.HeldRecorder.
func (r *Recorder) Held(destination, reason string) {
	r.destHeld.WithLabelValues(destination, reason).Inc()
}

// Subscriptions implements metrics.Recorder.
func (r *Recorder) Subscriptions(running, total int) {
	up := 0.0
	if total > 0 && running == total {
		up = 1
	}
	r.relayUp.Set(up)
	r.subsRunning.Set(float64(running))
}

// Written implements metrics.Recorder.
func (r *Recorder) Written(topic string, duplicate bool) {
	if duplicate {
		r.writeDup.WithLabelValues(topic).Inc()
		return
	}
	r.written.WithLabelValues(topic).Inc()
}

// WriteInvalid implements metrics.Recorder.
func (r *Recorder) WriteInvalid(field string) { r.writeInvalid.WithLabelValues(field).Inc() }

// WriteCall implements metrics.Recorder.
func (r *Recorder) WriteCall(d time.Duration, outcome string) {
	r.writeDur.WithLabelValues(outcome).Observe(d.Seconds())
}
