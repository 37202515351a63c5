package tracing_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/attribute"
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
func writerHeaders(t testing.TB, sampled bool) (map[string]string, trace.SpanContext) {
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
// by message UUID, and the span context of the message's context.
func recordingDest() (forwarder.Func, map[string]string, map[string]trace.SpanContext) {
	got := map[string]string{}
	spans := map[string]trace.SpanContext{}
	return func(ctx context.Context, m *message.Message) error {
		got[m.UUID] = m.Metadata.Get("traceparent")
		spans[m.UUID] = trace.SpanContextFromContext(ctx)
		return nil
	}, got, spans
}

// attrs returns a span's (or link's) attributes as strings.
func attrs(kvs []attribute.KeyValue) map[string]string {
	m := map[string]string{}
	for _, a := range kvs {
		m[string(a.Key)] = a.Value.Emit()
	}
	return m
}

// byName returns the ended spans named name.
func byName(sr *tracetest.SpanRecorder, name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range sr.Ended() {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

// TestProcessSpansFollowTheWritersSampling: on the per-message path only an event whose
// creation context is sampled gets a span: "process <outbox topic>", kind CONSUMER, child of
// the writer's span and linked to it, with the messaging attributes; the destination gets the
// writer's traceparent unchanged and the process span in the message's context. An unsampled
// writer's context reaches the destination unchanged and records nothing; an event without a
// trace context gets neither a span nor trace headers.
func TestProcessSpansFollowTheWritersSampling(t *testing.T) {
	sampledH, sampledSC := writerHeaders(t, true)
	unsampledH, _ := writerHeaders(t, false)
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	dest, got, ctxs := recordingDest()
	pub := tracing.Publisher(dest, tracing.Config{TracerProvider: tp})
	for _, m := range []*message.Message{eventMessage("sampled", sampledH), eventMessage("unsampled", unsampledH), eventMessage("none", nil)} {
		if err := pub.Publish("dest", m); err != nil {
			t.Fatal(err)
		}
	}
	spans := sr.Ended()
	if len(spans) != 1 {
		t.Fatalf("%d spans ended, want 1 (the sampled writer's event)", len(spans))
	}
	s := spans[0]
	if s.Name() != "process orders" || s.SpanKind() != trace.SpanKindConsumer {
		t.Errorf("span %q kind %v, want \"process orders\" CONSUMER", s.Name(), s.SpanKind())
	}
	if s.Parent().SpanID() != sampledSC.SpanID() || s.SpanContext().TraceID() != sampledSC.TraceID() {
		t.Errorf("span parent %s, want the writer's %s", s.Parent().SpanID(), sampledSC.SpanID())
	}
	if l := s.Links(); len(l) != 1 || l[0].SpanContext.SpanID() != sampledSC.SpanID() || l[0].SpanContext.TraceID() != sampledSC.TraceID() {
		t.Errorf("links %v, want one to the writer's span", l)
	}
	want := map[string]string{"messaging.system": "outbox", "messaging.operation.name": "process", "messaging.operation.type": "process",
		"messaging.destination.name": "orders", "messaging.message.id": "sampled", "outbox.destination.name": "dest", "outbox.attempt": "2"}
	if a := attrs(s.Attributes()); fmt.Sprint(a) != fmt.Sprint(want) {
		t.Errorf("attributes %v, want %v", a, want)
	}
	if s.Status().Code != codes.Unset {
		t.Errorf("status %v, want unset", s.Status())
	}
	if got["sampled"] != sampledH["traceparent"] {
		t.Errorf("sampled: traceparent %q, want the writer's %q unchanged", got["sampled"], sampledH["traceparent"])
	}
	if ctxs["sampled"].SpanID() != s.SpanContext().SpanID() {
		t.Errorf("the destination's context carries span %s, want the process span %s", ctxs["sampled"].SpanID(), s.SpanContext().SpanID())
	}
	if got["unsampled"] != unsampledH["traceparent"] {
		t.Errorf("unsampled: traceparent %q, want the writer's %q unchanged", got["unsampled"], unsampledH["traceparent"])
	}
	if tp0, ok := got["none"]; !ok || tp0 != "" {
		t.Errorf("none: traceparent %q (delivered %v), want none", tp0, ok)
	}
}

// TestProcessSpanFailure: a failed publish ends the process span with status Error and the
// outbox's failure class as error.type.
func TestProcessSpanFailure(t *testing.T) {
	sampledH, _ := writerHeaders(t, true)
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	dest := forwarder.Func(func(context.Context, *message.Message) error {
		return outbox.Unavailable(errors.New("down"))
	})
	if err := tracing.Publisher(dest, tracing.Config{TracerProvider: tp}).Publish("dest", eventMessage("e", sampledH)); err == nil {
		t.Fatal("publish succeeded")
	}
	spans := sr.Ended()
	if len(spans) != 1 || spans[0].Status().Code != codes.Error || attrs(spans[0].Attributes())["error.type"] != "unavailable" {
		t.Fatalf("spans %d, status %v, attributes %v: want one, Error, error.type unavailable", len(spans), spans[0].Status(), attrs(spans[0].Attributes()))
	}
}

// TestUnsampledSpans: Config.UnsampledSpans starts a process span for an unsampled writer's
// context and leaves the decision to the sampler (ParentBased: not recorded; AlwaysSample:
// recorded, a child of the writer's span); the destination gets the writer's traceparent
// unchanged either way.
func TestUnsampledSpans(t *testing.T) {
	unsampledH, unsampledSC := writerHeaders(t, false)
	for _, sampler := range []string{"parentbased", "always"} {
		t.Run(sampler, func(t *testing.T) {
			sr := tracetest.NewSpanRecorder()
			s := sdktrace.ParentBased(sdktrace.AlwaysSample())
			if sampler == "always" {
				s = sdktrace.AlwaysSample()
			}
			tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr), sdktrace.WithSampler(s))
			dest, got, ctxs := recordingDest()
			pub := tracing.Publisher(dest, tracing.Config{TracerProvider: tp, UnsampledSpans: true})
			if err := pub.Publish("dest", eventMessage("e", unsampledH)); err != nil {
				t.Fatal(err)
			}
			if got["e"] != unsampledH["traceparent"] {
				t.Errorf("traceparent %q, want the writer's %q unchanged", got["e"], unsampledH["traceparent"])
			}
			if sc := ctxs["e"]; sc.TraceID() != unsampledSC.TraceID() || sc.SpanID() == unsampledSC.SpanID() {
				t.Errorf("destination context %s/%s, want a new span of trace %s", sc.TraceID(), sc.SpanID(), unsampledSC.TraceID())
			}
			spans := sr.Ended()
			if sampler == "parentbased" {
				if len(spans) != 0 {
					t.Errorf("%d spans recorded, want none", len(spans))
				}
				return
			}
			if len(spans) != 1 || spans[0].Parent().SpanID() != unsampledSC.SpanID() {
				t.Errorf("%d spans, want one recorded child of %s", len(spans), unsampledSC.SpanID())
			}
		})
	}
}

// TestRootSpans: under Config.RootSpans each event without a readable trace context gets a
// span "create <destination>" (PRODUCER) that is the root of a trace of its own, even when the
// message's context carries a span of the relay's own (its Run context, a middleware's span),
// and the destination gets that span's traceparent. On the per-message path the create span
// is the parent of the event's process span (which links to it); on the batch path the send
// span links to it. The relay's span parents nothing.
func TestRootSpans(t *testing.T) {
	for _, batch := range []bool{false, true} {
		t.Run(fmt.Sprintf("batch=%v", batch), func(t *testing.T) {
			sr := tracetest.NewSpanRecorder()
			tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
			relayCtx, relaySpan := tp.Tracer("relay").Start(context.Background(), "relay run")
			dest, got, _ := recordingDest()
			cfg := tracing.Config{TracerProvider: tp, RootSpans: true}
			pub := tracing.Publisher(dest, cfg)
			bd := &batchDest{got: map[string]string{}}
			if batch {
				got = bd.got
				pub = tracing.Publisher(bd, cfg)
			}
			ids := []string{"a", "b", "c"}
			msgs := []*message.Message{eventMessage("a", nil), eventMessage("b", nil), eventMessage("c", map[string]string{"traceparent": "00-zz-not-a-context"})}
			for _, m := range msgs {
				m.SetContext(relayCtx)
			}
			if batch {
				out := make([]forwarder.Outgoing, len(msgs))
				for i, m := range msgs {
					out[i] = forwarder.Outgoing{Topic: "dest", Message: m}
				}
				if errs := pub.(forwarder.BatchPublisher).PublishBatch(relayCtx, out); errors.Join(errs...) != nil {
					t.Fatal(errs)
				}
			} else {
				for _, m := range msgs {
					if err := pub.Publish("dest", m); err != nil {
						t.Fatal(err)
					}
				}
			}
			relaySpan.End()
			creates := byName(sr, "create dest")
			if len(creates) != len(msgs) {
				t.Fatalf("%d create spans, want %d", len(creates), len(msgs))
			}
			traces := map[trace.TraceID]bool{relaySpan.SpanContext().TraceID(): true}
			byID := map[string]sdktrace.ReadOnlySpan{}
			for _, c := range creates {
				id := attrs(c.Attributes())["messaging.message.id"]
				byID[id] = c
				if c.Parent().IsValid() || traces[c.SpanContext().TraceID()] || c.SpanKind() != trace.SpanKindProducer {
					t.Errorf("create span of %s: parent %v, kind %v, trace %s: want a PRODUCER root of a trace of its own", id, c.Parent().SpanID(), c.SpanKind(), c.SpanContext().TraceID())
				}
				traces[c.SpanContext().TraceID()] = true
			}
			for _, id := range ids {
				c := byID[id]
				if c == nil {
					t.Fatalf("no create span for %s", id)
				}
				if want := fmt.Sprintf("00-%s-%s-01", c.SpanContext().TraceID(), c.SpanContext().SpanID()); got[id] != want {
					t.Errorf("%s: traceparent %q, want the create span's %q", id, got[id], want)
				}
			}
			if batch {
				sends := byName(sr, "send dest")
				if len(sends) != 1 || len(sends[0].Links()) != len(msgs) || sends[0].Parent().IsValid() {
					t.Fatalf("send spans %d, want one root linking %d create spans", len(sends), len(msgs))
				}
				for _, l := range sends[0].Links() {
					c := byID[attrs(l.Attributes)["messaging.message.id"]]
					if c == nil || l.SpanContext.SpanID() != c.SpanContext().SpanID() {
						t.Errorf("link %v does not point at its event's create span", l)
					}
				}
				return
			}
			procs := byName(sr, "process orders")
			if len(procs) != len(msgs) {
				t.Fatalf("%d process spans, want %d", len(procs), len(msgs))
			}
			for _, s := range procs {
				c := byID[attrs(s.Attributes())["messaging.message.id"]]
				if c == nil || s.Parent().SpanID() != c.SpanContext().SpanID() || len(s.Links()) != 1 || s.Links()[0].SpanContext.SpanID() != c.SpanContext().SpanID() {
					t.Errorf("process span %v: parent %s, links %v: want child of and linked to its create span", attrs(s.Attributes()), s.Parent().SpanID(), s.Links())
				}
			}
		})
	}
}

// batchDest is a BatchPublisher that records each message's traceparent and fails the
// messages named in fail.
type batchDest struct {
	forwarder.Func
	got   map[string]string
	fail  map[string]bool
	calls []trace.SpanContext // the span context of each call's ctx
}

func (d *batchDest) PublishBatch(ctx context.Context, batch []forwarder.Outgoing) []error {
	d.calls = append(d.calls, trace.SpanContextFromContext(ctx))
	errs := make([]error, len(batch))
	for i, o := range batch {
		d.got[o.Message.UUID] = o.Message.Metadata.Get("traceparent")
		if d.fail[o.Message.UUID] {
			errs[i] = outbox.Permanent(errors.New("refused"))
		}
	}
	return errs
}

// TestSendSpanLinksEveryEvent: a PublishBatch call is one span "send <destination>", kind
// CLIENT, the root of its own trace even when ctx carries the relay's span, with
// messaging.batch.message_count and a link to the creation context of every event that has
// one (sampled or not; link attribute messaging.message.id); the destination call gets the
// send span in its ctx and each event's traceparent unchanged. A failed message makes the
// span's status Error with the failure's class.
func TestSendSpanLinksEveryEvent(t *testing.T) {
	s1H, s1SC := writerHeaders(t, true)
	uH, uSC := writerHeaders(t, false)
	s2H, s2SC := writerHeaders(t, true)
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	relayCtx, relaySpan := tp.Tracer("relay").Start(context.Background(), "relay run")
	d := &batchDest{got: map[string]string{}, fail: map[string]bool{"s2": true}}
	pub := tracing.Publisher(d, tracing.Config{TracerProvider: tp, System: "kafka"}).(forwarder.BatchPublisher)
	batch := []forwarder.Outgoing{
		{Topic: "dest", Message: eventMessage("s1", s1H)},
		{Topic: "dest", Message: eventMessage("u", uH)},
		{Topic: "dest", Message: eventMessage("none", nil)},
		{Topic: "dest", Message: eventMessage("s2", s2H)},
	}
	errs := pub.PublishBatch(relayCtx, batch)
	relaySpan.End()
	if len(errs) != 4 || errs[3] == nil || errs[0] != nil || errs[1] != nil || errs[2] != nil {
		t.Fatalf("results %v", errs)
	}
	sends := byName(sr, "send dest")
	if len(sr.Ended()) != 2 || len(sends) != 1 {
		t.Fatalf("%d spans (%d send spans), want the relay's and one send span", len(sr.Ended()), len(sends))
	}
	s := sends[0]
	if s.SpanKind() != trace.SpanKindClient || s.Parent().IsValid() || s.SpanContext().TraceID() == relaySpan.SpanContext().TraceID() {
		t.Errorf("send span kind %v, parent %s, trace %s: want a CLIENT root of its own trace", s.SpanKind(), s.Parent().SpanID(), s.SpanContext().TraceID())
	}
	want := map[string]string{"messaging.system": "kafka", "messaging.operation.name": "send", "messaging.operation.type": "send",
		"messaging.destination.name": "dest", "messaging.batch.message_count": "4", "error.type": "permanent"}
	if a := attrs(s.Attributes()); fmt.Sprint(a) != fmt.Sprint(want) {
		t.Errorf("attributes %v, want %v", a, want)
	}
	if s.Status().Code != codes.Error || s.Status().Description == "" {
		t.Errorf("status %v, want Error", s.Status())
	}
	links := s.Links()
	if len(links) != 3 {
		t.Fatalf("%d links, want 3 (every event with a creation context)", len(links))
	}
	for i, w := range []struct {
		id string
		sc trace.SpanContext
	}{{"s1", s1SC}, {"u", uSC}, {"s2", s2SC}} {
		l := links[i]
		if l.SpanContext.TraceID() != w.sc.TraceID() || l.SpanContext.SpanID() != w.sc.SpanID() || l.SpanContext.IsSampled() != w.sc.IsSampled() || !l.SpanContext.IsRemote() {
			t.Errorf("link %d: %s/%s sampled %v, want %s's creation context %s/%s", i, l.SpanContext.TraceID(), l.SpanContext.SpanID(), l.SpanContext.IsSampled(), w.id, w.sc.TraceID(), w.sc.SpanID())
		}
		if a := attrs(l.Attributes); len(a) != 1 || a["messaging.message.id"] != w.id {
			t.Errorf("link %d attributes %v, want messaging.message.id=%s", i, a, w.id)
		}
	}
	if len(d.calls) != 1 || d.calls[0].SpanID() != s.SpanContext().SpanID() {
		t.Errorf("destination call contexts %v, want the send span's", d.calls)
	}
	for id, h := range map[string]map[string]string{"s1": s1H, "u": uH, "s2": s2H, "none": nil} {
		if d.got[id] != h["traceparent"] {
			t.Errorf("%s: traceparent %q, want %q unchanged", id, d.got[id], h["traceparent"])
		}
	}
}

// TestSendSpanNames: a batch to several topics is a span named "send" without
// messaging.destination.name; a batch above the SDK's default link limit (128) links every
// event when the provider's limit allows it.
func TestSendSpanNames(t *testing.T) {
	sr := tracetest.NewSpanRecorder()
	limits := sdktrace.NewSpanLimits()
	limits.LinkCountLimit = 1000
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr), sdktrace.WithRawSpanLimits(limits))
	pub := tracing.Publisher(&batchDest{got: map[string]string{}}, tracing.Config{TracerProvider: tp}).(forwarder.BatchPublisher)
	h, _ := writerHeaders(t, true)
	batch := make([]forwarder.Outgoing, 1000)
	for i := range batch {
		batch[i] = forwarder.Outgoing{Topic: "t" + strconv.Itoa(i%2), Message: eventMessage(strconv.Itoa(i), h)}
	}
	pub.PublishBatch(context.Background(), batch)
	spans := sr.Ended()
	if len(spans) != 1 || spans[0].Name() != "send" || len(spans[0].Links()) != 1000 || spans[0].DroppedLinks() != 0 {
		t.Fatalf("%d spans, want one named \"send\" with 1000 links", len(spans))
	}
	if a := attrs(spans[0].Attributes()); a["messaging.destination.name"] != "" || a["messaging.batch.message_count"] != "1000" || a["messaging.system"] != "outbox" {
		t.Errorf("attributes %v", a)
	}
}

