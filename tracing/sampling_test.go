package tracing_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/forwarder"
	"github.com/watermill-outbox/outbox/tracing"
)

// writerHeaders returns the trace headers of a writer's span, sampled or not, and its span
// context.
func writerHeaders(t *testing.T, sampled bool) (map[string]string, trace.SpanContext) {
	t.Helper()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()))
	ctx, span := tp.Tracer("app").Start(context.Background(), "write")
	span.End()
	sc := span.SpanContext()
	if !sampled {
		sc = sc.WithTraceFlags(0)
	}
	h := map[string]string{}
	tracing.InjectHeaders(nil)(trace.ContextWithSpanContext(ctx, sc), func(k, v string) { h[k] = v })
	return h, sc
}

// eventMessage is a message as the forwarder hands it to the destination: headers plus the
// outbox metadata.
func eventMessage(id string, headers map[string]string) *message.Message {
	m := message.NewMessage(id, []byte(`{}`))
	for k, v := range headers {
		m.Metadata[k] = v
	}
	m.Metadata[outbox.MetadataTopic] = "orders"
	m.Metadata[outbox.MetadataAttempt] = "2"
	return m
}

// recordingDest is a destination that records the traceparent of each message it is given,
// by message UUID.
func recordingDest() (forwarder.Func, map[string]string) {
	got := map[string]string{}
	return func(_ context.Context, m *message.Message) error {
		got[m.UUID] = m.Metadata.Get("traceparent")
		return nil
	}, got
}

// TestSpansFollowTheWritersSampling: by default only an event whose writer's context is
// sampled gets a delivery span (child of the writer's span, its context passed on); an
// unsampled writer's context reaches the destination unchanged and records nothing; an event
// without a trace context gets neither a span nor trace headers.
func TestSpansFollowTheWritersSampling(t *testing.T) {
	sampledH, sampledSC := writerHeaders(t, true)
	unsampledH, unsampledSC := writerHeaders(t, false)
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	dest, got := recordingDest()
	pub := tracing.Publisher(dest, tracing.Config{TracerProvider: tp})
	msgs := []*message.Message{eventMessage("sampled", sampledH), eventMessage("unsampled", unsampledH), eventMessage("none", nil)}
	for _, m := range msgs {
		if err := pub.Publish("dest", m); err != nil {
			t.Fatal(err)
		}
	}
	spans := sr.Ended()
	if len(spans) != 1 {
		t.Fatalf("%d spans ended, want 1 (the sampled writer's event)", len(spans))
	}
	s := spans[0]
	if s.Parent().SpanID() != sampledSC.SpanID() || s.SpanContext().TraceID() != sampledSC.TraceID() {
		t.Errorf("span parent %s, want the writer's %s", s.Parent().SpanID(), sampledSC.SpanID())
	}
	if want := fmt.Sprintf("00-%s-%s-01", sampledSC.TraceID(), s.SpanContext().SpanID()); got["sampled"] != want {
		t.Errorf("sampled: traceparent %q, want the delivery span's %q", got["sampled"], want)
	}
	if want := fmt.Sprintf("00-%s-%s-00", unsampledSC.TraceID(), unsampledSC.SpanID()); got["unsampled"] != want {
		t.Errorf("unsampled: traceparent %q, want the writer's %q unchanged", got["unsampled"], want)
	}
	if tp0, ok := got["none"]; !ok || tp0 != "" {
		t.Errorf("none: traceparent %q (delivered %v), want none", tp0, ok)
	}
}

