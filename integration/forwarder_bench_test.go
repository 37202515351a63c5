package integration_test

// Drain benchmarks of the forwarder (loopback only, behind -bench):
//
//	go test ./integration -run '^$' -bench 'Forwarder' -benchtime 1x -timeout 30m
//
// BenchmarkForwarderKafka (ours against Watermill's components/forwarder, both to kfake),
// BenchmarkForwarderRabbitMQ, BenchmarkForwarderRedis (outbox → broker), and
// BenchmarkForwarderDestinations (the destinations alone, no database). OUTBOX_BENCH_EVENTS
// sets the backlog (default 100000), OUTBOX_BENCH_KEYS the ordering keys (default 1000),
// OUTBOX_BENCH_BATCH and OUTBOX_BENCH_RUN the subscriber's BatchSize (1000) and MaxRunPerKey
// (100). Each sub-benchmark seeds a fresh backlog outside the timer, drains it once per b.N
// (use -benchtime 1x) and reports events/s, plus claim-s, mark-s and send-s: the seconds spent
// in the outbox's claim and mark statements and in the destination's PublishBatch calls, and
// idle-s, the seconds the destination waited for the relay (see fwdBenchDrain).

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	wmkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	wmsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	wmforwarder "github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/forwarder"
	"github.com/watermill-outbox/outbox/forwarder/amqp"
	"github.com/watermill-outbox/outbox/forwarder/kafka"
	"github.com/watermill-outbox/outbox/forwarder/kafkasarama"
	"github.com/watermill-outbox/outbox/forwarder/redisstream"
	"github.com/watermill-outbox/outbox/internal/brokertest"
	"github.com/watermill-outbox/outbox/internal/pgtest"
)

