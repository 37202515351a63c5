package integration_test

import (
	"context"
	"errors"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmredis "github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/redis/go-redis/v9"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/forwarder"
	"github.com/watermill-outbox/outbox/forwarder/redisstream"
	"github.com/watermill-outbox/outbox/internal/brokertest"
	"github.com/watermill-outbox/outbox/internal/pgtest"
	"github.com/watermill-outbox/outbox/router"
)

// fwdRedisClient returns a client (no retries) that deletes streams at the end of the test.
func fwdRedisClient(t *testing.T, addr string, streams ...string) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	t.Cleanup(func() {
		if len(streams) > 0 {
			_ = c.Del(context.Background(), streams...).Err()
		}
		_ = c.Close()
	})
	return c
}

func fwdRedisPublisher(t *testing.T, cfg redisstream.Config) *redisstream.Publisher {
	t.Helper()
	pub, err := redisstream.NewPublisher(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	return pub
}

// TestForwarderRedis: 1,000 events over 50 keys appended to streams named after their topics,
// one pipeline per batch; the stock watermill-redisstream subscriber reads them with id,
// payload, headers and topic intact, in per-key order; each entry also has the topic and
// ordering-key fields; each event is marked once.
func TestForwarderRedis(t *testing.T) {
	addr := brokertest.RequireRedis(t)
	e := fwdNewEnv(t)
	streams := []string{fwdName("fwd-redis-a"), fwdName("fwd-redis-b")}
	client := fwdRedisClient(t, addr, streams...)
	evs := e.seed(1000, 50, func(k int) string { return streams[k%2] })
	e.run(e.subscriber(outbox.SubscriberConfig{}), fwdRedisPublisher(t, redisstream.Config{Options: &redis.Options{Addr: addr}}), forwarder.Config{})
	e.waitSettled(60*time.Second, 1000, 0)

	var col fwdCollector
	// The subscriber's Close closes its client: give it one of its own.
	sub, err := wmredis.NewSubscriber(wmredis.SubscriberConfig{Client: redis.NewClient(&redis.Options{Addr: addr}), FanOutOldestId: "0"}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() {
		cancel()
		_ = sub.Close()
	})
	for _, s := range streams {
		ch, err := sub.Subscribe(ctx, s)
		if err != nil {
			t.Fatal(err)
		}
		go col.consume(s, ch, nil)
	}
	pgtest.Eventually(t, 30*time.Second, "1000 messages consumed", func() bool { return col.len() >= 1000 })
	e.checkReceived(col.all(), evs, func(s string) string { return s })
	e.checkMarkedOnce(fwdIDs(evs))

	// The extra fields.
	entries, err := client.XRange(context.Background(), streams[0], "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, en := range entries {
		ev := e.byID[en.Values[wmredis.UUIDHeaderKey].(string)]
		if ev == nil || en.Values[redisstream.FieldTopic] != ev.topic || en.Values[redisstream.FieldOrderingKey] != ev.key {
			t.Fatalf("entry %v: topic/ordering_key fields do not match the event", en.Values)
		}
	}
}

// fwdCountingBatch counts the PublishBatch calls (and messages) a destination gets.
type fwdCountingBatch struct {
	forwarder.BatchPublisher
	calls, msgs atomic.Int64
}

func (c *fwdCountingBatch) PublishBatch(ctx context.Context, batch []forwarder.Outgoing) []error {
	c.calls.Add(1)
	c.msgs.Add(int64(len(batch)))
	return c.BatchPublisher.PublishBatch(ctx, batch)
}

// TestForwarderRedisUnreachable: a router sends one topic family to a Redis that is down (a
// closed loopback port: connection refused, an unavailable error named after its route) and the
// rest to the real one. The other route's keys are delivered in order, once, while the down
// route is tried again and again: its events are never marked published, never dead-lettered,
// and no attempt is counted for them (the destination is down, not the events).
func TestForwarderRedisUnreachable(t *testing.T) {
	addr := brokertest.RequireRedis(t)
	e := fwdNewEnv(t)
	okStream := fwdName("fwd-redis-ok")
	client := fwdRedisClient(t, addr, okStream)
	down := &fwdCountingBatch{BatchPublisher: fwdRedisPublisher(t, redisstream.Config{Options: &redis.Options{Addr: brokertest.ClosedPort(t), DialTimeout: time.Second}})}
	up := fwdRedisPublisher(t, redisstream.Config{Options: &redis.Options{Addr: addr}, Stream: okStream})
	rt, err := router.New(router.Config{Routes: []router.Route{
		{Topic: "fwd.down.*", Name: "redis-down", Publisher: down},
		{Topic: "fwd.ok.*", Publisher: up},
	}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	okEvs := e.seed(200, 20, func(k int) string { return []string{"fwd.ok.a", "fwd.ok.b"}[k%2] })
	downEvs := []*fwdEvent{e.add("fwd.down.x", "", nil), e.add("fwd.down.y", "", nil), e.add("fwd.down.x", "key-down", nil), e.add("fwd.down.x", "key-down", nil)}
	e.run(e.subscriber(outbox.SubscriberConfig{}), rt, forwarder.Config{})

	e.waitSettled(30*time.Second, len(okEvs), 0)
	pgtest.Eventually(t, 30*time.Second, "the down destination tried 3 times", func() bool { return down.calls.Load() >= 3 })
	e.checkMarkedOnce(fwdIDs(okEvs))
	e.checkUntouched(downEvs)
	if n := e.count("dead_lettered_at IS NOT NULL"); n != 0 {
		t.Errorf("%d events dead-lettered while their destination was down", n)
	}
	e.mu.Lock()
	for _, f := range e.failed {
		var ue *outbox.UnavailableError
		if !errors.As(f.Err, &ue) || ue.Destination != "redis-down" || !errors.Is(f.Err, syscall.ECONNREFUSED) {
			t.Errorf("event %s failed with %v, want unavailable of redis-down (connection refused)", f.EventID, f.Err)
		}
	}
	e.mu.Unlock()

	// One fixed stream: read it raw in order and unmarshal with the stock unmarshaller.
	entries, err := client.XRange(context.Background(), okStream, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	var got []fwdReceived
	for _, en := range entries {
		msg, err := wmredis.DefaultMarshallerUnmarshaller{}.Unmarshal(en.Values)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, fwdReceived{uuid: msg.UUID, topic: en.Values[redisstream.FieldTopic].(string), payload: msg.Payload, metadata: msg.Metadata, partition: -1})
	}
	e.checkReceived(got, okEvs, func(s string) string { return s })
}

// TestRedisStreamPublisher: MAXLEN trims approximately, and Close leaves a client passed in
// open; a publish after Close fails.
func TestRedisStreamPublisher(t *testing.T) {
	addr := brokertest.RequireRedis(t)
	stream := fwdName("fwd-redis-maxlen")
	client := fwdRedisClient(t, addr, stream)
	pub, err := redisstream.NewPublisher(redisstream.Config{Client: client, MaxLen: 10}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 50 {
		msgs := fwdMessages(20, i)
		if err := pub.Publish(stream, msgs...); err != nil {
			t.Fatal(err)
		}
	}
	n, err := client.XLen(context.Background(), stream).Result()
	if err != nil {
		t.Fatal(err)
	}
	// MAXLEN ~ 10 trims whole macro nodes (100 entries by default): far below 1000, at least 10.
	if n < 10 || n >= 1000 {
		t.Errorf("XLEN = %d after 1000 XADDs with MAXLEN ~ 10", n)
	}
	if err := pub.Close(); err != nil {
		t.Fatal(err)
	}
	if err := client.Ping(context.Background()).Err(); err != nil {
		t.Errorf("client closed by the publisher's Close: %v", err)
	}
	if err := pub.Publish(stream, fwdMessages(1, 0)...); !errors.Is(err, redisstream.ErrClosed) {
		t.Errorf("publish after Close: %v, want ErrClosed", err)
	}
}
