package otel_test

import (
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/watermill-outbox/outbox/metrics/otel"
)

// BenchmarkDelivered is the cost of one delivered event's measurements (a counter and a
// histogram with the topic attribute) on an SDK meter provider.
func BenchmarkDelivered(b *testing.B) {
	r, err := otel.New(sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader())))
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		r.Delivered("orders.created", time.Millisecond)
	}
}
