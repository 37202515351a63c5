package tracing_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	wmredis "github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/forwarder"
	"github.com/watermill-outbox/outbox/forwarder/amqp"
	"github.com/watermill-outbox/outbox/forwarder/kafka"
	"github.com/watermill-outbox/outbox/forwarder/redisstream"
	"github.com/watermill-outbox/outbox/internal/brokertest"
	"github.com/watermill-outbox/outbox/internal/pgtest"
	"github.com/watermill-outbox/outbox/tracing"
	"github.com/watermill-outbox/outbox/webhook"
)

// destination is a relay destination and how to read back the traceparent that arrived there.
type destination struct {
	name  string
	setup func(t *testing.T, topic string) (message.Publisher, func() string)
}

func destinations() []destination {
	return []destination{
		{"func", func(t *testing.T, _ string) (message.Publisher, func() string) {
			var mu sync.Mutex
			var got string
			return forwarder.Func(func(_ context.Context, m *message.Message) error {
					mu.Lock()
					got = m.Metadata.Get("traceparent")
					mu.Unlock()
					return nil
				}), func() string {
					mu.Lock()
					defer mu.Unlock()
					return got
				}
		}},
		{"webhook", func(t *testing.T, _ string) (message.Publisher, func() string) {
			var mu sync.Mutex
			var got string
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				got = r.Header.Get("traceparent")
				mu.Unlock()
				w.WriteHeader(http.StatusNoContent)
			}))
			t.Cleanup(srv.Close)
			pub, err := webhook.NewPublisher(webhook.Config{URL: srv.URL, AllowedPrefixes: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}, nil)
			if err != nil {
				t.Fatal(err)
			}
			return pub, func() string {
				mu.Lock()
				defer mu.Unlock()
				return got
			}
		}},
		{"kafka", func(t *testing.T, topic string) (message.Publisher, func() string) {
			c := brokertest.Kafka(t, kfake.SeedTopics(1, topic))
			pub, err := kafka.NewPublisher(kafka.Config{Brokers: c.ListenAddrs()}, nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = pub.Close() })
			cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics(topic))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(cl.Close)
			var got string
			return pub, func() string {
				ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
				defer cancel()
				cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) {
					for _, h := range r.Headers {
						if h.Key == "traceparent" {
							got = string(h.Value)
						}
					}
				})
				return got
			}
		}},
		{"redis", func(t *testing.T, topic string) (message.Publisher, func() string) {
			addr := brokertest.RequireRedis(t)
			pub, err := redisstream.NewPublisher(redisstream.Config{Options: &redis.Options{Addr: addr}}, nil)
			if err != nil {
				t.Fatal(err)
			}
			c := redis.NewClient(&redis.Options{Addr: addr})
			t.Cleanup(func() { _ = c.Del(context.Background(), topic).Err(); _ = c.Close(); _ = pub.Close() })
			return pub, func() string {
				xs, err := c.XRange(context.Background(), topic, "-", "+").Result()
				if err != nil || len(xs) == 0 {
					return ""
				}
				m, err := wmredis.DefaultMarshallerUnmarshaller{}.Unmarshal(xs[0].Values)
				if err != nil {
					t.Fatal(err)
				}
				return m.Metadata.Get("traceparent")
			}
		}},
		{"rabbitmq", func(t *testing.T, topic string) (message.Publisher, func() string) {
			url := brokertest.RequireRabbitMQ(t)
			conn, err := amqp091.Dial(url)
			if err != nil {
				t.Fatal(err)
			}
			ch, err := conn.Channel()
			if err != nil {
				t.Fatal(err)
			}
			if _, err := ch.QueueDeclare(topic, false, true, false, false, nil); err != nil {
				t.Fatal(err)
			}
			pub, err := amqp.NewPublisher(amqp.Config{URL: url}, nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = pub.Close(); _, _ = ch.QueueDelete(topic, false, false, false); _ = conn.Close() })
			var got string
			return pub, func() string {
				if d, ok, err := ch.Get(topic, true); err == nil && ok {
					got, _ = d.Headers["traceparent"].(string)
				}
				return got
			}
		}},
	}
}

