package asynq_test

import (
	"errors"
	"net"
	"testing"

	"github.com/hibiken/asynq"

	"github.com/watermill-outbox/outbox"
	outboxasynq "github.com/watermill-outbox/outbox/forwarder/asynq"
	"github.com/watermill-outbox/outbox/internal/brokertest"
)

// TestRedisRefusingWritesIsUnavailable: a Redis that refuses every write — a replica (READONLY,
// as the old master after a failover) or one at maxmemory with noeviction (OOM) — refuses
// service as a whole: unavailable, no attempt counted, as forwarder/redisstream
// classifies the same replies. Each event burnt its attempts and was dead-lettered instead.
// Private redis-servers on free loopback ports.
func TestRedisRefusingWritesIsUnavailable(t *testing.T) {
	_, masterPort, _ := net.SplitHostPort(brokertest.ClosedPort(t)) // a master that never answers
	for name, args := range map[string][]string{
		"READONLY": {"--replicaof", "127.0.0.1", masterPort},
		"OOM":      {"--maxmemory", "1", "--maxmemory-policy", "noeviction"},
	} {
		t.Run(name, func(t *testing.T) {
			addr, start := brokertest.PrivateRedis(t, args...)
			start()
			pub, err := outboxasynq.NewPublisher(outboxasynq.Config{Redis: asynq.RedisClientOpt{Addr: addr}}, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer pub.Close()
			err = pub.Publish("task.x", outbox.NewMessage([]byte(`1`)))
			var ue *outbox.UnavailableError
			if !errors.As(err, &ue) || ue.Destination != outboxasynq.Destination {
				t.Fatalf("enqueue to a Redis refusing writes (%s): %v; want an *outbox.UnavailableError of %q", name, err, outboxasynq.Destination)
			}
		})
	}
}
