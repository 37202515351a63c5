// Package tracing connects the trace of the code that wrote an event to the relay's work on it
// and to the destination's consumers, with OpenTelemetry and W3C Trace Context
// (traceparent/tracestate headers), following OpenTelemetry's semantic conventions for
// messaging spans:
//
//   - writers: PublisherConfig.InjectHeaders = tracing.InjectHeaders(nil) stores the span
//     context of each write (the message's Context() for Publish, ctx for Enqueue) in the
//     event's headers. That is the event's creation context: the relay hands it to the
//     destination unchanged, so a downstream consumer links (or parents) its own spans to the
//     writer's span, as the conventions ask of a message's creation context.
//   - relay: forwarder.New(sub, tracing.Publisher(dest, tracing.Config{}), …) records the
//     relay's work. On the batch path (a destination that takes whole batches, such as Kafka,
//     RabbitMQ and Redis Streams) each destination call is one span "send <destination>"
//     with a link to the creation context of each event of the batch. On the per-message path
//     (the Watermill handler, one event per call: webhooks, Func, other Watermill publishers)
//     each event gets a span "process <outbox topic>" whose parent is the event's creation
//     context (and which links to it), so writer and relay share one trace.
//
// Sampling: a send span is a root span, sampled by the TracerProvider's sampler as any root
// (links are added after the sampling decision, so they never make a span sampled). A
// process span follows the writer's decision: an event whose creation context is not sampled
// gets no span by default (a header lookup and one flag read), which is what a parent-based
// sampler would decide; Config.UnsampledSpans lets the sampler see those too. An event
// without a creation context gets no span and no trace headers, unless Config.RootSpans
// gives it one of its own.
//
// The root package never imports OpenTelemetry; capture is opt-in through
// PublisherConfig.InjectHeaders for that reason.
package tracing