// TestRootAndUnsampledSpans: Config.RootSpans gives an event without a trace context a new
// trace; Config.UnsampledSpans starts a span for an unsampled writer's context and leaves
// the decision to the sampler (ParentBased: not recorded, the destination gets the span's
// unsampled context; AlwaysSample: recorded, a child of the writer's span).
func TestRootAndUnsampledSpans(t *testing.T) {
	unsampledH, unsampledSC := writerHeaders(t, false)
	t.Run("roots", func(t *testing.T) {
		sr := tracetest.NewSpanRecorder()
		tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
		dest, got := recordingDest()
		pub := tracing.Publisher(dest, tracing.Config{TracerProvider: tp, RootSpans: true})
		bad := map[string]string{"traceparent": "00-zz-not-a-context"}
		for _, m := range []*message.Message{eventMessage("none", nil), eventMessage("bad", bad)} {
			if err := pub.Publish("dest", m); err != nil {
				t.Fatal(err)
			}
		}
		spans := sr.Ended()
		if len(spans) != 2 {
			t.Fatalf("%d spans, want 2", len(spans))
		}
		for i, id := range []string{"none", "bad"} {
			s := spans[i]
			if s.Parent().IsValid() {
				t.Errorf("%s: span has parent %s, want a root", id, s.Parent().SpanID())
			}
			if want := fmt.Sprintf("00-%s-%s-01", s.SpanContext().TraceID(), s.SpanContext().SpanID()); got[id] != want {
				t.Errorf("%s: traceparent %q, want %q", id, got[id], want)
			}
		}
	})
	for _, sampler := range []string{"parentbased", "always"} {
		t.Run("unsampled/"+sampler, func(t *testing.T) {
			sr := tracetest.NewSpanRecorder()
			s := sdktrace.ParentBased(sdktrace.AlwaysSample())
			if sampler == "always" {
				s = sdktrace.AlwaysSample()
			}
			tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr), sdktrace.WithSampler(s))
			dest, got := recordingDest()
			pub := tracing.Publisher(dest, tracing.Config{TracerProvider: tp, UnsampledSpans: true})
			if err := pub.Publish("dest", eventMessage("e", unsampledH)); err != nil {
				t.Fatal(err)
			}
			tp0 := got["e"]
			if len(tp0) != 55 || tp0[3:35] != unsampledSC.TraceID().String() || tp0[36:52] == unsampledSC.SpanID().String() {
				t.Fatalf("traceparent %q, want a new span of trace %s", tp0, unsampledSC.TraceID())
			}
			spans := sr.Ended()
			if sampler == "parentbased" {
				if len(spans) != 0 || tp0[53:] != "00" {
					t.Errorf("%d spans recorded, traceparent %q: want none recorded, flags 00", len(spans), tp0)
				}
				return
			}
			if len(spans) != 1 || spans[0].Parent().SpanID() != unsampledSC.SpanID() || tp0[53:] != "01" {
				t.Errorf("%d spans, traceparent %q: want one recorded child of %s", len(spans), tp0, unsampledSC.SpanID())
			}
		})
	}
}

// batchDest is a BatchPublisher that records each message's traceparent and fails the
// messages named in fail.
type batchDest struct {
	forwarder.Func
	got  map[string]string
	fail map[string]bool
}

func (d *batchDest) PublishBatch(_ context.Context, batch []forwarder.Outgoing) []error {
	errs := make([]error, len(batch))
	for i, o := range batch {
		d.got[o.Message.UUID] = o.Message.Metadata.Get("traceparent")
		if d.fail[o.Message.UUID] {
			errs[i] = errors.New("refused")
		}
	}
	return errs
}

// TestBatchSpansFollowTheWritersSampling: in a batch, only the messages of sampled writers
// get spans, each ended with its own result.
func TestBatchSpansFollowTheWritersSampling(t *testing.T) {
	sampledH, sampledSC := writerHeaders(t, true)
	unsampledH, _ := writerHeaders(t, false)
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	d := &batchDest{got: map[string]string{}, fail: map[string]bool{"s2": true}}
	pub := tracing.Publisher(d, tracing.Config{TracerProvider: tp}).(forwarder.BatchPublisher)
	batch := []forwarder.Outgoing{
		{Topic: "dest", Message: eventMessage("s1", sampledH)},
		{Topic: "dest", Message: eventMessage("u", unsampledH)},
		{Topic: "dest", Message: eventMessage("none", nil)},
		{Topic: "dest", Message: eventMessage("s2", sampledH)},
	}
	errs := pub.PublishBatch(context.Background(), batch)
	if len(errs) != 4 || errs[3] == nil || errs[0] != nil || errs[1] != nil || errs[2] != nil {
		t.Fatalf("results %v", errs)
	}
	spans := sr.Ended()
	if len(spans) != 2 {
		t.Fatalf("%d spans, want 2", len(spans))
	}
	for i, id := range []string{"s1", "s2"} {
		s := spans[i]
		if s.Parent().SpanID() != sampledSC.SpanID() {
			t.Errorf("%s: parent %s", id, s.Parent().SpanID())
		}
		if want := fmt.Sprintf("00-%s-%s-01", sampledSC.TraceID(), s.SpanContext().SpanID()); d.got[id] != want {
			t.Errorf("%s: traceparent %q, want %q", id, d.got[id], want)
		}
		want := codes.Ok
		if id == "s2" {
			want = codes.Error
		}
		if s.Status().Code != want {
			t.Errorf("%s: status %v, want %v", id, s.Status(), want)
		}
	}
	if d.got["u"] != unsampledH["traceparent"] || d.got["none"] != "" {
		t.Errorf("unsampled %q (want %q unchanged), none %q", d.got["u"], unsampledH["traceparent"], d.got["none"])
	}
}

