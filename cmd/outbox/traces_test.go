package main

import (
	"context"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/internal/pgtest"
)

// TestRelayExportsSpans runs the relay with OTEL_TRACES_EXPORTER=otlp against a loopback OTLP/HTTP
// collector and a loopback webhook: the event written with a traceparent is delivered in a span
// "process traced" (the webhook is on the per-message path) that is a child of the writer's
// span, the collector receives that span (same trace id, parent = the writer's span id), and the
// webhook request carries the writer's context unchanged (the event's creation context).
// Without the variable the start line says traces=off.
func TestRelayExportsSpans(t *testing.T) {
	b := postgresBackend()
	db, table := b.fresh(t)
	mustRun(t, nil, "migrate", "--db", db, "--table", table)
	const traceID, writerSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	pub, err := outbox.NewPublisher(pgtest.Require(t), outbox.PublisherConfig{Schema: outbox.SchemaConfig{Table: table}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pub.Enqueue(context.Background(), outbox.EventInput{Topic: "traced", Payload: 1,
		Headers: map[string]string{"traceparent": "00-" + traceID + "-" + writerSpan + "-01"}}); err != nil {
		t.Fatal(err)
	}

	type span struct{ trace, id, parent, name string }
	var (
		mu        sync.Mutex
		spans     []span
		delivered []string // traceparent headers the webhook received
	)
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var req coltracepb.ExportTraceServiceRequest
		if r.URL.Path != "/v1/traces" || proto.Unmarshal(body, &req) != nil {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		mu.Lock()
		for _, rs := range req.ResourceSpans {
			for _, ss := range rs.ScopeSpans {
				for _, s := range ss.Spans {
					spans = append(spans, span{hex.EncodeToString(s.TraceId), hex.EncodeToString(s.SpanId), hex.EncodeToString(s.ParentSpanId), s.Name})
				}
			}
		}
		mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
		out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		_, _ = w.Write(out)
	}))
	defer collector.Close()
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		delivered = append(delivered, r.Header.Get("traceparent"))
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	defer hook.Close()

	env := []string{"OTEL_TRACES_EXPORTER=otlp", "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf", "OTEL_EXPORTER_OTLP_ENDPOINT=" + collector.URL,
		"OTEL_BSP_SCHEDULE_DELAY=100", "OTEL_SERVICE_NAME=", "OTEL_SDK_DISABLED="}
	p := start(t, env, "relay", "--db", db, "--table", table, "--to", hook.URL+"/hook", "--allow-prefix", "127.0.0.0/8", "--poll-interval", "50ms")
	var got span
	p.runUntil(t, "the process span exported", func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, s := range spans {
			if s.name == "process traced" {
				got = s
				return true
			}
		}
		return false
	})
	if got.trace != traceID || got.parent != writerSpan {
		t.Errorf("process span: trace %s parent %s; want trace %s parent %s (the writer's span)", got.trace, got.parent, traceID, writerSpan)
	}
	mu.Lock()
	if want := "00-" + traceID + "-" + writerSpan + "-01"; len(delivered) != 1 || delivered[0] != want {
		t.Errorf("webhook traceparent %q, want [%q] (the writer's context unchanged)", delivered, want)
	}
	if len(spans) != 1 {
		t.Errorf("%d spans exported, want 1: %+v", len(spans), spans)
	}
	mu.Unlock()
	if !strings.Contains(p.errb.String(), `traces="otlp `+collector.URL+`"`) {
		t.Errorf("start line lacks traces=\"otlp %s\": %s", collector.URL, p.errb.String())
	}

	// Off by default: no OTEL_TRACES_EXPORTER, no export.
	p = start(t, []string{"OTEL_TRACES_EXPORTER="}, "relay", "--db", db, "--table", table, "--to", hook.URL+"/hook", "--allow-prefix", "127.0.0.0/8")
	p.runUntil(t, "the start line", func() bool { return strings.Contains(p.errb.String(), "outbox relay starting") })
	if !strings.Contains(p.errb.String(), "traces=off") {
		t.Errorf("start line without OTEL_TRACES_EXPORTER lacks traces=off: %s", p.errb.String())
	}
}