func fwdBenchEnv(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// fwdBenchSeed creates a fresh outbox table holding n pending events on topic over keys
// ordering keys, written straight with SQL (the write path is measured elsewhere).
func fwdBenchSeed(b *testing.B, topic string, n, keys int) outbox.SchemaConfig {
	b.Helper()
	return fwdBenchSeedHeaders(b, topic, n, keys, `'{"trace-id":"bench"}'`)
}

// fwdBenchSeedHeaders is fwdBenchSeed with each event's headers given by a SQL expression
// of the event's number g (1…n).
func fwdBenchSeedHeaders(b *testing.B, topic string, n, keys int, headers string) outbox.SchemaConfig {
	b.Helper()
	pool := pgtest.Require(b)
	schema := outbox.SchemaConfig{Table: pgtest.Table(b)}
	ctx := context.Background()
	if err := outbox.Migrate(ctx, pool, schema); err != nil {
		b.Fatal(err)
	}
	q := fmt.Sprintf(`INSERT INTO %q (id, topic, payload, headers, ordering_key)
SELECT gen_random_uuid(), $1, json_build_object('n', g, 'text', 'some event payload of a typical size'), %s, 'key-' || (g %% $2)
FROM generate_series(1, $3) g`, schema.Table, headers)
	if _, err := pool.Exec(ctx, q, topic, keys, n); err != nil {
		b.Fatal(err)
	}
	if _, err := pool.Exec(ctx, fmt.Sprintf(`VACUUM ANALYZE %q`, schema.Table)); err != nil {
		b.Fatal(err)
	}
	return schema
}

// fwdBenchDrain runs our forwarder from a fresh backlog to pub until every event is marked
// published, and reports events/s plus where the time went: claim-s and mark-s (the outbox
// subscriber's claim and mark statements, from its hooks), claims (that leased events),
// empty-claims (that leased none) and events/claim, and, for a
// BatchPublisher, send-s (the destination's PublishBatch calls), batches, keys/batch (distinct
// ordering keys per call) and idle-s: the
// drain's wall time minus send-s, the time the destination waited for the relay (one
// subscription: PublishBatch calls do not overlap). It returns the events/s.
func fwdBenchDrain(b *testing.B, schema outbox.SchemaConfig, n int, pub message.Publisher, subscriptions int) float64 {
	b.Helper()
	var delivered, failed, claims, empty, claimed, claimNs, markNs atomic.Int64
	done := make(chan struct{})
	pool, err := pgxpool.New(context.Background(), pgtest.DSN())
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	sub, err := outbox.NewSubscriber(pool, outbox.SubscriberConfig{
		Schema: schema, BatchSize: fwdBenchEnv("OUTBOX_BENCH_BATCH", 1000), MaxRunPerKey: fwdBenchEnv("OUTBOX_BENCH_RUN", 100),
		PollInterval: 10 * time.Millisecond,
		Hooks: outbox.Hooks{
			OnDelivered: func(outbox.DeliveredInfo) {
				if delivered.Add(1) == int64(n) {
					close(done)
				}
			},
			OnFailed: func(outbox.FailedInfo) { failed.Add(1) },
			OnClaim: func(c outbox.ClaimInfo) {
				claimNs.Add(int64(c.Duration))
				if c.Events > 0 {
					claims.Add(1)
					claimed.Add(int64(c.Events))
				} else {
					empty.Add(1)
				}
			},
			OnMark: func(m outbox.MarkInfo) { markNs.Add(int64(m.Duration)) },
		},
	}, nil)
	if err != nil {
		b.Fatal(err)
	}
	var tp *fwdTimedPublisher
	if bp, ok := pub.(forwarder.BatchPublisher); ok {
		tp = &fwdTimedPublisher{BatchPublisher: bp}
		pub = tp
	}
	f, err := forwarder.New(sub, pub, forwarder.Config{Subscriptions: subscriptions}, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.StartTimer()
	start := time.Now()
	go func() { _ = f.Run(context.Background()) }()
	select {
	case <-done:
	case <-time.After(10 * time.Minute):
		b.Fatalf("drain not finished after 10 minutes: %d of %d", delivered.Load(), n)
	}
	took := time.Since(start)
	rate := float64(n) / took.Seconds()
	b.StopTimer()
	_ = f.Close()
	if failed.Load() != 0 {
		b.Fatalf("%d failed deliveries", failed.Load())
	}
	b.ReportMetric(rate, "events/s")
	b.ReportMetric(time.Duration(claimNs.Load()).Seconds(), "claim-s")
	b.ReportMetric(time.Duration(markNs.Load()).Seconds(), "mark-s")
	b.ReportMetric(float64(claims.Load()), "claims")
	b.ReportMetric(float64(empty.Load()), "empty-claims")
	if c := claims.Load(); c > 0 {
		b.ReportMetric(float64(claimed.Load())/float64(c), "events/claim")
	}
	if tp != nil {
		send := time.Duration(tp.ns.Load())
		b.ReportMetric(send.Seconds(), "send-s")
		b.ReportMetric(float64(tp.calls.Load()), "batches")
		if c := tp.calls.Load(); c > 0 {
			b.ReportMetric(float64(tp.keys.Load())/float64(c), "keys/batch")
		}
		if subscriptions == 1 {
			b.ReportMetric((took - send).Seconds(), "idle-s")
		}
	}
	return rate
}

// fwdTimedPublisher sums the time spent in PublishBatch, counts the calls and sums the
// distinct ordering keys of each call's batch.
type fwdTimedPublisher struct {
	forwarder.BatchPublisher
	ns, calls, keys atomic.Int64
}

func (t *fwdTimedPublisher) PublishBatch(ctx context.Context, batch []forwarder.Outgoing) []error {
	keys := map[string]bool{}
	for _, o := range batch {
		keys[o.Message.Metadata.Get(outbox.MetadataOrderingKey)] = true
	}
	t.keys.Add(int64(len(keys)))
	start := time.Now()
	defer func() { t.ns.Add(int64(time.Since(start))); t.calls.Add(1) }()
	return t.BatchPublisher.PublishBatch(ctx, batch)
}

// fwdBenchKafkaCheck reads topic from kfake and checks n distinct events, each key in one
// partition, in sequence order there.
func fwdBenchKafkaCheck(b *testing.B, c *kfake.Cluster, topic string, n int, keyHeader string) {
	b.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond))
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	seen := map[string]bool{}
	part := map[string]int32{}
	last := map[string]int64{}
	reordered := 0
	deadline := time.Now().Add(2 * time.Minute)
	for len(seen) < n && time.Now().Before(deadline) {
		fs := cl.PollFetches(context.Background())
		fs.EachRecord(func(r *kgo.Record) {
			var id, key string
			var seq int64
			for _, h := range r.Headers {
				switch h.Key {
				case wmkafka.UUIDHeaderKey:
					id = string(h.Value)
				case keyHeader:
					key = string(h.Value)
				case outbox.MetadataSequence:
					seq, _ = strconv.ParseInt(string(h.Value), 10, 64)
				}
			}
			seen[id] = true
			if p, ok := part[key]; ok && p != r.Partition {
				b.Errorf("key %s in partitions %d and %d", key, p, r.Partition)
			}
			part[key] = r.Partition
			if seq > 0 {
				if seq <= last[key] {
					reordered++
				}
				last[key] = seq
			}
		})
	}
	if len(seen) != n || reordered != 0 {
		b.Fatalf("kafka holds %d distinct events of %d, %d reordered", len(seen), n, reordered)
	}
}

