package redisstream

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/forwarder"
	"github.com/watermill-outbox/outbox/internal/brokertest"
)

// BenchmarkPublishBatch: PublishBatch of 1,000 messages (keys ordering keys, so 1,000/keys
// messages per key and one append script per key) against the comparator, the same entries
// as plain pipelined XADDs (what PublishBatch sent before the scripts), in the same run:
//
//	go test ./forwarder/redisstream -run '^$' -bench PublishBatch -benchtime 20x
func BenchmarkPublishBatch(b *testing.B) {
	addr := brokertest.RequireRedis(b)
	client := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer client.Close()
	for _, keys := range []int{1000, 100, 10} {
		stream := fmt.Sprintf("bench-rs-%d-%d", keys, time.Now().UnixNano())
		batch := make([]forwarder.Outgoing, 1000)
		for i := range batch {
			m := outbox.NewMessage([]byte(fmt.Sprintf(`{"i":%d,"pad":"0123456789012345678901234567890123456789"}`, i)))
			outbox.SetOrderingKey(m, fmt.Sprintf("key-%d", i%keys))
			m.Metadata.Set("trace-id", fmt.Sprintf("trace-%d", i))
			batch[i] = forwarder.Outgoing{Topic: stream, Message: m}
		}
		p, err := NewPublisher(Config{Client: client}, nil)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(fmt.Sprintf("keys=%d/scripts", keys), func(b *testing.B) {
			for range b.N {
				for i, err := range p.PublishBatch(context.Background(), batch) {
					if err != nil {
						b.Fatalf("message %d: %v", i, err)
					}
				}
			}
			b.ReportMetric(float64(b.N*len(batch))/b.Elapsed().Seconds(), "msgs/s")
		})
		b.Run(fmt.Sprintf("keys=%d/pipelined-xadd", keys), func(b *testing.B) {
			for range b.N {
				pipe := client.Pipeline()
				for i, o := range batch {
					en, err := p.entry(i, o)
					if err != nil {
						b.Fatal(err)
					}
					pipe.XAdd(context.Background(), en.args(0))
				}
				if _, err := pipe.Exec(context.Background()); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N*len(batch))/b.Elapsed().Seconds(), "msgs/s")
		})
		client.Del(context.Background(), stream)
	}
}
