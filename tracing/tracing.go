// Package tracing connects the trace of the code that wrote an event to the trace of its
// delivery, with OpenTelemetry and W3C Trace Context (traceparent/tracestate headers):
//
//   - writers: PublisherConfig.InjectHeaders = tracing.InjectHeaders(nil) stores the span
//     context of each write (the message's Context() for Publish, ctx for Enqueue) in the
//     event's headers;
//   - relay: forwarder.New(sub, tracing.Publisher(dest, tracing.Config{}), …) starts a
//     producer span per delivery whose parent is the writer's span, records topic, event id,
//     attempt and outcome (the span status), and hands the destination the headers of the
//     delivery span, so a downstream consumer (Kafka, RabbitMQ, Redis Streams headers,
//     webhook HTTP headers) continues the same trace.
//
// Parent, not link: a delivery is caused by exactly one write, and making it a child keeps
// writer, relay and consumer in one trace that a trace view shows as one tree, with the wait
// in the outbox visible as the gap between the write and the delivery span. (A batch of
// deliveries is still one span per event.)
//
// The writer's sampling decision is the relay's: only an event whose writer's context is
// sampled gets a span by default. An unsampled writer's context is passed on unchanged (the
// consumer continues the writer's trace, unsampled), and an event without a trace context
// gets neither a span nor trace headers; Config.UnsampledSpans and Config.RootSpans change
// that. A recorded span costs the relay several µs of CPU per delivery, a large share of the
// relay's own work per event (README, "Operating the relay"), so the share of traced
// deliveries is set where traces begin: the writers' sampler.
//
// The root package never imports OpenTelemetry; capture is opt-in through
// PublisherConfig.InjectHeaders for that reason.
package tracing

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/forwarder"
)

// ScopeName is the instrumentation scope of the relay's tracer.
const ScopeName = "github.com/watermill-outbox/outbox/tracing"

// defaultPropagator is W3C Trace Context: the global OTel propagator is a no-op until an
// application sets one, and a no-op would silently drop every trace.
var defaultPropagator propagation.TextMapPropagator = propagation.TraceContext{}

// InjectHeaders returns a PublisherConfig.InjectHeaders function that writes the span context
// of each write's context with prop (nil: W3C Trace Context, traceparent and tracestate). A
// context without a valid span adds nothing. Safe for concurrent use.
func InjectHeaders(prop propagation.TextMapPropagator) func(ctx context.Context, set func(key, value string)) {
	if prop == nil {
		prop = defaultPropagator
	}
	return func(ctx context.Context, set func(key, value string)) {
		if !trace.SpanContextFromContext(ctx).IsValid() {
			return
		}
		prop.Inject(ctx, setter(set))
	}
}

type setter func(key, value string)

func (s setter) Get(string) string        { return "" }
func (s setter) Set(key, value string)    { s(key, value) }
func (s setter) Keys() []string           { return nil }
func (s setter) Append(key, value string) { s(key, value) }
func (s setter) Values(string) []string   { return nil }

// Config configures Publisher. The zero value uses the global tracer provider and W3C Trace
// Context, and starts a delivery span only for events whose writer's context is sampled.
type Config struct {
	// TracerProvider gives the relay's tracer; nil means otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
	// Propagator reads the writer's context from the event's headers and writes the delivery
	// span's context into the outgoing message's; nil means W3C Trace Context.
	Propagator propagation.TextMapPropagator
	// UnsampledSpans starts a delivery span also for an event whose writer's context is not
	// sampled, and lets the TracerProvider's sampler decide whether it is recorded (for a
	// sampler that may record what the writer did not). Default false: such an event is
	// handed to the destination with its headers unchanged, so a downstream consumer
	// continues the writer's (unsampled) trace; the SDK's default sampler
	// (ParentBased(AlwaysSample)) would not record that span either, and starting it costs
	// IDs, contexts and headers for nothing.
	UnsampledSpans bool
	// RootSpans starts a delivery span, a new trace, for an event that carries no trace
	// context (written without PublisherConfig.InjectHeaders, or outside any span), subject
	// to the TracerProvider's sampler. The span is a root even when the message's context
	// carries a span of the relay's own: each such event has a trace of its own. Default false: such an event gets no span and no trace
	// headers. A recorded span costs the relay 6-10 µs of CPU, a quarter or more of its own
	// work per event (README, "What tracing and metrics cost"): turn this on with a sampler
	// that records a fraction (sdktrace.TraceIDRatioBased).
	RootSpans bool
}