// BenchmarkForwarderKafka drains a backlog to kfake (8 partitions): our forwarder (batch per
// call, acks=all, idempotent) through the kgo publisher and through the Sarama one
// (forwarder/kafkasarama, per-key rounds), against Watermill's own components/forwarder
// (watermill-sql v4 subscriber, batch 1000 and 10 ms poll, enveloped messages; watermill-kafka
// publisher with the ordering key as partition key, one message per request). All keep
// per-key order; ours is checked on Kafka afterwards.
func BenchmarkForwarderKafka(b *testing.B) {
	n := fwdBenchEnv("OUTBOX_BENCH_EVENTS", 100000)
	keys := fwdBenchEnv("OUTBOX_BENCH_KEYS", 1000)
	for _, v := range []struct {
		subs   int
		sarama bool // forwarder/kafkasarama instead of forwarder/kafka
	}{{1, false}, {2, false}, {1, true}} {
		name := fmt.Sprintf("outbox/subscriptions=%d", v.subs)
		if v.sarama {
			name += "/sarama"
		}
		subs := v.subs
		b.Run(name, func(b *testing.B) {
			for range b.N {
				b.StopTimer()
				c := brokertest.Kafka(b, kfake.SeedTopics(8, "bench"))
				schema := fwdBenchSeed(b, "bench", n, keys)
				pub := fwdBenchKafkaPublisher(b, c, v.sarama)
				fwdBenchDrain(b, schema, n, pub, subs)
				fwdBenchKafkaCheck(b, c, "bench", n, outbox.MetadataOrderingKey)
				_ = pub.Close()
			}
		})
	}
	for _, wm := range []struct {
		name    string
		schema  wmsql.DefaultPostgreSQLSchema
		subConf wmsql.SubscriberConfig
	}{
		// watermill-sql's defaults: batch 100 (SubscribeBatchSize 0), 1 s poll.
		{"watermill-components-forwarder/default", wmsql.DefaultPostgreSQLSchema{}, wmsql.SubscriberConfig{}},
		// Tuned like the outbox side: batch 1000, 10 ms poll.
		{"watermill-components-forwarder/tuned", wmsql.DefaultPostgreSQLSchema{SubscribeBatchSize: 1000}, wmsql.SubscriberConfig{PollInterval: 10 * time.Millisecond}},
	} {
		b.Run(wm.name, func(b *testing.B) { fwdBenchWatermill(b, n, keys, wm.schema, wm.subConf) })
	}
}

