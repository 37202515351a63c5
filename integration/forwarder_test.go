package integration_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/forwarder"
)

var fwdErrBoom = errors.New("boom: destination refused")

// TestForwarderFunc relays 1,000 events over 50 keys to a Go function through the per-message
// path (Watermill router). One event fails every time: it is retried with backoff and
// dead-lettered at MaxAttempts with its error in last_error, its key's later events stay
// pending behind it, and every other key is delivered in order, each event marked once.
func TestForwarderFunc(t *testing.T) {
	e := fwdNewEnv(t)
	topicOf := func(k int) string { return []string{"fwd.func.a", "fwd.func.b"}[k%2] }
	evs := e.seed(1000, 50, topicOf)
	bad := evs[7+50*3] // key-07, position 3
	if bad.key != "key-07" || bad.pos != 3 {
		t.Fatalf("seed layout: %s pos %d", bad.key, bad.pos)
	}
	var col fwdCollector
	var calls atomic.Int64
	dest := forwarder.Func(func(ctx context.Context, msg *message.Message) error {
		calls.Add(1)
		if msg.UUID == bad.id {
			return fwdErrBoom
		}
		topic, _ := forwarder.TopicFromContext(ctx)
		col.add(fwdReceived{uuid: msg.UUID, topic: topic, payload: msg.Payload, metadata: msg.Metadata, partition: -1})
		return nil
	})
	e.run(e.subscriber(outbox.SubscriberConfig{}), dest, forwarder.Config{SubscribeTopic: "fwd.func.*"})

	heldBehind, _ := fwdSplit(evs, func(ev *fwdEvent) bool { return ev.key == "key-07" && ev.pos > 3 })
	delivered, _ := fwdSplit(evs, func(ev *fwdEvent) bool { return ev.key != "key-07" || ev.pos < 3 })
	e.waitSettled(30*time.Second, len(delivered), 1)
	e.checkReceived(col.all(), delivered, func(s string) string { return s })
	e.checkMarkedOnce(fwdIDs(delivered))
	e.checkDeadLettered([]*fwdEvent{bad}, 3, fwdErrBoom)
	if got := e.lastError(bad.id); !strings.Contains(got, fwdErrBoom.Error()) {
		t.Errorf("last_error = %q, want it to contain %q", got, fwdErrBoom)
	}
	if n := e.count("published_at IS NULL AND dead_lettered_at IS NULL AND attempts = 0 AND ordering_key = 'key-07'"); n != len(heldBehind) {
		t.Errorf("%d events of key-07 pending behind the dead letter, want %d", n, len(heldBehind))
	}
	if got := calls.Load(); got != int64(len(delivered)+3) {
		t.Errorf("destination called %d times, want %d (each delivered event once, the failing one 3 times)", got, len(delivered)+3)
	}
}

// TestForwarderTopicAndMiddlewares: Config.Topic maps topics, Config.Middlewares run inside
// outbox.RecordError, so the error a middleware returns is the one stored.
func TestForwarderTopicAndMiddlewares(t *testing.T) {
	e := fwdNewEnv(t)
	evs := e.seed(40, 4, func(k int) string { return "fwd.map.in" })
	var mu sync.Mutex
	topics := map[string]int{}
	dest := forwarder.Func(func(ctx context.Context, msg *message.Message) error {
		topic, _ := forwarder.TopicFromContext(ctx)
		mu.Lock()
		topics[topic]++
		mu.Unlock()
		return nil
	})
	wrapped := errors.New("wrapped by middleware")
	var mwCalls atomic.Int64
	mw := func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			mwCalls.Add(1)
			if msg.Metadata.Get(outbox.MetadataOrderingKey) == "key-02" {
				return nil, wrapped
			}
			return h(msg)
		}
	}
	cfg := forwarder.Config{
		Topic:       func(topic string, _ *message.Message) string { return "out." + topic },
		Middlewares: []message.HandlerMiddleware{mw},
	}
	e.run(e.subscriber(outbox.SubscriberConfig{}), dest, cfg)
	dead, _ := fwdSplit(evs, func(ev *fwdEvent) bool { return ev.key == "key-02" && ev.pos == 0 })
	e.waitSettled(20*time.Second, 30, 1)
	e.checkDeadLettered(dead, 3, wrapped)
	mu.Lock()
	defer mu.Unlock()
	if len(topics) != 1 || topics["out.fwd.map.in"] != 30 {
		t.Errorf("destination topics %v, want out.fwd.map.in ×30", topics)
	}
	if got := mwCalls.Load(); got != 33 {
		t.Errorf("middleware ran %d times, want 33", got)
	}
}

