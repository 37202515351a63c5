package kafkasarama

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/watermill-outbox/outbox/internal/brokertest"
)

// TestFailedLimitLookupIsNotRepeated: a cluster that refuses DescribeConfigs (no ACL for it:
// TOPIC_AUTHORIZATION_FAILED) is asked once per topic, not once per message: 3 batches of 200
// made 600 lookups, each holding the lock every PublishBatch waits on.
func TestFailedLimitLookupIsNotRepeated(t *testing.T) {
	const topic = "kafka-limit-acl"
	c := brokertest.Kafka(t, kfake.SeedTopics(1, topic))
	var lookups atomic.Int64
	c.ControlKey(int16(kmsg.DescribeConfigs), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		lookups.Add(1)
		r := req.(*kmsg.DescribeConfigsRequest)
		resp := r.ResponseKind().(*kmsg.DescribeConfigsResponse)
		for _, rr := range r.Resources {
			res := kmsg.NewDescribeConfigsResponseResource()
			res.ResourceType, res.ResourceName = rr.ResourceType, rr.ResourceName
			res.ErrorCode = kerr.TopicAuthorizationFailed.Code
			resp.Resources = append(resp.Resources, res)
		}
		return resp, nil, true
	})
	p, err := NewPublisher(Config{Brokers: c.ListenAddrs(), SaramaConfig: fastConfig()}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	keys := make([]string, 200)
	for range 3 {
		for i, err := range p.PublishBatch(context.Background(), messages(topic, keys...)) {
			if err != nil {
				t.Fatalf("message %d: %v", i, err)
			}
		}
	}
	if n := lookups.Load(); n != 1 {
		t.Fatalf("%d DescribeConfigs requests for 3 batches of %d messages of one topic, want 1", n, len(keys))
	}
}