// fwdBenchKafkaPublisher returns our Kafka publisher on c: forwarder/kafka, or with sarama
// forwarder/kafkasarama with its defaults.
func fwdBenchKafkaPublisher(b *testing.B, c *kfake.Cluster, sarama bool) forwarder.BatchPublisher {
	var pub forwarder.BatchPublisher
	var err error
	if sarama {
		pub, err = kafkasarama.NewPublisher(kafkasarama.Config{Brokers: c.ListenAddrs()}, nil)
	} else {
		pub, err = kafka.NewPublisher(kafka.Config{Brokers: c.ListenAddrs()}, nil)
	}
	if err != nil {
		b.Fatal(err)
	}
	return pub
}

// fwdBenchWatermill drains n enveloped messages through Watermill's components/forwarder from
// a watermill-sql v4 table to kfake.
func fwdBenchWatermill(b *testing.B, n, keys int, schemaAdapter wmsql.DefaultPostgreSQLSchema, subConf wmsql.SubscriberConfig) {
	for range b.N {
		fwdBenchWatermillOnce(b, n, keys, schemaAdapter, subConf)
	}
}

// fwdBenchWatermillOnce is one drain of fwdBenchWatermill; it returns the events/s.
func fwdBenchWatermillOnce(b *testing.B, n, keys int, schemaAdapter wmsql.DefaultPostgreSQLSchema, subConf wmsql.SubscriberConfig) float64 {
	{
		b.StopTimer()
		pool := pgtest.Require(b)
		c := brokertest.Kafka(b, kfake.SeedTopics(8, "bench"))
		fwdTopic := fmt.Sprintf("wmfwd_%d_%d", os.Getpid(), time.Now().UnixNano())
		b.Cleanup(func() {
			_, _ = pool.Exec(context.Background(), fmt.Sprintf(`DROP TABLE IF EXISTS "watermill_%s"; DROP TABLE IF EXISTS "watermill_offsets_%s"`, fwdTopic, fwdTopic))
		})
		sqlPub, err := wmsql.NewPublisher(wmsql.BeginnerFromPgx(pool), wmsql.PublisherConfig{SchemaAdapter: schemaAdapter, AutoInitializeSchema: true}, nil)
		if err != nil {
			b.Fatal(err)
		}
		envPub := wmforwarder.NewPublisher(sqlPub, wmforwarder.PublisherConfig{ForwarderTopic: fwdTopic})
		for start := 0; start < n; start += 1000 {
			msgs := make([]*message.Message, 0, 1000)
			for i := start; i < min(n, start+1000); i++ {
				m := message.NewMessage(watermill.NewUUID(), []byte(fmt.Sprintf(`{"n":%d,"text":"some event payload of a typical size"}`, i)))
				m.Metadata.Set("trace-id", "bench")
				m.Metadata.Set(outbox.MetadataOrderingKey, fmt.Sprintf("key-%d", i%keys))
				msgs = append(msgs, m)
			}
			if err := envPub.Publish("bench", msgs...); err != nil {
				b.Fatal(err)
			}
		}
		subConf.SchemaAdapter, subConf.OffsetsAdapter, subConf.InitializeSchema = schemaAdapter, wmsql.DefaultPostgreSQLOffsetsAdapter{}, true
		sqlSub, err := wmsql.NewSubscriber(wmsql.BeginnerFromPgx(pool), subConf, nil)
		if err != nil {
			b.Fatal(err)
		}
		kpub, err := wmkafka.NewPublisher(wmkafka.PublisherConfig{
			Brokers: c.ListenAddrs(),
			Marshaler: wmkafka.NewWithPartitioningMarshaler(func(_ string, m *message.Message) (string, error) {
				return m.Metadata.Get(outbox.MetadataOrderingKey), nil
			}),
		}, nil)
		if err != nil {
			b.Fatal(err)
		}
		fwd, err := wmforwarder.NewForwarder(sqlSub, kpub, nil, wmforwarder.Config{ForwarderTopic: fwdTopic})
		if err != nil {
			b.Fatal(err)
		}
		client, err := sarama.NewClient(c.ListenAddrs(), sarama.NewConfig())
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		start := time.Now()
		go func() { _ = fwd.Run(context.Background()) }()
		for {
			total := int64(0)
			for p := range int32(8) {
				off, err := client.GetOffset("bench", p, sarama.OffsetNewest)
				if err != nil {
					b.Fatal(err)
				}
				total += off
			}
			if total >= int64(n) {
				break
			}
			if time.Since(start) > 10*time.Minute {
				b.Fatalf("drain not finished after 10 minutes: %d of %d", total, n)
			}
			time.Sleep(20 * time.Millisecond)
		}
		rate := float64(n) / time.Since(start).Seconds()
		b.ReportMetric(rate, "events/s")
		b.StopTimer()
		_ = fwd.Close()
		_ = kpub.Close()
		_ = client.Close()
		fwdBenchKafkaCheck(b, c, "bench", n, outbox.MetadataOrderingKey)
		return rate
	}
}

