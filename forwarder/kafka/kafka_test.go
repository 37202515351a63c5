package kafka

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	wmkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/forwarder"
	"github.com/watermill-outbox/outbox/internal/brokertest"
)

func TestConfigValidate(t *testing.T) {
	cases := []struct {
		name  string
		cfg   Config
		field string
	}{
		{"defaults", Config{Brokers: []string{"127.0.0.1:9092"}}, ""},
		{"no brokers", Config{}, "kafka.Config.Brokers"},
		{"max bytes too small", Config{Brokers: []string{"b"}, MaxMessageBytes: 511}, "kafka.Config.MaxMessageBytes"},
		{"max bytes too large", Config{Brokers: []string{"b"}, MaxMessageBytes: 1<<30 + 1}, "kafka.Config.MaxMessageBytes"},
		{"max bytes set", Config{Brokers: []string{"b"}, MaxMessageBytes: 8192}, ""},
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
			if !errors.As(err, &ce) || ce.Field != c.field {
				t.Fatalf("Validate = %v, want ConfigError on %s", err, c.field)
			}
		})
	}
}

// TestClientOptionsChecked: NewPublisher refuses kgo options that break per-key order or
// acks = all, naming the option; kgo's defaults and harmless options pass.
func TestClientOptionsChecked(t *testing.T) {
	addr := brokertest.ClosedPort(t)
	for _, c := range []struct {
		name string
		opt  kgo.Opt
		bad  bool
	}{
		{"DisableIdempotentWrite", kgo.DisableIdempotentWrite(), true},
		{"RequiredAcks", kgo.RequiredAcks(kgo.LeaderAck()), true},
		{"TransactionalID", kgo.TransactionalID("x"), true},
		{"ManualFlushing", kgo.ManualFlushing(), true},
		{"RecordPartitioner", kgo.RecordPartitioner(kgo.RoundRobinPartitioner()), true},
		{"StickyKeyPartitioner", kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)), false},
		{"AllISRAcks", kgo.RequiredAcks(kgo.AllISRAcks()), false},
		{"RetryBackoffFn", kgo.RetryBackoffFn(func(int) time.Duration { return time.Millisecond }), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			p, err := NewPublisher(Config{Brokers: []string{addr}, ClientOptions: []kgo.Opt{c.opt}}, nil)
			if !c.bad {
				if err != nil {
					t.Fatal(err)
				}
				_ = p.Close()
				return
			}
			var ce *outbox.ConfigError
			// kgo itself refuses acks below all with idempotence; the others are ours.
			if !errors.As(err, &ce) || ce.Field != "kafka.Config.ClientOptions" || !errors.Is(err, outbox.ErrConfig) ||
				c.name != "RequiredAcks" && !strings.HasPrefix(ce.Reason, c.name+": ") {
				t.Fatalf("NewPublisher = %v, want a ConfigError on ClientOptions naming %s", err, c.name)
			}
		})
	}
}

// TestMarshaler: watermill-kafka's DefaultMarshaler reads what Marshal writes (UUID, payload,
// metadata), the ordering key is the record key, and the reserved UUID header is refused.
func TestMarshaler(t *testing.T) {
	m := message.NewMessage("id-1", []byte("p"))
	m.Metadata.Set("h", "v")
	r, err := Marshaler{}.Marshal("t", m)
	if err != nil || r.Key != nil || r.Topic != "t" {
		t.Fatalf("unordered: key %q topic %q, err %v", r.Key, r.Topic, err)
	}
	outbox.SetOrderingKey(m, "k")
	r, err = Marshaler{}.Marshal("t", m)
	if err != nil {
		t.Fatal(err)
	}
	if string(r.Key) != "k" || string(r.Value) != "p" || r.Headers[0].Key != wmkafka.UUIDHeaderKey || len(r.Headers) != 3 {
		t.Fatalf("record %+v", r)
	}
	cm := &sarama.ConsumerMessage{Topic: "t", Value: r.Value}
	for _, h := range r.Headers {
		cm.Headers = append(cm.Headers, &sarama.RecordHeader{Key: []byte(h.Key), Value: h.Value})
	}
	for name, back := range map[string]func() (*message.Message, error){
		"watermill-kafka": func() (*message.Message, error) { return wmkafka.DefaultMarshaler{}.Unmarshal(cm) },
		"Unmarshal":       func() (*message.Message, error) { return Marshaler{}.Unmarshal(r) },
	} {
		got, err := back()
		if err != nil || got.UUID != "id-1" || string(got.Payload) != "p" || len(got.Metadata) != 2 ||
			got.Metadata.Get("h") != "v" || got.Metadata.Get(outbox.MetadataOrderingKey) != "k" {
			t.Fatalf("%s round trip: %+v %v", name, got, err)
		}
	}
	m.Metadata.Set(wmkafka.UUIDHeaderKey, "x")
	if _, err := (Marshaler{}).Marshal("t", m); err == nil {
		t.Fatal("reserved header accepted")
	}
}