// TestTraceFromWriterToDestination: an event written in a span (Enqueue with the span in
// ctx, Publish with it in the message's context) reaches each destination with the writer's
// traceparent unchanged (its creation context), and the relay's span refers to the writer's:
// on the per-message path (func, webhook) a span "process <topic>" (CONSUMER) that is the
// writer span's child and links to it; on the batch path (Kafka, Redis, RabbitMQ) a span
// "send <topic>" (CLIENT), the root of its own trace, with one link, to the writer's span.
func TestTraceFromWriterToDestination(t *testing.T) {
	pool := pgtest.Require(t)
	for _, d := range destinations() {
		for _, via := range []string{"enqueue", "publish"} {
			t.Run(d.name+"/"+via, func(t *testing.T) {
				ctx := t.Context()
				topic := fmt.Sprintf("trace-%s-%s", via, uuid.NewString()[:8])
				pub, received := d.setup(t, topic)
				_, batch := pub.(forwarder.BatchPublisher)
				sr := tracetest.NewSpanRecorder()
				tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
				schema := outbox.SchemaConfig{Table: pgtest.Table(t)}
				if err := outbox.Migrate(ctx, pool, schema); err != nil {
					t.Fatal(err)
				}
				writer, err := outbox.NewPublisher(pool, outbox.PublisherConfig{Schema: schema, InjectHeaders: tracing.InjectHeaders(nil)}, nil)
				if err != nil {
					t.Fatal(err)
				}
				wctx, span := tp.Tracer("app").Start(ctx, "handle request")
				if via == "enqueue" {
					_, err = writer.Enqueue(wctx, outbox.EventInput{Topic: topic, Payload: 1, Headers: map[string]string{"a": "b"}})
				} else {
					msg := outbox.NewMessage([]byte(`1`))
					msg.SetContext(wctx)
					err = writer.Publish(topic, msg)
				}
				span.End()
				if err != nil {
					t.Fatal(err)
				}
				write := span.SpanContext()

				sub, err := outbox.NewSubscriber(pool, outbox.SubscriberConfig{Schema: schema, PollInterval: 20 * time.Millisecond}, nil)
				if err != nil {
					t.Fatal(err)
				}
				fw, err := forwarder.New(sub, tracing.Publisher(pub, tracing.Config{TracerProvider: tp}), forwarder.Config{SubscribeTopic: topic}, nil)
				if err != nil {
					t.Fatal(err)
				}
				go func() { _ = fw.Run(ctx) }()
				t.Cleanup(func() { _ = fw.Close() })

				var tp0 string
				pgtest.Eventually(t, 20*time.Second, "the traceparent at the destination", func() bool {
					tp0 = received()
					return tp0 != ""
				})
				if want := fmt.Sprintf("00-%s-%s-01", write.TraceID(), write.SpanID()); tp0 != want {
					t.Errorf("traceparent at %s = %q, want the writer's %q", d.name, tp0, want)
				}
				name, kind := "process "+topic, trace.SpanKindConsumer
				if batch {
					name, kind = "send "+topic, trace.SpanKindClient
				}
				var relay sdktrace.ReadOnlySpan
				pgtest.Eventually(t, 5*time.Second, "the relay's span ended", func() bool {
					for _, s := range sr.Ended() {
						if s.Name() == name {
							relay = s
						}
					}
					return relay != nil
				})
				if n := len(sr.Ended()); n != 2 {
					t.Errorf("%d spans ended, want the writer's and the relay's", n)
				}
				if relay.SpanKind() != kind || relay.Status().Code != codes.Unset {
					t.Errorf("span kind %v, status %v: want %v, unset", relay.SpanKind(), relay.Status(), kind)
				}
				if l := relay.Links(); len(l) != 1 || l[0].SpanContext.SpanID() != write.SpanID() || l[0].SpanContext.TraceID() != write.TraceID() {
					t.Errorf("links %v, want one to the writer's span", l)
				}
				a := attrs(relay.Attributes())
				if batch {
					if relay.Parent().IsValid() || a["messaging.batch.message_count"] != "1" || a["messaging.destination.name"] != topic {
						t.Errorf("send span parent %s, attributes %v: want a root, one message", relay.Parent().SpanID(), a)
					}
					return
				}
				if relay.Parent().SpanID() != write.SpanID() || relay.SpanContext().TraceID() != write.TraceID() {
					t.Errorf("process span parent %s/%s, want the writer's %s/%s", relay.Parent().TraceID(), relay.Parent().SpanID(), write.TraceID(), write.SpanID())
				}
				if a["outbox.attempt"] != "1" || a["messaging.destination.name"] != topic || a["messaging.message.id"] == "" {
					t.Errorf("process span attributes %v", a)
				}
			})
		}
	}
}

// TestInjectHeadersKeepsCallerMap: a header the caller set wins, the caller's map is not
// written, and a context without a span adds nothing.
func TestInjectHeadersKeepsCallerMap(t *testing.T) {
	inject := tracing.InjectHeaders(nil)
	var set []string
	inject(context.Background(), func(k, v string) { set = append(set, k) })
	if len(set) != 0 {
		t.Fatalf("no span, but set %v", set)
	}
	tp := sdktrace.NewTracerProvider()
	ctx, span := tp.Tracer("t").Start(context.Background(), "s")
	defer span.End()
	inject(ctx, func(k, v string) { set = append(set, k+"="+v) })
	if len(set) != 1 || !strings.HasPrefix(set[0], "traceparent=00-"+span.SpanContext().TraceID().String()) {
		t.Fatalf("set %v", set)
	}
}
