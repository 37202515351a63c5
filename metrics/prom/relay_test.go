package prom_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/forwarder"
	"github.com/watermill-outbox/outbox/health"
	"github.com/watermill-outbox/outbox/internal/pgtest"
	"github.com/watermill-outbox/outbox/metrics"
	"github.com/watermill-outbox/outbox/metrics/otel"
	"github.com/watermill-outbox/outbox/metrics/prom"
)

// TestRelayMetrics drives a relay through deliveries, a retry, a dead letter, an unavailable
// destination and a parked (never relayed) event, then checks every counter and the backlog
// gauges scraped from /metrics and read through an OTel manual reader.
func TestRelayMetrics(t *testing.T) {
	pool := pgtest.Require(t)
	ctx := t.Context()
	schema := outbox.SchemaConfig{Table: pgtest.Table(t)}
	if err := outbox.Migrate(ctx, pool, schema); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	pr, err := prom.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	reader := sdkmetric.NewManualReader()
	or, err := otel.New(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	if err != nil {
		t.Fatal(err)
	}
	obsRec := metrics.Multi(pr, or)
	obs, err := metrics.New(obsRec, metrics.Config{TopicPatterns: []string{"orders.*", "payments.x"}})
	if err != nil {
		t.Fatal(err)
	}
	// Writes through OnWrite: 9 events (one a duplicate of an idempotency key), and one call
	// refused by validation. orders.bad heads key kd: when it is dead-lettered, the event
	// after it (payload 8) is held.
	pub, err := outbox.NewPublisher(pool, outbox.PublisherConfig{Schema: schema, OnWrite: obs.OnWrite}, nil)
	if err != nil {
		t.Fatal(err)
	}
	parkedAt := time.Now()
	for _, in := range []outbox.EventInput{
		{Topic: "parked", Payload: 0},
		{Topic: "orders.created", Payload: 1, OrderingKey: "k1"},
		{Topic: "orders.created", Payload: 2, OrderingKey: "k1"},
		{Topic: "orders.created", Payload: 3, OrderingKey: "k2"},
		{Topic: "orders.flaky", Payload: 4},
		{Topic: "orders.bad", Payload: 5, OrderingKey: "kd"},
		{Topic: "payments.x", Payload: 6, IdempotencyKey: "once"},
		{Topic: "payments.y", Payload: 7},
		{Topic: "orders.created", Payload: 8, OrderingKey: "kd"},
		{Topic: "payments.x", Payload: 6, IdempotencyKey: "once"},
	} {
		if _, err := pub.Enqueue(ctx, in); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pub.Enqueue(ctx, outbox.EventInput{Topic: "", Payload: 9}); !errors.Is(err, outbox.ErrValidation) {
		t.Fatalf("empty topic: %v", err)
	}

	var mu sync.Mutex
	var userDelivered int
	userHooks := outbox.Hooks{OnDelivered: func(outbox.DeliveredInfo) { mu.Lock(); userDelivered++; mu.Unlock() }}
	sub, err := outbox.NewSubscriber(pool, outbox.SubscriberConfig{
		Schema: schema, PollInterval: 20 * time.Millisecond, MaxAttempts: 2, RetryBase: 10 * time.Millisecond,
		UnavailableBackoff: 10 * time.Millisecond, ExcludeTopics: []string{"parked"},
		Hooks: metrics.ComposeHooks(userHooks, obs.Hooks()),
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var flakyCalls int
	dest := forwarder.Func(func(_ context.Context, msg *message.Message) error {
		switch msg.Metadata.Get(outbox.MetadataTopic) {
		case "orders.bad":
			return errors.New("refused")
		case "orders.flaky":
			mu.Lock()
			defer mu.Unlock()
			if flakyCalls++; flakyCalls == 1 {
				return &outbox.UnavailableError{Destination: "sink", Err: errors.New("down")}
			}
		}
		return nil
	})
	fw, err := forwarder.New(sub, metrics.Publisher(dest, "sink", obsRec), forwarder.Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	fwDone := make(chan struct{})
	go func() { defer close(fwDone); _ = fw.Run(runCtx) }()
	defer fw.Close()
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		obs.WatchSubscriptions(ctx, health.Runner{Name: "forwarder", Running: fw.Running(), Done: fwDone})
	}()

	h, err := health.Handler(health.Config{Metrics: promhttp.HandlerFor(reg, promhttp.HandlerOpts{})})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	scrape := func() map[string]*dto.MetricFamily {
		resp, err := http.Get(srv.URL + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		p := expfmt.NewTextParser(model.UTF8Validation)
		mfs, err := p.TextToMetricFamilies(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return mfs
	}

	pgtest.Eventually(t, 20*time.Second, "7 events delivered and 1 dead-lettered", func() bool {
		mfs := scrape()
		return value(mfs, "outbox_delivered_total", "orders.*")+value(mfs, "outbox_delivered_total", "payments.x")+
			value(mfs, "outbox_delivered_total", "other") == 6 && value(mfs, "outbox_dead_lettered_total", "orders.*") == 1 &&
			destValue(mfs, "sink") == 0
	})
	if err := obs.SampleOnce(ctx, sub); err != nil {
		t.Fatal(err)
	}
	age := time.Since(parkedAt)
	mfs := scrape()
	for _, c := range []struct {
		name, topic string
		want        float64
	}{
		{"outbox_delivered_total", "orders.*", 4},
		{"outbox_delivered_total", "payments.x", 1},
		{"outbox_delivered_total", "other", 1},
		{"outbox_failed_total", "orders.*", 1},
		{"outbox_dead_lettered_total", "orders.*", 1},
		{"outbox_unavailable_total", "orders.*", 1},
		{"outbox_lease_lost_events_total", "", 0},
		{"outbox_mark_failures_total", "", 0},
		{"outbox_backlog_sample_failures_total", "", 0},
		{"outbox_pending_events", "", 2},
		{"outbox_held_events", "", 1},
		{"outbox_dead_lettered_events", "", 1},
		{"outbox_unavailable_events", "", 0},
		{"outbox_relay_up", "", 1},
		{"outbox_subscriptions_running", "", 1},
		{"outbox_written_events_total", "orders.*", 6},
		{"outbox_written_events_total", "payments.x", 1},
		{"outbox_written_events_total", "other", 2},
		{"outbox_write_duplicates_total", "payments.x", 1},
	} {
		if got := value(mfs, c.name, c.topic); got != c.want {
			t.Errorf("%s{topic=%q} = %v, want %v", c.name, c.topic, got, c.want)
		}
	}
	if n := mfs["outbox_delivery_delay_seconds"].GetMetric(); len(n) != 3 || histCount(mfs, "outbox_delivery_delay_seconds", "orders.*") != 4 {
		t.Errorf("outbox_delivery_delay_seconds: %d series, %d observations for orders.*, want 3 series and 4", len(n), histCount(mfs, "outbox_delivery_delay_seconds", "orders.*"))
	}
	if n := histCount(mfs, "outbox_claim_events", ""); n == 0 || histCount(mfs, "outbox_claim_duration_seconds", "") != n {
		t.Errorf("claims: %d sizes, %d durations", n, histCount(mfs, "outbox_claim_duration_seconds", ""))
	}
	// Calls to the destination: 6 delivered, 2 failures of orders.bad, 1 refusal of orders.flaky.
	if ok, bad := callCount(mfs, "ok"), callCount(mfs, "error"); ok != 6 || bad != 3 {
		t.Errorf("outbox_destination_call_duration_seconds{destination=sink}: %d ok, %d error; want 6 and 3", ok, bad)
	}
	if got := labelled(mfs, "outbox_write_validation_errors_total", "field", "topic"); got != 1 {
		t.Errorf("outbox_write_validation_errors_total{field=topic} = %v, want 1", got)
	}
	if ok, invalid := labelledCount(mfs, "outbox_write_duration_seconds", "outcome", "ok"), labelledCount(mfs, "outbox_write_duration_seconds", "outcome", "invalid"); ok != 10 || invalid != 1 {
		t.Errorf("outbox_write_duration_seconds: %d ok, %d invalid calls; want 10 and 1", ok, invalid)
	}
	if n := histCount(mfs, "outbox_mark_duration_seconds", ""); n == 0 {
		t.Error("no mark recorded")
	}
	if got := value(mfs, "outbox_oldest_pending_age_seconds", ""); got <= 0 || got > age.Seconds()+1 {
		t.Errorf("outbox_oldest_pending_age_seconds = %v, want in (0, %v]", got, age.Seconds()+1)
	}
	if destValue(mfs, "sink") != 0 {
		t.Errorf("outbox_destination_unavailable{destination=sink} = %v after the outage ended", destValue(mfs, "sink"))
	}
	mu.Lock()
	if userDelivered != 6 {
		t.Errorf("the user's own OnDelivered ran %d times, want 6", userDelivered)
	}
	mu.Unlock()

	// The same through OpenTelemetry.
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, topic string
		want        int64
	}{
		{"outbox.delivered", "orders.*", 4},
		{"outbox.delivered", "payments.x", 1},
		{"outbox.delivered", "other", 1},
		{"outbox.failed", "orders.*", 1},
		{"outbox.dead_lettered", "orders.*", 1},
		{"outbox.unavailable", "orders.*", 1},
		{"outbox.pending.events", "", 2},
		{"outbox.held.events", "", 1},
		{"outbox.dead_lettered.events", "", 1},
		{"outbox.unavailable.events", "", 0},
		{"outbox.relay.up", "", 1},
		{"outbox.subscriptions.running", "", 1},
		{"outbox.written", "orders.*", 6},
		{"outbox.written", "payments.x", 1},
		{"outbox.written", "other", 2},
		{"outbox.write.duplicates", "payments.x", 1},
	} {
		if got, ok := otelInt(rm, c.name, c.topic); !ok || got != c.want {
			t.Errorf("otel %s{topic=%q} = %v (found %v), want %v", c.name, c.topic, got, ok, c.want)
		}
	}
	if got, ok := otelDest(rm, "sink"); !ok || got != 0 {
		t.Errorf("otel outbox.destination.unavailable{sink} = %v (found %v), want 0", got, ok)
	}
	if got, ok := otelPoint(rm, "outbox.write.validation_errors", attribute.Key("field"), "topic"); !ok || got != 1 {
		t.Errorf("otel outbox.write.validation_errors{field=topic} = %v (found %v), want 1", got, ok)
	}

	// The relay stops: up 0, no subscription running (the watch ends with its last runner).
	cancel()
	<-watched
	mfs = scrape()
	if up, n := value(mfs, "outbox_relay_up", ""), value(mfs, "outbox_subscriptions_running", ""); up != 0 || n != 0 {
		t.Errorf("after stop: outbox_relay_up %v, outbox_subscriptions_running %v; want 0 and 0", up, n)
	}
}

func labelled(mfs map[string]*dto.MetricFamily, name, key, val string) float64 {
	for _, m := range mfs[name].GetMetric() {
		if label(m, key) == val {
			return m.Counter.GetValue()
		}
	}
	return -1
}

func labelledCount(mfs map[string]*dto.MetricFamily, name, key, val string) uint64 {
	for _, m := range mfs[name].GetMetric() {
		if label(m, key) == val {
			return m.Histogram.GetSampleCount()
		}
	}
	return 0
}

func value(mfs map[string]*dto.MetricFamily, name, topic string) float64 {
	for _, m := range mfs[name].GetMetric() {
		if label(m, "topic") == topic {
			switch {
			case m.Counter != nil:
				return m.Counter.GetValue()
			case m.Gauge != nil:
				return m.Gauge.GetValue()
			}
		}
	}
	return -1
}

func destValue(mfs map[string]*dto.MetricFamily, dest string) float64 {
	for _, m := range mfs["outbox_destination_unavailable"].GetMetric() {
		if label(m, "destination") == dest {
			return m.Gauge.GetValue()
		}
	}
	return -1
}

func histCount(mfs map[string]*dto.MetricFamily, name, topic string) uint64 {
	for _, m := range mfs[name].GetMetric() {
		if label(m, "topic") == topic {
			return m.Histogram.GetSampleCount()
		}
	}
	return 0
}

func callCount(mfs map[string]*dto.MetricFamily, outcome string) uint64 {
	for _, m := range mfs["outbox_destination_call_duration_seconds"].GetMetric() {
		if label(m, "destination") == "sink" && label(m, "outcome") == outcome {
			return m.Histogram.GetSampleCount()
		}
	}
	return 0
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

func otelInt(rm metricdata.ResourceMetrics, name, topic string) (int64, bool) {
	return otelPoint(rm, name, attribute.Key("topic"), topic)
}

func otelDest(rm metricdata.ResourceMetrics, dest string) (int64, bool) {
	return otelPoint(rm, "outbox.destination.unavailable", attribute.Key("destination"), dest)
}

func otelPoint(rm metricdata.ResourceMetrics, name string, key attribute.Key, val string) (int64, bool) {
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			var pts []metricdata.DataPoint[int64]
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				pts = d.DataPoints
			case metricdata.Gauge[int64]:
				pts = d.DataPoints
			}
			for _, p := range pts {
				if v, _ := p.Attributes.Value(key); v.AsString() == val {
					return p.Value, true
				}
			}
		}
	}
	return 0, false
}