// TestSampledFlagShapes: the sampled flag decides for any traceparent Extract accepts (flags
// with other bits set, a future version with more fields); a malformed one counts as none.
func TestSampledFlagShapes(t *testing.T) {
	const tid, sid = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	for _, c := range []struct {
		traceparent string
		span        bool
	}{
		{"00-" + tid + "-" + sid + "-01", true},
		{"00-" + tid + "-" + sid + "-03", true},
		{"00-" + tid + "-" + sid + "-00", false},
		{"00-" + tid + "-" + sid + "-02", false},
		{"01-" + tid + "-" + sid + "-01-future", true},
		{"01-" + tid + "-" + sid + "-00-future", false},
		{"00-" + tid + "-" + sid + "-0g", false},
		{"00-00000000000000000000000000000000-" + sid + "-01", false},
		{"garbage", false},
	} {
		sr := tracetest.NewSpanRecorder()
		tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
		dest, got := recordingDest()
		pub := tracing.Publisher(dest, tracing.Config{TracerProvider: tp})
		if err := pub.Publish("dest", eventMessage("e", map[string]string{"traceparent": c.traceparent})); err != nil {
			t.Fatal(err)
		}
		n := len(sr.Ended())
		if (n == 1) != c.span || n > 1 {
			t.Errorf("traceparent %q: %d spans, want span %v", c.traceparent, n, c.span)
		}
		if !c.span && got["e"] != c.traceparent {
			t.Errorf("traceparent %q: destination got %q, want it unchanged", c.traceparent, got["e"])
		}
	}
}

// TestRootSpansIgnoreTheRelaysContext: under Config.RootSpans an event without a (readable)
// trace context starts a new trace even when the message's context carries a span of the
// relay's own (its Run context, a middleware's span): each such event has its own trace. They
// became children of that span, so unrelated events shared one trace — on the per-message and
// the batch path alike.
func TestRootSpansIgnoreTheRelaysContext(t *testing.T) {
	for _, batch := range []bool{false, true} {
		t.Run(fmt.Sprintf("batch=%v", batch), func(t *testing.T) {
			sr := tracetest.NewSpanRecorder()
			tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
			relayCtx, relaySpan := tp.Tracer("relay").Start(context.Background(), "relay run")
			defer relaySpan.End()
			dest, _ := recordingDest()
			var pub message.Publisher = tracing.Publisher(dest, tracing.Config{TracerProvider: tp, RootSpans: true})
			if batch {
				pub = tracing.Publisher(&batchDest{got: map[string]string{}}, tracing.Config{TracerProvider: tp, RootSpans: true})
			}
			msgs := []*message.Message{eventMessage("a", nil), eventMessage("b", nil), eventMessage("c", map[string]string{"traceparent": "00-zz-not-a-context"})}
			for _, m := range msgs {
				m.SetContext(relayCtx)
			}
			if batch {
				bp := pub.(forwarder.BatchPublisher)
				out := make([]forwarder.Outgoing, len(msgs))
				for i, m := range msgs {
					out[i] = forwarder.Outgoing{Topic: "dest", Message: m}
				}
				if errs := bp.PublishBatch(relayCtx, out); errors.Join(errs...) != nil {
					t.Fatal(errs)
				}
			} else if err := pub.Publish("dest", msgs...); err != nil {
				t.Fatal(err)
			}
			seen := map[trace.TraceID]bool{}
			for _, s := range sr.Ended() {
				if s.Name() == "relay run" {
					continue
				}
				if s.Parent().IsValid() || s.SpanContext().TraceID() == relaySpan.SpanContext().TraceID() || seen[s.SpanContext().TraceID()] {
					t.Errorf("span %q: parent %v, trace %s (relay's %s): want a root of a trace of its own", s.Name(), s.Parent().SpanID(), s.SpanContext().TraceID(), relaySpan.SpanContext().TraceID())
				}
				seen[s.SpanContext().TraceID()] = true
			}
			if len(seen) != len(msgs) {
				t.Fatalf("%d delivery traces, want %d", len(seen), len(msgs))
			}
		})
	}
}