// TestSendSpanSampling: the send span is sampled by the provider's sampler as a root; links
// to sampled creation contexts do not make it sampled (no span recorded, no link built), and a
// parent-based ratio sampler records about its ratio of the batches.
func TestSendSpanSampling(t *testing.T) {
	h, _ := writerHeaders(t, true)
	for _, c := range []struct {
		name     string
		sampler  sdktrace.Sampler
		min, max int
	}{
		{"never", sdktrace.ParentBased(sdktrace.NeverSample()), 0, 0},
		{"ratio10", sdktrace.ParentBased(sdktrace.TraceIDRatioBased(0.1)), 60, 140}, // 1000 batches: mean 100, sd 9.5
		{"always", sdktrace.AlwaysSample(), 1000, 1000},
	} {
		t.Run(c.name, func(t *testing.T) {
			sr := tracetest.NewSpanRecorder()
			tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr), sdktrace.WithSampler(c.sampler))
			d := &batchDest{got: map[string]string{}}
			pub := tracing.Publisher(d, tracing.Config{TracerProvider: tp}).(forwarder.BatchPublisher)
			for i := range 1000 {
				pub.PublishBatch(context.Background(), []forwarder.Outgoing{{Topic: "dest", Message: eventMessage(strconv.Itoa(i), h)}})
			}
			if n := len(sr.Ended()); n < c.min || n > c.max {
				t.Errorf("%d send spans recorded of 1000 batches, want %d..%d", n, c.min, c.max)
			}
			for _, s := range sr.Ended() {
				if len(s.Links()) != 1 {
					t.Fatalf("recorded send span with %d links, want 1", len(s.Links()))
				}
			}
		})
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
		{"00-" + tid + "-" + sid + "-05", false},
		{"00-4BF92F3577B34DA6A3CE929D0E0E4736-" + sid + "-01", false},
		{"00-00000000000000000000000000000000-" + sid + "-01", false},
		{"garbage", false},
	} {
		sr := tracetest.NewSpanRecorder()
		tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
		dest, got, _ := recordingDest()
		pub := tracing.Publisher(dest, tracing.Config{TracerProvider: tp})
		if err := pub.Publish("dest", eventMessage("e", map[string]string{"traceparent": c.traceparent})); err != nil {
			t.Fatal(err)
		}
		n := len(sr.Ended())
		if (n == 1) != c.span || n > 1 {
			t.Errorf("traceparent %q: %d spans, want span %v", c.traceparent, n, c.span)
		}
		if got["e"] != c.traceparent {
			t.Errorf("traceparent %q: destination got %q, want it unchanged", c.traceparent, got["e"])
		}
	}
}