// fwdBenchBatches returns n outgoing messages of topic over keys ordering keys, in batches of
// 1,000: what a relay would hand a destination, for the destination-alone benchmarks.
func fwdBenchBatches(topic string, n, keys int) [][]forwarder.Outgoing {
	var out [][]forwarder.Outgoing
	for start := 0; start < n; start += 1000 {
		var batch []forwarder.Outgoing
		for i := start; i < min(n, start+1000); i++ {
			batch = append(batch, fwdBenchOutgoing(topic, i, keys))
		}
		out = append(out, batch)
	}
	return out
}

// BenchmarkForwarderRabbitMQ drains a backlog through our forwarder to a durable queue on the
// default exchange, persistent messages with publisher confirms and mandatory routing.
func BenchmarkForwarderRabbitMQ(b *testing.B) {
	url := brokertest.RequireRabbitMQ(b)
	n := fwdBenchEnv("OUTBOX_BENCH_EVENTS", 100000)
	keys := fwdBenchEnv("OUTBOX_BENCH_KEYS", 1000)
	for _, subs := range []int{1, 2} {
		b.Run(fmt.Sprintf("outbox/subscriptions=%d", subs), func(b *testing.B) {
			for range b.N {
				b.StopTimer()
				queue, pub, held := fwdAMQPQueue(b, url, "bench")
				fwdBenchDrain(b, fwdBenchSeed(b, queue, n, keys), n, pub, subs)
				if got := held(); got != n {
					b.Errorf("queue holds %d messages, want %d", got, n)
				}
			}
		})
	}
}

// BenchmarkForwarderRedis drains a backlog through our forwarder to one Redis stream, one
// pipeline per batch.
func BenchmarkForwarderRedis(b *testing.B) {
	addr := brokertest.RequireRedis(b)
	n := fwdBenchEnv("OUTBOX_BENCH_EVENTS", 100000)
	keys := fwdBenchEnv("OUTBOX_BENCH_KEYS", 1000)
	for _, subs := range []int{1, 2} {
		b.Run(fmt.Sprintf("outbox/subscriptions=%d", subs), func(b *testing.B) {
			for range b.N {
				b.StopTimer()
				stream := fwdName("bench")
				client := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
				schema := fwdBenchSeed(b, stream, n, keys)
				pub, err := redisstream.NewPublisher(redisstream.Config{Client: client}, nil)
				if err != nil {
					b.Fatal(err)
				}
				fwdBenchDrain(b, schema, n, pub, subs)
				if l, err := client.XLen(context.Background(), stream).Result(); err != nil || l != int64(n) {
					b.Errorf("stream holds %d entries, want %d (%v)", l, n, err)
				}
				_ = client.Del(context.Background(), stream).Err()
				_ = client.Close()
			}
		})
	}
}

