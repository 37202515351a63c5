package integration_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/forwarder"
	"github.com/watermill-outbox/outbox/internal/brokertest"
	"github.com/watermill-outbox/outbox/internal/pgtest"
)

// TestKafkaUnavailableKeepsOrder: kfake answers the first produce requests with
// NOT_ENOUGH_REPLICAS (every partition), so the relay's first batches fail after kgo's
// retries; the failures are unavailable: no attempt is counted and nothing is dead-lettered.
// Once the broker answers again every event is delivered; read back with the stock
// watermill-kafka subscriber, each key is in one partition, in order, once — no later event
// of a key reached the broker before an earlier one that failed.
func TestKafkaUnavailableKeepsOrder(t *testing.T) {
	e := fwdNewEnv(t)
	const topic = "fwd.kafka.unavailable"
	c := brokertest.Kafka(t, kfake.SeedTopics(2, topic))
	var refused atomic.Int32
	c.ControlKey(int16(kmsg.Produce), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		if refused.Add(1) > 15 {
			return nil, nil, false // dropped: the broker answers normally from now on
		}
		c.KeepControl()
		return brokertest.ProduceRefusal(kreq, kerr.NotEnoughReplicas.Code), nil, true
	})
	evs := e.seed(300, 30, func(int) string { return topic })
	e.run(e.subscriber(outbox.SubscriberConfig{}), fwdKafkaPublisher(t, c, fwdKafkaFastOpts()...), forwarder.Config{})
	e.waitSettled(60*time.Second, len(evs), 0)
	if n := refused.Load(); n < 15 {
		t.Fatalf("only %d produce requests refused", n)
	}
	e.checkMarkedOnce(fwdIDs(evs))
	if n := e.count("attempts > 0"); n != 0 {
		t.Errorf("%d events have attempts counted for the outage, want 0", n)
		e.mu.Lock()
		for _, f := range e.failed {
			t.Logf("event %s failed: %v", f.EventID, f.Err)
		}
		e.mu.Unlock()
	}

	var col fwdCollector
	fwdKafkaConsume(t, c, &col, topic)
	pgtest.Eventually(t, 30*time.Second, "all events consumed", func() bool { return col.len() >= len(evs) })
	e.checkOrderOnce(col.all(), evs)
}

// fwdKafkaFastOpts are kgo options with short retry backoffs and metadata refresh intervals,
// so that refused produce requests are retried (and fail) quickly.
func fwdKafkaFastOpts() []kgo.Opt {
	return []kgo.Opt{kgo.RetryBackoffFn(func(int) time.Duration { return 20 * time.Millisecond }), kgo.MetadataMinAge(20 * time.Millisecond)}
}
