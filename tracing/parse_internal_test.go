package tracing

import (
	"context"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// TestCreationMatchesThePropagator: the creation context read from an event's headers is the
// one propagation.TraceContext extracts, for well-formed, reserved-flag, uppercase, zero,
// future-version and malformed traceparents, with and without tracestate.
func TestCreationMatchesThePropagator(t *testing.T) {
	const tid, sid = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	p := &tracedPublisher{prop: propagation.TraceContext{}, fields: propagation.TraceContext{}.Fields(), w3c: true}
	for _, tp := range []string{
		"00-" + tid + "-" + sid + "-01", "00-" + tid + "-" + sid + "-00", "00-" + tid + "-" + sid + "-02",
		"00-" + tid + "-" + sid + "-03", "00-" + tid + "-" + sid + "-04", "00-" + tid + "-" + sid + "-ff",
		"00-4BF92F3577B34DA6A3CE929D0E0E4736-" + sid + "-01", "00-00000000000000000000000000000000-" + sid + "-01",
		"00-" + tid + "-0000000000000000-01", "01-" + tid + "-" + sid + "-01-future", "ff-" + tid + "-" + sid + "-01",
		"00-" + tid + "-" + sid + "-0g", "garbage", "",
	} {
		for _, ts := range []string{"", "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7", "bad state!"} {
			md := message.Metadata{}
			if tp != "" {
				md["traceparent"] = tp
			}
			if ts != "" {
				md["tracestate"] = ts
			}
			want := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier(md)))
			if got := p.creation(md); !got.Equal(want) {
				t.Errorf("traceparent %q tracestate %q: %v, want %v", tp, ts, got, want)
			}
		}
	}
}
