package integration_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/forwarder"
	"github.com/watermill-outbox/outbox/forwarder/redisstream"
	"github.com/watermill-outbox/outbox/internal/brokertest"
)

// redisStreamIDs returns the event ids on stream, in stream order.
func redisStreamIDs(t *testing.T, c *redis.Client, stream string) []string {
	t.Helper()
	entries, err := c.XRange(context.Background(), stream, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]string, len(entries))
	for i, en := range entries {
		ids[i], _ = en.Values["_watermill_message_uuid"].(string)
	}
	return ids
}

// TestRedisKeyOrderOnTheWire: one ordering key's events go to two streams and the second
// stream is not a stream (WRONGTYPE), so the key's second event fails at every attempt while
// its first is appended. Each retry claims the key's run again (the failed event and the two
// after it, in one batch): the append script stops at the failing XADD, so the key's later
// events never reach the first stream — read back with XRANGE — and stay pending without an
// attempt after the failed one is dead-lettered (ordinary failure: MaxAttempts). The other keys
// are appended once each, in order.
func TestRedisKeyOrderOnTheWire(t *testing.T) {
	addr := brokertest.RequireRedis(t)
	e := fwdNewEnv(t)
	good, bad := fwdName("fwd-redis-order"), fwdName("fwd-redis-string")
	client := fwdRedisClient(t, addr, good, bad)
	if err := client.Set(context.Background(), bad, "not a stream", 0).Err(); err != nil {
		t.Fatal(err)
	}
	others := e.seed(40, 8, func(int) string { return good })
	first := e.add(good, "key-x", nil)
	failing := e.add(bad, "key-x", nil)
	later := []*fwdEvent{e.add(good, "key-x", nil), e.add(good, "key-x", nil)}
	e.run(e.subscriber(outbox.SubscriberConfig{}), fwdRedisPublisher(t, redisstream.Config{Options: &redis.Options{Addr: addr}}), forwarder.Config{})

	e.waitSettled(30*time.Second, len(others)+1, 1)
	e.checkDeadLettered([]*fwdEvent{failing}, 3, nil)
	e.checkMarkedOnce(append(fwdIDs(others), first.id))
	e.checkUntouched(later)
	if le := e.lastError(failing.id); !strings.Contains(le, "WRONGTYPE") {
		t.Errorf("last_error %q, want the WRONGTYPE reply", le)
	}
	onBroker := redisStreamIDs(t, client, good)
	all := append(append(append([]*fwdEvent{}, others...), first, failing), later...)
	checkWireOrder(t, onBroker, []*fwdEvent{failing}, all)
	if len(onBroker) != len(others)+1 {
		t.Errorf("%d entries on the stream, want %d", len(onBroker), len(others)+1)
	}
}

// TestRedisPermanentDeadLettersAtFirstAttempt: an event above MaxEntryBytes is refused before
// sending as permanent: dead-lettered at its first attempt (no retries), its key's later
// events stay pending without an attempt and never reach the stream, every other event is
// appended once.
func TestRedisPermanentDeadLettersAtFirstAttempt(t *testing.T) {
	addr := brokertest.RequireRedis(t)
	e := fwdNewEnv(t)
	stream := fwdName("fwd-redis-permanent")
	client := fwdRedisClient(t, addr, stream)
	others := e.seed(40, 8, func(int) string { return stream })
	first := e.add(stream, "key-x", nil)
	big := e.add(stream, "key-x", map[string]any{"pad": strings.Repeat("x", 4000)})
	later := []*fwdEvent{e.add(stream, "key-x", nil), e.add(stream, "key-x", nil)}
	pub := fwdRedisPublisher(t, redisstream.Config{Options: &redis.Options{Addr: addr}, MaxEntryBytes: 2000})
	e.run(e.subscriber(outbox.SubscriberConfig{}), pub, forwarder.Config{})

	e.waitSettled(30*time.Second, len(others)+1, 1)
	e.checkDeadAtFirstAttempt([]*fwdEvent{big}, redisstream.ErrEntryTooLarge)
	e.checkMarkedOnce(append(fwdIDs(others), first.id))
	e.checkUntouched(later)
	all := append(append(append([]*fwdEvent{}, others...), first, big), later...)
	checkWireOrder(t, redisStreamIDs(t, client, stream), []*fwdEvent{big}, all)
}