// Publisher wraps a destination so that each message it is given (one outbox event, as the
// forwarder hands it over) is published inside a producer span "outbox deliver <topic>" whose
// parent is the context in the message's headers, and carries that span's context on in its
// headers. Which events get a span: those whose writer's context is sampled, plus those that
// Config.UnsampledSpans and Config.RootSpans add; the others are published unchanged. The
// result is a forwarder.BatchPublisher when pub is one (each message of a batch gets its own
// span, ended with the batch's result). Safe for concurrent use if pub is.
func Publisher(pub message.Publisher, cfg Config) message.Publisher {
	if cfg.TracerProvider == nil {
		cfg.TracerProvider = otel.GetTracerProvider()
	}
	if cfg.Propagator == nil {
		cfg.Propagator = defaultPropagator
	}
	p := &tracedPublisher{pub: pub, tracer: cfg.TracerProvider.Tracer(ScopeName), prop: cfg.Propagator, fields: cfg.Propagator.Fields(),
		unsampled: cfg.UnsampledSpans, roots: cfg.RootSpans}
	_, p.w3c = cfg.Propagator.(propagation.TraceContext)
	if bp, ok := pub.(forwarder.BatchPublisher); ok {
		return &tracedBatchPublisher{tracedPublisher: p, bp: bp}
	}
	return p
}

type tracedPublisher struct {
	pub    message.Publisher
	tracer trace.Tracer
	prop   propagation.TextMapPropagator
	fields []string // the headers prop reads
	w3c    bool     // prop is W3C Trace Context: the sampled flag is read from traceparent

	unsampled, roots bool // Config.UnsampledSpans, Config.RootSpans

	names  sync.Map     // source topic → span name, so that each delivery does not build it
	nNames atomic.Int64 // entries in names (bounded by maxSpanNames)
}

// maxSpanNames bounds the span-name cache; topics beyond it get their name built per span.
const maxSpanNames = 1000

// attrPool holds the attribute slices of span starts: the SDK copies the attributes into the
// span, so the slice can be reused once Start returned (one allocation less per delivery, and
// no growth of a slice literal).
var attrPool = sync.Pool{New: func() any { s := make([]attribute.KeyValue, 0, 6); return &s }}

// spanName returns "outbox deliver <source>", cached per topic.
func (p *tracedPublisher) spanName(source string) string {
	if n, ok := p.names.Load(source); ok {
		return n.(string)
	}
	n := "outbox deliver " + source
	if p.nNames.Load() < maxSpanNames {
		if _, loaded := p.names.LoadOrStore(source, n); !loaded {
			p.nNames.Add(1)
		}
	}
	return n
}

// hasContext reports whether md carries any header the propagator reads: without one,
// Extract would only copy ctx.
func (p *tracedPublisher) hasContext(md message.Metadata) bool {
	for _, f := range p.fields {
		if _, ok := md[f]; ok {
			return true
		}
	}
	return false
}

// mayTrace reports, without parsing anything, whether msg may get a delivery span: it carries
// a header the propagator reads (and, with W3C Trace Context, a traceparent whose sampled
// flag is set, unless Config.UnsampledSpans), or none and Config.RootSpans is set. It is the
// whole cost of an event that gets no span, on a stack kept as small as possible (see
// growStack).
func (p *tracedPublisher) mayTrace(md message.Metadata) bool {
	if !p.hasContext(md) {
		return p.roots
	}
	if p.w3c && !p.unsampled {
		if sampled, ok := traceparentSampled(md["traceparent"]); ok {
			return sampled
		}
	}
	return true
}

// parent returns the parent context of msg's delivery span and whether there is to be a span
// at all (Config.UnsampledSpans, Config.RootSpans).
func (p *tracedPublisher) parent(ctx context.Context, md message.Metadata) (context.Context, bool) {
	if !p.mayTrace(md) {
		return ctx, false
	}
	if !p.hasContext(md) {
		return rootOf(ctx), true // a root span (Config.RootSpans)
	}
	ctx = rootOf(ctx) // unreadable headers must not leave the relay's span as the parent
	pctx := p.prop.Extract(ctx, propagation.MapCarrier(md))
	sc := trace.SpanContextFromContext(pctx)
	switch {
	case !sc.IsValid():
		return ctx, p.roots // unreadable headers: as if there were none
	case !sc.IsSampled() && !p.unsampled:
		return ctx, false
	}
	return pctx, true
}

// rootOf returns ctx without its span, so that a span started from it begins a new trace: a
// root span (Config.RootSpans) must not become a child of whatever span the relay's own
// context carries (its Run context, a middleware's span), or unrelated events share one trace.
func rootOf(ctx context.Context) context.Context {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return ctx
	}
	return trace.ContextWithSpanContext(ctx, trace.SpanContext{})
}