// fwdBatchDest is an in-memory BatchPublisher that fails one event and holds back the later
// events of its key in the same batch, as the contract asks.
type fwdBatchDest struct {
	fail  string
	col   *fwdCollector
	mu    sync.Mutex
	sizes []int
}

func (d *fwdBatchDest) Publish(topic string, msgs ...*message.Message) error {
	return errors.New("Publish must not be used on the batch path")
}

func (d *fwdBatchDest) Close() error { return nil }

func (d *fwdBatchDest) PublishBatch(ctx context.Context, batch []forwarder.Outgoing) []error {
	d.mu.Lock()
	d.sizes = append(d.sizes, len(batch))
	d.mu.Unlock()
	errs := make([]error, len(batch))
	held := map[string]bool{}
	for i, o := range batch {
		key := o.Message.Metadata.Get(outbox.MetadataOrderingKey)
		switch {
		case held[key]:
			errs[i] = forwarder.ErrHeldBack
		case o.Message.UUID == d.fail:
			errs[i] = fwdErrBoom
			held[key] = true
		default:
			d.col.add(fwdReceived{uuid: o.Message.UUID, topic: o.Topic, payload: o.Message.Payload, metadata: o.Message.Metadata, partition: -1})
		}
	}
	return errs
}

// TestForwarderBatchPath: a BatchPublisher gets whole claimed batches; a failed event is
// retried and dead-lettered; its key's later events in the batch are released without an
// attempt and stay pending; the other keys are unaffected.
func TestForwarderBatchPath(t *testing.T) {
	e := fwdNewEnv(t)
	evs := e.seed(1000, 50, func(k int) string { return "fwd.batch" })
	bad := evs[11+50*2] // key-11, position 2
	var col fwdCollector
	dest := &fwdBatchDest{fail: bad.id, col: &col}
	e.run(e.subscriber(outbox.SubscriberConfig{}), dest, forwarder.Config{Subscriptions: 2})
	delivered, _ := fwdSplit(evs, func(ev *fwdEvent) bool { return ev.key != "key-11" || ev.pos < 2 })
	e.waitSettled(30*time.Second, len(delivered), 1)
	e.checkReceived(col.all(), delivered, func(s string) string { return s })
	e.checkMarkedOnce(fwdIDs(delivered))
	e.checkDeadLettered([]*fwdEvent{bad}, 3, fwdErrBoom)
	if n := e.count("published_at IS NULL AND dead_lettered_at IS NULL AND attempts = 0 AND ordering_key = 'key-11'"); n != 17 {
		t.Errorf("%d events of key-11 pending behind the dead letter, want 17", n)
	}
	dest.mu.Lock()
	defer dest.mu.Unlock()
	maxSize := 0
	for _, s := range dest.sizes {
		maxSize = max(maxSize, s)
	}
	if maxSize < 100 {
		t.Errorf("largest batch %d messages; batches %v", maxSize, dest.sizes)
	}
}

// TestForwarderLifecycle: Run twice fails, Close is idempotent and makes Run return, Run after
// Close fails, a bad subscribe pattern is reported by Run.
func TestForwarderLifecycle(t *testing.T) {
	e := fwdNewEnv(t)
	sub := e.subscriber(outbox.SubscriberConfig{})
	f, err := forwarder.New(sub, forwarder.Func(func(context.Context, *message.Message) error { return nil }), forwarder.Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- f.Run(context.Background()) }()
	<-f.Running()
	if err := f.Run(context.Background()); !errors.Is(err, forwarder.ErrAlreadyRunning) {
		t.Errorf("second Run: %v, want ErrAlreadyRunning", err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Errorf("Run returned %v after Close", err)
	}
	if err := f.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if err := f.Run(context.Background()); !errors.Is(err, forwarder.ErrClosed) {
		t.Errorf("Run after Close: %v, want ErrClosed", err)
	}

	// ctx cancellation stops a batch-path forwarder too.
	sub2 := e.subscriber(outbox.SubscriberConfig{})
	f2, err := forwarder.New(sub2, &fwdBatchDest{col: &fwdCollector{}}, forwarder.Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() { errc <- f2.Run(ctx) }()
	<-f2.Running()
	cancel()
	select {
	case err := <-errc:
		if err != nil {
			t.Errorf("Run returned %v after cancel", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after ctx cancel")
	}
	_ = f2.Close()

	sub3 := e.subscriber(outbox.SubscriberConfig{})
	f3, err := forwarder.New(sub3, &fwdBatchDest{col: &fwdCollector{}}, forwarder.Config{SubscribeTopic: "a_*"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	_ = sub3.Close()
	if err := f3.Run(context.Background()); !errors.Is(err, outbox.ErrClosed) {
		t.Errorf("Run on a closed subscriber: %v, want outbox.ErrClosed", err)
	}
}