// BenchmarkForwarderDestinations measures the destinations alone: n messages (the outbox
// metadata of a real relay, 1,000 keys) in PublishBatch calls of 1,000, no database — the
// capacity each destination offers the relay.
func BenchmarkForwarderDestinations(b *testing.B) {
	n := fwdBenchEnv("OUTBOX_BENCH_EVENTS", 100000)
	keys := fwdBenchEnv("OUTBOX_BENCH_KEYS", 1000)
	run := func(b *testing.B, pub forwarder.BatchPublisher, topic string) {
		for range b.N {
			b.StopTimer()
			bs := fwdBenchBatches(topic, n, keys)
			b.StartTimer()
			b.ReportMetric(fwdBenchSend(b, pub, bs), "msgs/s")
		}
	}
	b.Run("kafka", func(b *testing.B) {
		c := brokertest.Kafka(b, kfake.SeedTopics(8, "bench"))
		pub, err := kafka.NewPublisher(kafka.Config{Brokers: c.ListenAddrs()}, nil)
		if err != nil {
			b.Fatal(err)
		}
		defer pub.Close()
		run(b, pub, "bench")
	})
	b.Run("rabbitmq", func(b *testing.B) {
		url := brokertest.RequireRabbitMQ(b)
		queue := fwdName("bench")
		conn, err := amqp091.Dial(url)
		if err != nil {
			b.Fatal(err)
		}
		defer conn.Close()
		ch, err := conn.Channel()
		if err != nil {
			b.Fatal(err)
		}
		if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
			b.Fatal(err)
		}
		defer func() { _, _ = ch.QueueDelete(queue, false, false, false) }()
		pub, err := amqp.NewPublisher(amqp.Config{URL: url}, nil)
		if err != nil {
			b.Fatal(err)
		}
		defer pub.Close()
		run(b, pub, queue)
	})
	b.Run("redis", func(b *testing.B) {
		addr := brokertest.RequireRedis(b)
		stream := fwdName("bench")
		client := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
		defer client.Close()
		defer client.Del(context.Background(), stream)
		pub, err := redisstream.NewPublisher(redisstream.Config{Client: client}, nil)
		if err != nil {
			b.Fatal(err)
		}
		run(b, pub, stream)
	})
}

// fwdBenchOutgoing is the i-th message of a backlog over keys ordering keys as the relay sends
// it to topic (the outbox metadata of a real relay).
func fwdBenchOutgoing(topic string, i, keys int) forwarder.Outgoing {
	m := outbox.NewMessage([]byte(fmt.Sprintf(`{"n":%d,"text":"some event payload of a typical size"}`, i)))
	m.Metadata.Set("trace-id", "bench")
	m.Metadata.Set(outbox.MetadataEventID, m.UUID)
	m.Metadata.Set(outbox.MetadataTopic, topic)
	m.Metadata.Set(outbox.MetadataOrderingKey, fmt.Sprintf("key-%d", i%keys))
	m.Metadata.Set(outbox.MetadataSequence, strconv.Itoa(i+1))
	m.Metadata.Set(outbox.MetadataAttempt, "1")
	return forwarder.Outgoing{Topic: topic, Message: m}
}

// fwdBenchSend sends the batches to pub, one PublishBatch call each, and returns msgs/s.
func fwdBenchSend(b *testing.B, pub forwarder.BatchPublisher, batches [][]forwarder.Outgoing) float64 {
	n := 0
	start := time.Now()
	for _, batch := range batches {
		for _, err := range pub.PublishBatch(context.Background(), batch) {
			if err != nil {
				b.Fatal(err)
			}
		}
		n += len(batch)
	}
	return float64(n) / time.Since(start).Seconds()
}