import (
	"context"
	"errors"
	"fmt"
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

// SystemOutbox is the messaging.system of process spans (the relay consuming the outbox) and
// the default Config.System.
const SystemOutbox = "outbox"

// Kinds of the relay's spans. The send span's context is never injected into a message (each
// message keeps its creation context), so it is a CLIENT span, as the messaging conventions
// ask of a send span that is not a creation context; create spans are creation contexts
// (PRODUCER), process spans handle one pushed message (CONSUMER).
const (
	SendSpanKind    = trace.SpanKindClient
	CreateSpanKind  = trace.SpanKindProducer
	ProcessSpanKind = trace.SpanKindConsumer
)

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
// Context, names the destination's system "outbox", and gives a process span only to events
// whose creation context is sampled.
type Config struct {
	// TracerProvider gives the relay's tracer; nil means otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
	// Propagator reads the creation context from the events' headers (and writes the context
	// of a create span, Config.RootSpans); nil means W3C Trace Context.
	Propagator propagation.TextMapPropagator
	// System is the messaging.system attribute of the send and create spans: the
	// destination's system, in the conventions' words where they have one ("kafka",
	// "rabbitmq"; otherwise a name such as "redis" or "webhook"). Default SystemOutbox.
	System string
	// UnsampledSpans starts a process span (per-message path) also for an event whose
	// creation context is not sampled, and lets the TracerProvider's sampler decide whether it
	// is recorded (for a sampler that may record what the writer did not; a parent-based
	// sampler would not). Default false: such an event costs a header lookup and one flag
	// read. The batch path's send spans are roots and always see the sampler.
	UnsampledSpans bool
	// RootSpans gives an event that carries no readable creation context (written without
	// PublisherConfig.InjectHeaders, or outside any span) one of its own: a span
	// "create <destination>" (kind PRODUCER) that is the root of a new trace, never a child
	// of a span in the relay's own context, so each such event has its own trace. Its
	// context is written into the outgoing message's headers, the send span links to it, and
	// on the per-message path it is the parent of the event's process span; the
	// TracerProvider's sampler decides as for any root. Default false: such an event gets no
	// span of its own and no trace headers. A recorded span costs the relay several µs of CPU
	// (docs/performance.md): turn this on with a sampler that records a fraction
	// (sdktrace.ParentBased(sdktrace.TraceIDRatioBased(…))).
	RootSpans bool
}

// Publisher wraps a destination so that the relay's work on each event is traced (see the
// package documentation): a PublishBatch call (the forwarder's batch path) is one span
// "send <destination>" with a link per event that has a creation context, and a Publish call
// (the per-message path) gives each message whose creation context is sampled a span
// "process <outbox topic>" whose parent is that context. The events' trace headers reach the
// destination unchanged (Config.RootSpans adds one to events that have none). The result is
// a forwarder.BatchPublisher when pub is one. Safe for concurrent use if pub is.
func Publisher(pub message.Publisher, cfg Config) message.Publisher {
	if cfg.TracerProvider == nil {
		cfg.TracerProvider = otel.GetTracerProvider()
	}
	if cfg.Propagator == nil {
		cfg.Propagator = defaultPropagator
	}
	if cfg.System == "" {
		cfg.System = SystemOutbox
	}
	p := &tracedPublisher{pub: pub, tracer: cfg.TracerProvider.Tracer(ScopeName), prop: cfg.Propagator, fields: cfg.Propagator.Fields(),
		system: attribute.String("messaging.system", cfg.System), unsampled: cfg.UnsampledSpans, roots: cfg.RootSpans}
	_, p.w3c = cfg.Propagator.(propagation.TraceContext)
	p.process.prefix, p.send.prefix, p.create.prefix = "process ", "send ", "create "
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
	w3c    bool     // prop is W3C Trace Context: traceparent is parsed here, without Extract
	system attribute.KeyValue

	unsampled, roots bool // Config.UnsampledSpans, Config.RootSpans

	process, send, create spanNames
}

// Attributes that are the same on every span of their kind.
var (
	attrOutbox      = attribute.String("messaging.system", SystemOutbox)
	attrProcessName = attribute.String("messaging.operation.name", "process")
	attrProcessType = attribute.String("messaging.operation.type", "process")
	attrSendName    = attribute.String("messaging.operation.name", "send")
	attrSendType    = attribute.String("messaging.operation.type", "send")
	attrCreateName  = attribute.String("messaging.operation.name", "create")
	attrCreateType  = attribute.String("messaging.operation.type", "create")

	optProcess = trace.WithSpanKind(ProcessSpanKind)
	optSend    = trace.WithSpanKind(SendSpanKind)
	optCreate  = trace.WithSpanKind(CreateSpanKind)
	optRoot    = trace.WithNewRoot()
)

// spanNames caches "<prefix><topic>" per topic, so that each span does not build its name.
type spanNames struct {
	prefix string
	names  sync.Map     // topic → name
	n      atomic.Int64 // entries in names (bounded by maxSpanNames)
}

// maxSpanNames bounds each span-name cache; topics beyond it get their name built per span.
const maxSpanNames = 1000

func (c *spanNames) name(topic string) string {
	if n, ok := c.names.Load(topic); ok {
		return n.(string)
	}
	n := c.prefix + topic
	if c.n.Load() < maxSpanNames {
		if _, loaded := c.names.LoadOrStore(topic, n); !loaded {
			c.n.Add(1)
		}
	}
	return n
}

// attrPool holds the attribute slices of span starts: the SDK copies the attributes into the
// span, so the slice can be reused once Start returned.
var attrPool = sync.Pool{New: func() any { s := make([]attribute.KeyValue, 0, 8); return &s }}

// hasContext reports whether md carries any header the propagator reads.
func (p *tracedPublisher) hasContext(md message.Metadata) bool {
	for _, f := range p.fields {
		if _, ok := md[f]; ok {
			return true
		}
	}
	return false
}

// mayProcess reports, without parsing anything, whether a message may get a process span: it
// carries a header the propagator reads (and, with W3C Trace Context, a traceparent whose
// sampled flag is set, unless Config.UnsampledSpans), or none and Config.RootSpans is set. It
// is the whole cost of an event that gets no span, on a stack kept as small as possible (see
// growStack).
func (p *tracedPublisher) mayProcess(md message.Metadata) bool {
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

// creation returns the creation context in md's headers, or an invalid SpanContext when
// there is none or it cannot be read.
func (p *tracedPublisher) creation(md message.Metadata) trace.SpanContext {
	if p.w3c {
		if sc, ok := parseTraceparent(md["traceparent"]); ok {
			if ts, has := md["tracestate"]; has && ts != "" {
				if state, err := trace.ParseTraceState(ts); err == nil {
					sc = sc.WithTraceState(state)
				}
			}
			return sc
		}
	}
	if !p.hasContext(md) {
		return trace.SpanContext{}
	}
	return trace.SpanContextFromContext(p.prop.Extract(context.Background(), propagation.MapCarrier(md)))
}

// parseTraceparent reads a W3C traceparent of version 00 ("00-<32 hex>-<16 hex>-<2 hex>") as
// a remote span context, as propagation.TraceContext does; ok is false for any other shape
// (the propagator decides then), for reserved flag bits and for all-zero ids.
func parseTraceparent(h string) (trace.SpanContext, bool) {
	if len(h) != 55 || h[0] != '0' || h[1] != '0' || h[2] != '-' || h[35] != '-' || h[52] != '-' {
		return trace.SpanContext{}, false
	}
	var scc trace.SpanContextConfig
	var flags [1]byte
	if !unhex(scc.TraceID[:], h[3:35]) || !unhex(scc.SpanID[:], h[36:52]) || !unhex(flags[:], h[53:55]) || flags[0] > 3 {
		return trace.SpanContext{}, false
	}
	scc.TraceFlags = trace.TraceFlags(flags[0]) & (trace.FlagsSampled | trace.FlagsRandom)
	scc.Remote = true
	sc := trace.NewSpanContext(scc)
	return sc, sc.IsValid()
}

// unhex decodes the lowercase hex s into dst (len(s) == 2*len(dst)); W3C Trace Context
// refuses uppercase.
func unhex(dst []byte, s string) bool {
	for i := range dst {
		hi, ok1 := hexDigit(s[2*i])
		lo, ok2 := hexDigit(s[2*i+1])
		if !ok1 || !ok2 {
			return false
		}
		dst[i] = hi<<4 | lo
	}
	return true
}

func hexDigit(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	}
	return 0, false
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

// sourceTopic is the outbox topic of msg (its outbox-topic metadata), or topic.
func sourceTopic(topic string, msg *message.Message) string {
	if s := msg.Metadata.Get(outbox.MetadataTopic); s != "" {
		return s
	}
	return topic
}

// createSpan gives msg a creation context of its own (Config.RootSpans): a span
// "create <topic>", root of a new trace whatever ctx carries, ended at once, whose context is
// written into msg's headers. It returns that context.
func (p *tracedPublisher) createSpan(ctx context.Context, topic string, msg *message.Message) trace.SpanContext {
	ap := attrPool.Get().(*[]attribute.KeyValue)
	attrs := append((*ap)[:0], p.system, attrCreateName, attrCreateType,
		attribute.String("messaging.destination.name", topic),
		attribute.String("messaging.message.id", msg.UUID))
	cctx, span := p.tracer.Start(ctx, p.create.name(topic), optRoot, optCreate, trace.WithAttributes(attrs...))
	putAttrs(ap, attrs)
	p.prop.Inject(cctx, propagation.MapCarrier(msg.Metadata))
	span.End()
	return span.SpanContext()
}

// putAttrs returns a pooled attribute slice, without references to this span's strings.
func putAttrs(ap *[]attribute.KeyValue, attrs []attribute.KeyValue) {
	clear(attrs)
	*ap = attrs[:0]
	attrPool.Put(ap)
}

// errorType is the error.type attribute of a failed delivery: the outbox's failure class, or
// the conventions' fallback "_OTHER".
func errorType(err error) string {
	switch {
	case errors.Is(err, outbox.ErrUnavailable):
		return "unavailable"
	case errors.Is(err, outbox.ErrPermanent):
		return "permanent"
	case errors.Is(err, outbox.ErrNotAttempted):
		return "not_attempted"
	case errors.Is(err, forwarder.ErrHeldBack):
		return "held_back"
	case errors.Is(err, forwarder.ErrMissingResult):
		return "missing_result"
	}
	return "_OTHER"
}

// fail records err as span's outcome: status Error with the error's text, error.type, and the
// error as an event.
func fail(span trace.Span, err error, desc string) {
	span.SetAttributes(attribute.String("error.type", errorType(err)))
	span.RecordError(err)
	span.SetStatus(codes.Error, desc)
}

// Publish is the per-message path: each message whose creation context is sampled (or that
// Config.UnsampledSpans and Config.RootSpans add) is published in its own process span, one
// call to the wrapped Publish per message so that each result is its own; the others are
// published unchanged.
func (p *tracedPublisher) Publish(topic string, msgs ...*message.Message) error {
	for _, msg := range msgs {
		var err error
		if p.mayProcess(msg.Metadata) {
			growStack() // before publishProcessed's own frame needs more than the stack has
			err = p.publishProcessed(topic, msg)
		} else {
			err = p.pub.Publish(topic, msg)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// publishProcessed publishes msg in its process span, if it gets one.
//
//go:noinline
func (p *tracedPublisher) publishProcessed(topic string, msg *message.Message) error {
	mctx := msg.Context()
	cc := p.creation(msg.Metadata)
	var parent context.Context
	switch {
	case cc.IsValid():
		parent = trace.ContextWithRemoteSpanContext(mctx, cc)
	case p.roots:
		cc = p.createSpan(mctx, topic, msg)
		parent = trace.ContextWithSpanContext(mctx, cc)
	default:
		return p.pub.Publish(topic, msg) // unreadable headers, no RootSpans
	}
	if !cc.IsSampled() && !p.unsampled {
		return p.pub.Publish(topic, msg)
	}
	source := sourceTopic(topic, msg)
	ctx, span := p.tracer.Start(parent, p.process.name(source), optProcess)
	if span.IsRecording() {
		// Set after Start, not as start options: the SDK would copy them once more from the
		// options, and an unrecorded span needs none.
		ap := attrPool.Get().(*[]attribute.KeyValue)
		attrs := append((*ap)[:0], attrOutbox, attrProcessName, attrProcessType,
			attribute.String("messaging.destination.name", source),
			attribute.String("messaging.message.id", msg.UUID),
			attribute.String("outbox.destination.name", topic))
		if a, err := strconv.Atoi(msg.Metadata.Get(outbox.MetadataAttempt)); err == nil {
			attrs = append(attrs, attribute.Int("outbox.attempt", a))
		}
		span.SetAttributes(attrs...)
		putAttrs(ap, attrs)
		span.AddLink(trace.Link{SpanContext: cc})
	}
	msg.SetContext(ctx)
	err := p.pub.Publish(topic, msg)
	if err != nil {
		fail(span, err, err.Error())
	}
	span.End()
	return err
}

// growStack grows the calling goroutine's stack to 8 KiB at once, while its stack is still
// shallow. The forwarder's per-message path runs each delivery on a new goroutine
// (Watermill's Router), whose stack starts at 2 KiB; the SDK's span start and end need more
// (4 KiB do not do), and growing the stack down there copies every frame of the router, the
// middlewares and the SDK, once per doubling, where one copy of the few frames above Publish
// is cheap (the cost of a copy grows with the frames, not the bytes). CockroachDB's growstack
// package does the same. A goroutine whose stack is already large pays a call and a 4 KiB
// clear.
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

// PublishBatch is the batch path: the wrapped PublishBatch runs inside one span
// "send <destination>" (kind SendSpanKind; "send" alone when the batch goes to several
// topics), the root of a trace of its own whatever ctx carries, with messaging.batch.message_count,
// and, when the sampler records it, a link to each message's creation context (link
// attribute messaging.message.id). With Config.RootSpans a message without a creation context
// first gets a create span (see Config.RootSpans). The span's status is Error when any
// message failed (error.type of the first failure). The destination gets ctx with the send
// span in it.
func (p *tracedBatchPublisher) PublishBatch(ctx context.Context, batch []forwarder.Outgoing) []error {
	if len(batch) == 0 {
		return p.bp.PublishBatch(ctx, batch)
	}
	var created []trace.SpanContext // Config.RootSpans: the create spans' contexts, by index
	if p.roots {
		for i, o := range batch {
			if p.creation(o.Message.Metadata).IsValid() {
				continue
			}
			if created == nil {
				created = make([]trace.SpanContext, len(batch))
			}
			created[i] = p.createSpan(ctx, o.Topic, o.Message)
		}
	}
	topic := batch[0].Topic
	for _, o := range batch[1:] {
		if o.Topic != topic {
			topic = ""
			break
		}
	}
	name := "send"
	if topic != "" {
		name = p.send.name(topic)
	}
	sctx, span := p.tracer.Start(ctx, name, optRoot, optSend)
	if span.IsRecording() {
		ap := attrPool.Get().(*[]attribute.KeyValue)
		attrs := append((*ap)[:0], p.system, attrSendName, attrSendType,
			attribute.Int("messaging.batch.message_count", len(batch)))
		if topic != "" {
			attrs = append(attrs, attribute.String("messaging.destination.name", topic))
		}
		span.SetAttributes(attrs...)
		putAttrs(ap, attrs)
		for i, o := range batch {
			var cc trace.SpanContext
			if created != nil && created[i].IsValid() {
				cc = created[i]
			} else {
				cc = p.creation(o.Message.Metadata)
			}
			if cc.IsValid() {
				span.AddLink(trace.Link{SpanContext: cc, Attributes: []attribute.KeyValue{attribute.String("messaging.message.id", o.Message.UUID)}})
			}
		}
	}
	errs := p.bp.PublishBatch(sctx, batch)
	if span.IsRecording() {
		failed, first := 0, error(nil)
		for i := range batch {
			err := forwarder.ErrMissingResult
			if i < len(errs) {
				err = errs[i]
			}
			if err != nil {
				if first == nil {
					first = err
				}
				failed++
			}
		}
		if first != nil {
			fail(span, first, fmt.Sprintf("%d of %d messages failed; first: %v", failed, len(batch), first))
		}
	}
	span.End()
	return errs
}
