package main

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/contrib/exporters/autoexport"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/watermill-outbox/outbox/tracing"
)

// relayTracer is the relay's span export, configured by the standard OTEL_* environment
// variables (OTEL_TRACES_EXPORTER, OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_PROTOCOL,
// OTEL_SERVICE_NAME, OTEL_TRACES_SAMPLER …, read by the OTel SDK and autoexport). Off unless
// OTEL_TRACES_EXPORTER names an exporter ("otlp", "console"); "none" and OTEL_SDK_DISABLED=true
// keep it off.
type relayTracer struct {
	tp *sdktrace.TracerProvider // nil when off
}

// newRelayTracer builds the tracer provider when OTEL_TRACES_EXPORTER asks for one; its spans
// keep up to batchSize links (a send span links every event of a batch) unless
// OTEL_SPAN_LINK_COUNT_LIMIT sets the limit. Errors: autoexport's for an unknown exporter or
// protocol (a usage error).
func newRelayTracer(ctx context.Context, batchSize int) (*relayTracer, error) {
	name := strings.TrimSpace(os.Getenv("OTEL_TRACES_EXPORTER"))
	if name == "" || name == "none" || strings.EqualFold(os.Getenv("OTEL_SDK_DISABLED"), "true") {
		return &relayTracer{}, nil
	}
	exp, err := autoexport.NewSpanExporter(ctx)
	if err != nil {
		return nil, &usageError{fmt.Errorf("OTEL_TRACES_EXPORTER=%s: %w", name, err)}
	}
	// resource.Default reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES; the service name
	// is "outbox-relay" unless one of them sets it.
	res := resource.Default()
	if os.Getenv("OTEL_SERVICE_NAME") == "" && !strings.Contains(os.Getenv("OTEL_RESOURCE_ATTRIBUTES"), "service.name=") {
		if r, err := resource.Merge(res, resource.NewSchemaless(attribute.String("service.name", "outbox-relay"))); err == nil {
			res = r
		}
	}
	// The sampler comes from OTEL_TRACES_SAMPLER (default: parent-based, always on); the span
	// limits from the OTEL_SPAN_* variables.
	limits := sdktrace.NewSpanLimits()
	if _, set := os.LookupEnv("OTEL_SPAN_LINK_COUNT_LIMIT"); !set && batchSize > limits.LinkCountLimit {
		limits.LinkCountLimit = batchSize
	}
	return &relayTracer{tp: sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res), sdktrace.WithRawSpanLimits(limits))}, nil
}

// messagingSystems is the messaging.system of each destination kind's send spans.
var messagingSystems = map[destKind]string{destKafka: "kafka", destAMQP: "rabbitmq", destRedis: "redis", destHTTP: "webhook", destAsynq: "asynq"}

// wrap returns pub traced (tracing.Publisher) when tracing is on.
func (r *relayTracer) wrap(pub message.Publisher, kind destKind) message.Publisher {
	if r.tp == nil {
		return pub
	}
	return tracing.Publisher(pub, tracing.Config{TracerProvider: r.tp, System: messagingSystems[kind]})
}

// on reports whether spans are exported.
func (r *relayTracer) on() bool { return r.tp != nil }

// close flushes the spans not exported yet (at most 5 s) and stops the exporter.
func (r *relayTracer) close(logger watermill.LoggerAdapter) {
	if r.tp == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := r.tp.Shutdown(ctx); err != nil {
		logger.Error("outbox relay: flushing spans failed", err, nil)
	}
}

// tracesSetting is the start line's "traces" field: "off", or the exporter and its endpoint.
func tracesSetting(r *relayTracer) string {
	if !r.on() {
		return "off"
	}
	s := os.Getenv("OTEL_TRACES_EXPORTER")
	for _, k := range []string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"} {
		if v := os.Getenv(k); v != "" && s == "otlp" {
			if u, err := url.Parse(v); err == nil {
				v = u.Redacted()
			}
			return s + " " + v
		}
	}
	return s
}
