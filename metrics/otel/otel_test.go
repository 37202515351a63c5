package otel_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/watermill-outbox/outbox/metrics/otel"
)

// TestTopicAttributesPastTheCache: each topic's measurements carry its own topic attribute,
// for topics past the bound of the attribute-set cache too.
func TestTopicAttributesPastTheCache(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	r, err := otel.New(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	if err != nil {
		t.Fatal(err)
	}
	const topics = 1010 // the cache holds 1000
	for i := range topics {
		for range i%3 + 1 {
			r.Delivered(fmt.Sprintf("t%d", i), time.Millisecond)
		}
		r.Failed(fmt.Sprintf("t%d", i))
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	got := map[string]map[string]int64{} // instrument → topic → value
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			add := func(topic string, v int64) {
				if got[m.Name] == nil {
					got[m.Name] = map[string]int64{}
				}
				got[m.Name][topic] += v
			}
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					v, _ := p.Attributes.Value("topic")
					add(v.AsString(), p.Value)
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					v, _ := p.Attributes.Value("topic")
					add(v.AsString(), int64(p.Count))
				}
			}
		}
	}
	for _, name := range []string{"outbox.delivered", "outbox.delivery.delay", "outbox.failed"} {
		if len(got[name]) != topics {
			t.Fatalf("%s: %d topics, want %d", name, len(got[name]), topics)
		}
	}
	for i := range topics {
		topic := fmt.Sprintf("t%d", i)
		want := int64(i%3 + 1)
		if got["outbox.delivered"][topic] != want || got["outbox.delivery.delay"][topic] != want || got["outbox.failed"][topic] != 1 {
			t.Fatalf("%s: delivered %d, delay count %d, failed %d; want %d, %d, 1", topic,
				got["outbox.delivered"][topic], got["outbox.delivery.delay"][topic], got["outbox.failed"][topic], want, want)
		}
	}
}
