package forwarder

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-outbox/outbox"
)

func TestConfigValidate(t *testing.T) {
	cases := []struct {
		name  string
		cfg   Config
		field string
	}{
		{"zero value", Config{}, ""},
		{"prefix pattern", Config{SubscribeTopic: "orders.*"}, ""},
		{"star inside", Config{SubscribeTopic: "a*b"}, "forwarder.Config.SubscribeTopic"},
		{"question mark", Config{SubscribeTopic: "a?"}, "forwarder.Config.SubscribeTopic"},
		{"negative subscriptions", Config{Subscriptions: -1}, "forwarder.Config.Subscriptions"},
		{"too many subscriptions", Config{Subscriptions: MaxSubscriptions + 1}, "forwarder.Config.Subscriptions"},
		{"negative close timeout", Config{CloseTimeout: -time.Second}, "forwarder.Config.CloseTimeout"},
		{"nil middleware", Config{Middlewares: []message.HandlerMiddleware{nil}}, "forwarder.Config.Middlewares[0]"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.cfg.Validate()
			if c.field == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			var ce *outbox.ConfigError
			if !errors.As(err, &ce) || ce.Field != c.field || !errors.Is(err, outbox.ErrConfig) {
				t.Fatalf("Validate = %v, want ConfigError on %s", err, c.field)
			}
		})
	}
}

type nopSub struct{}

func (nopSub) Subscribe(context.Context, string) (<-chan *message.Message, error) { return nil, nil }
func (nopSub) SubscribeBatches(context.Context, string) (<-chan outbox.Batch, error) {
	return nil, nil
}
func (nopSub) Close() error { return nil }

func TestNewRefuses(t *testing.T) {
	pub := Func(func(context.Context, *message.Message) error { return nil })
	if _, err := New(nil, pub, Config{}, nil); !errors.Is(err, outbox.ErrConfig) {
		t.Errorf("nil subscriber: %v", err)
	}
	if _, err := New(nopSub{}, nil, Config{}, nil); !errors.Is(err, outbox.ErrConfig) {
		t.Errorf("nil publisher: %v", err)
	}
	if _, err := New(nopSub{}, pub, Config{Subscriptions: -2}, nil); !errors.Is(err, outbox.ErrConfig) {
		t.Errorf("bad config: %v", err)
	}
}

func outboxMsg(id, topic, key string) *message.Message {
	m := message.NewMessage(id, []byte(`{"a":1}`))
	m.Metadata.Set(outbox.MetadataTopic, topic)
	m.Metadata.Set("trace", "t-"+id)
	if key != "" {
		m.Metadata.Set(outbox.MetadataOrderingKey, key)
	}
	return m
}

func TestHandler(t *testing.T) {
	var got []*message.Message
	var topics []string
	pub := Func(func(ctx context.Context, msg *message.Message) error {
		topic, _ := TopicFromContext(ctx)
		if topic == "out.fail" {
			return errors.New("refused")
		}
		got, topics = append(got, msg), append(topics, topic)
		return nil
	})
	h := Handler(pub, Config{Topic: func(topic string, _ *message.Message) string { return "out." + topic }})
	in := outboxMsg("id-1", "orders", "k")
	if err := h(in); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0] == in || got[0].UUID != "id-1" || string(got[0].Payload) != `{"a":1}` ||
		got[0].Metadata.Get("trace") != "t-id-1" || got[0].Metadata.Get(outbox.MetadataOrderingKey) != "k" || topics[0] != "out.orders" {
		t.Fatalf("published %+v to %v", got, topics)
	}

	err := h(outboxMsg("id-2", "fail", ""))
	var pe *PublishError
	if !errors.As(err, &pe) || pe.EventID != "id-2" || pe.Topic != "out.fail" || pe.Err.Error() != "refused" {
		t.Fatalf("failure: %v", err)
	}

	// No topic: ErrNoTopic.
	if err := h(message.NewMessage("id-3", nil)); !errors.Is(err, ErrNoTopic) {
		t.Fatalf("message without topic: %v", err)
	}
	empty := Handler(pub, Config{Topic: func(string, *message.Message) string { return "" }})
	if err := empty(outboxMsg("id-4", "x", "")); !errors.Is(err, ErrNoTopic) {
		t.Fatalf("Topic returned empty: %v", err)
	}
}

// fakeBatch returns per-message results from a table and records what it was given.
type fakeBatch struct {
	results map[string]error
	short   bool
	got     []string
}

func (f *fakeBatch) Publish(string, ...*message.Message) error { return errors.New("unused") }
func (f *fakeBatch) Close() error                              { return nil }
func (f *fakeBatch) PublishBatch(_ context.Context, batch []Outgoing) []error {
	errs := make([]error, len(batch))
	for i, o := range batch {
		f.got = append(f.got, o.Topic+"/"+o.Message.UUID)
		errs[i] = f.results[o.Message.UUID]
	}
	if f.short {
		return errs[:len(errs)-1]
	}
	return errs
}

func TestForwardBatch(t *testing.T) {
	boom := errors.New("boom")
	f := &fakeBatch{results: map[string]error{"b": boom}}
	mapTopic := func(topic string, msg *message.Message) string {
		if msg.UUID == "x" {
			return "" // cannot be prepared: key k2's later messages are held back
		}
		return topic
	}
	msgs := []*message.Message{
		outboxMsg("a", "t", "k1"), outboxMsg("x", "t", "k2"), outboxMsg("b", "t", "k1"),
		outboxMsg("c", "t", "k2"), outboxMsg("d", "t", ""),
	}
	errs := forwardBatch(context.Background(), f, mapTopic, msgs)
	if fmt.Sprint(f.got) != "[t/a t/b t/d]" {
		t.Errorf("published %v", f.got)
	}
	switch {
	case errs[0] != nil || errs[4] != nil:
		t.Errorf("successes: %v %v", errs[0], errs[4])
	case !errors.Is(errs[1], ErrNoTopic):
		t.Errorf("x: %v", errs[1])
	case !errors.Is(errs[2], boom):
		t.Errorf("b: %v", errs[2])
	case !errors.Is(errs[3], ErrHeldBack):
		t.Errorf("c: %v", errs[3])
	}

	short := &fakeBatch{short: true}
	errs = forwardBatch(context.Background(), short, nil, []*message.Message{outboxMsg("a", "t", ""), outboxMsg("b", "t", "")})
	if errs[0] != nil || !errors.Is(errs[1], ErrMissingResult) {
		t.Errorf("short result: %v", errs)
	}
}

func TestFunc(t *testing.T) {
	var seen []string
	f := Func(func(ctx context.Context, msg *message.Message) error {
		topic, ok := TopicFromContext(ctx)
		if !ok {
			t.Error("no topic in context")
		}
		seen = append(seen, topic+"/"+msg.UUID)
		if msg.UUID == "2" {
			return errors.New("stop")
		}
		return nil
	})
	err := f.Publish("t", message.NewMessage("1", nil), message.NewMessage("2", nil), message.NewMessage("3", nil))
	if err == nil || err.Error() != "stop" || fmt.Sprint(seen) != "[t/1 t/2]" {
		t.Fatalf("Publish = %v, seen %v", err, seen)
	}
	if _, ok := TopicFromContext(context.Background()); ok {
		t.Error("topic in a bare context")
	}
	if f.Close() != nil {
		t.Error("Close")
	}
}