// TestBatchSize: the size the Publisher computes for a record alone in a batch is kgo's
// largest estimate (before kgo knows the produce version; with flexible versions kgo counts up
// to 3 bytes less): a record the Publisher puts at exactly the limit is accepted by kgo, one
// 4 bytes larger is refused by kgo itself.
func TestBatchSize(t *testing.T) {
	const topic, limit = "kafka-batch-size", 4096
	c := brokertest.Kafka(t, kfake.SeedTopics(1, topic))
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ProducerBatchMaxBytes(limit))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	rec := func(n int) *kgo.Record {
		return &kgo.Record{Topic: topic, Key: []byte("key"), Value: make([]byte, n),
			Headers: []kgo.RecordHeader{{Key: wmkafka.UUIDHeaderKey, Value: []byte("0123456789")}}}
	}
	n := 0
	for batchSize(rec(n)) < limit {
		n++
	}
	if got := batchSize(rec(n)); got != limit {
		t.Fatalf("no value size gives a batch of %d bytes (%d)", limit, got)
	}
	if err := cl.ProduceSync(context.Background(), rec(n)).FirstErr(); err != nil {
		t.Fatalf("record of exactly the limit: %v", err)
	}
	if err := cl.ProduceSync(context.Background(), rec(n+4)).FirstErr(); !errors.Is(err, kerr.MessageTooLarge) {
		t.Fatalf("record 4 bytes above the limit: %v, want MESSAGE_TOO_LARGE", err)
	}
}

// fastOpts are client options with short retry backoffs and metadata refresh intervals and a
// 1 s record delivery timeout, so failures surface quickly.
func fastOpts() []kgo.Opt {
	return []kgo.Opt{kgo.RetryBackoffFn(func(int) time.Duration { return 20 * time.Millisecond }),
		kgo.MetadataMinAge(20 * time.Millisecond), kgo.RecordDeliveryTimeout(time.Second)}
}

func messages(topic string, keys ...string) []forwarder.Outgoing {
	out := make([]forwarder.Outgoing, len(keys))
	for i, k := range keys {
		m := outbox.NewMessage([]byte(fmt.Sprintf(`{"i":%d}`, i)))
		if k != "" {
			outbox.SetOrderingKey(m, k)
		}
		out[i] = forwarder.Outgoing{Topic: topic, Message: m}
	}
	return out
}

func wantAll(t *testing.T, what string, errs []error, check func(error) bool) {
	t.Helper()
	for i, err := range errs {
		if !check(err) {
			t.Errorf("%s: message %d: %v", what, i, err)
		}
	}
}

// readBack consumes topic from the start until n records are read (failing after 30 s).
func readBack(t *testing.T, c *kfake.Cluster, topic string, n int) []*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out []*kgo.Record
	for len(out) < n {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("read %d of %d records of %s", len(out), n, topic)
		}
		fs.EachRecord(func(r *kgo.Record) { out = append(out, r) })
	}
	return out
}

// checkOrderOnce checks that records hold every message of batches exactly once, each
// ordering key in one partition and in batch order.
func checkOrderOnce(t *testing.T, records []*kgo.Record, batches ...[]forwarder.Outgoing) {
	t.Helper()
	want := map[string][]string{} // key → message UUIDs in order
	total := 0
	for _, b := range batches {
		for _, o := range b {
			k := o.Message.Metadata.Get(outbox.MetadataOrderingKey)
			want[k] = append(want[k], o.Message.UUID)
			total++
		}
	}
	got := map[string][]string{}
	part := map[string]int32{}
	for _, r := range records {
		m, err := Marshaler{}.Unmarshal(r)
		if err != nil {
			t.Fatal(err)
		}
		k := string(r.Key)
		if p, ok := part[k]; ok && p != r.Partition && k != "" {
			t.Errorf("key %q in partitions %d and %d", k, p, r.Partition)
		}
		part[k] = r.Partition
		got[k] = append(got[k], m.UUID)
	}
	if len(records) != total {
		t.Errorf("%d records, want %d", len(records), total)
	}
	for k, ids := range want {
		if k == "" {
			continue
		}
		if fmt.Sprint(got[k]) != fmt.Sprint(ids) {
			t.Errorf("key %q: got %d records %v, want %d in order %v", k, len(got[k]), got[k], len(ids), ids)
		}
	}
}

// keyedBatch returns n messages over keys ordering keys, key i%keys, named by round.
func keyedBatch(topic string, round, n, keys int) []forwarder.Outgoing {
	ks := make([]string, n)
	for i := range ks {
		ks[i] = "key-" + strconv.Itoa(i%keys)
	}
	b := messages(topic, ks...)
	for i, o := range b {
		o.Message.Metadata.Set("round", strconv.Itoa(round))
		o.Message.Metadata.Set("i", strconv.Itoa(i))
	}
	return b
}

// BenchmarkMarshal: one record of a relayed event (five outbox metadata values and a header).
func BenchmarkMarshal(b *testing.B) {
	m := message.NewMessage("0190a5e6-0000-7000-8000-000000000000", []byte(`{"n":1,"text":"some event payload of a typical size"}`))
	m.Metadata.Set("trace-id", "bench")
	m.Metadata.Set(outbox.MetadataEventID, m.UUID)
	m.Metadata.Set(outbox.MetadataTopic, "orders")
	m.Metadata.Set(outbox.MetadataOrderingKey, "key-17")
	m.Metadata.Set(outbox.MetadataSequence, "123456")
	m.Metadata.Set(outbox.MetadataAttempt, "1")
	b.ReportAllocs()
	for range b.N {
		if _, err := (Marshaler{}).Marshal("orders", m); err != nil {
			b.Fatal(err)
		}
	}
}
