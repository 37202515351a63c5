// Package tracing connects the trace of the code that wrote an event to the trace of its
// delivery, with OpenTelemetry and W3C Trace Context (traceparent/tracestate headers):
//
//   - writers: PublisherConfig.InjectHeaders = tracing.InjectHeaders(nil) stores the span
//     context of each write (the message's Context() for Publish, ctx for Enqueue) in the
//     event's headers;
//   - relay: forwarder.New(sub, tracing.Publisher(dest, tracing.Config{}), …) starts one
//     consumer span per delivery whose parent is the writer's span, records topic, event id,
//     attempt and outcome (the span status), and hands the destination the headers of the delivery span, so a
//     downstream consumer (Kafka, RabbitMQ, Redis Streams headers, webhook HTTP headers)
//     continues the same trace.
//
// Parent, not link: a delivery is caused by exactly one write, and making it a child keeps
// writer, relay and consumer in one trace that a trace view shows as one tree, with the wait
// in the outbox visible as the gap between the write and the delivery span. (A batch of
// deliveries is still one span per event.)
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
// Context.
type Config struct {
	// TracerProvider gives the relay's tracer; nil means otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
	// Propagator reads the writer's context from the event's headers and writes the delivery
	// span's context into the outgoing message's; nil means W3C Trace Context.
	Propagator propagation.TextMapPropagator
}

// Publisher wraps a destination so that each message it is given (one outbox event, as the
// forwarder hands it over) is published inside a consumer span "outbox deliver <topic>" whose
// parent is the context in the message's headers, and carries that span's context on in its
// headers. The result is a forwarder.BatchPublisher when pub is one (each message of a batch
// gets its own span, ended with the batch's result). Safe for concurrent use if pub is.
func Publisher(pub message.Publisher, cfg Config) message.Publisher {
	if cfg.TracerProvider == nil {
		cfg.TracerProvider = otel.GetTracerProvider()
	}
	if cfg.Propagator == nil {
		cfg.Propagator = defaultPropagator
	}
	p := &tracedPublisher{pub: pub, tracer: cfg.TracerProvider.Tracer(ScopeName), prop: cfg.Propagator, fields: cfg.Propagator.Fields()}
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

// start begins msg's delivery span and replaces the trace headers of msg with the span's.
func (p *tracedPublisher) start(ctx context.Context, topic string, msg *message.Message) (context.Context, trace.Span) {
	parent := ctx
	if p.hasContext(msg.Metadata) {
		parent = p.prop.Extract(ctx, propagation.MapCarrier(msg.Metadata))
	}
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
		ctx, span := p.start(msg.Context(), topic, msg)
		msg.SetContext(ctx)
		err := p.pub.Publish(topic, msg)
		end(span, err)
		if err != nil {
			return err
		}
	}
	return nil
}

// Close closes the wrapped publisher.
func (p *tracedPublisher) Close() error { return p.pub.Close() }

type tracedBatchPublisher struct {
	*tracedPublisher
	bp forwarder.BatchPublisher
}

// PublishBatch publishes batch with the wrapped PublishBatch, one span per message.
func (p *tracedBatchPublisher) PublishBatch(ctx context.Context, batch []forwarder.Outgoing) []error {
	spans := make([]trace.Span, len(batch))
	for i, o := range batch {
		var sctx context.Context
		sctx, spans[i] = p.start(o.Message.Context(), o.Topic, o.Message)
		o.Message.SetContext(sctx)
	}
	errs := p.bp.PublishBatch(ctx, batch)
	for i, s := range spans {
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