// traceparentSampled reads the sampled flag of a W3C traceparent of version 00
// ("00-<32 hex>-<16 hex>-<2 hex>"); ok is false for any other shape (Extract decides then).
func traceparentSampled(h string) (sampled, ok bool) {
	if len(h) != 55 || h[0] != '0' || h[1] != '0' || h[2] != '-' || h[35] != '-' || h[52] != '-' {
		return false, false
	}
	lo := h[54]
	var v byte
	switch {
	case lo >= '0' && lo <= '9':
		v = lo - '0'
	case lo >= 'a' && lo <= 'f':
		v = lo - 'a' + 10
	default:
		return false, false
	}
	return v&1 == 1, true
}

// start begins msg's delivery span and replaces the trace headers of msg with the span's.
func (p *tracedPublisher) start(parent context.Context, topic string, msg *message.Message) (context.Context, trace.Span) {
	source := msg.Metadata.Get(outbox.MetadataTopic)
	if source == "" {
		source = topic
	}
	ap := attrPool.Get().(*[]attribute.KeyValue)
	attrs := append((*ap)[:0],
		attribute.String("messaging.system", "outbox"),
		attribute.String("messaging.operation.type", "send"),
		attribute.String("messaging.destination.name", topic),
		attribute.String("messaging.message.id", msg.UUID),
		attribute.String("outbox.topic", source),
	)
	if a, err := strconv.Atoi(msg.Metadata.Get(outbox.MetadataAttempt)); err == nil {
		attrs = append(attrs, attribute.Int("outbox.attempt", a))
	}
	ctx, span := p.tracer.Start(parent, p.spanName(source), trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(attrs...))
	clear(attrs) // drop the references to this message's strings
	*ap = attrs[:0]
	attrPool.Put(ap)
	p.prop.Inject(ctx, propagation.MapCarrier(msg.Metadata))
	return ctx, span
}

// end records the outcome as the span's status: Ok when the destination took the message,
// Error with the error otherwise (the outbox then retries or dead-letters the event).
func end(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	} else {
		span.SetStatus(codes.Ok, "")
	}
	span.End()
}

// Publish publishes each message in its own span (one call to the wrapped Publish per
// message, so each result is its own).
func (p *tracedPublisher) Publish(topic string, msgs ...*message.Message) error {
	for _, msg := range msgs {
		var err error
		if p.mayTrace(msg.Metadata) {
			err = p.publishTraced(topic, msg)
		} else {
			err = p.pub.Publish(topic, msg)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// publishTraced publishes msg in its delivery span, if parent gives it one.
//
//go:noinline
func (p *tracedPublisher) publishTraced(topic string, msg *message.Message) error {
	growStack()
	parent, ok := p.parent(msg.Context(), msg.Metadata)
	if !ok {
		return p.pub.Publish(topic, msg)
	}
	ctx, span := p.start(parent, topic, msg)
	msg.SetContext(ctx)
	err := p.pub.Publish(topic, msg)
	end(span, err)
	return err
}

// growStack grows the calling goroutine's stack to 8 KiB at once, while its stack is still
// shallow. The forwarder's per-message path runs each delivery on a new goroutine
// (Watermill's Router), whose stack starts at 2 KiB; the SDK's span start and end need more
// (4 KiB do not do), and growing the stack down there copies every frame of the router, the
// middlewares and the SDK, once per doubling: about 4 µs per delivery, where one copy of the
// few frames above Publish costs about 1.5 µs (CPU profiles of BenchmarkRelayPathCost; the
// cost of a copy grows with the frames, not the bytes). CockroachDB's growstack package does
// the same. A goroutine whose stack is already large pays a call and a 4 KiB clear.
//
//go:noinline
func growStack() {
	var buf [4 << 10]byte
	stackSink(buf[:])
}

// stackSink keeps growStack's array from being optimized away.
//
//go:noinline
func stackSink([]byte) {}

// Close closes the wrapped publisher.
func (p *tracedPublisher) Close() error { return p.pub.Close() }

type tracedBatchPublisher struct {
	*tracedPublisher
	bp forwarder.BatchPublisher
}

// PublishBatch publishes batch with the wrapped PublishBatch, one span per message.
func (p *tracedBatchPublisher) PublishBatch(ctx context.Context, batch []forwarder.Outgoing) []error {
	var spans []trace.Span // nil, or one per message (nil where a message has none)
	for i, o := range batch {
		parent, ok := p.parent(o.Message.Context(), o.Message.Metadata)
		if !ok {
			continue
		}
		if spans == nil {
			spans = make([]trace.Span, len(batch))
		}
		var sctx context.Context
		sctx, spans[i] = p.start(parent, o.Topic, o.Message)
		o.Message.SetContext(sctx)
	}
	errs := p.bp.PublishBatch(ctx, batch)
	for i, s := range spans {
		if s == nil {
			continue
		}
		var err error
		if i < len(errs) {
			err = errs[i]
		} else {
			err = forwarder.ErrMissingResult
		}
		end(s, err)
	}
	return errs
}
