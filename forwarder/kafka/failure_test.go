package kafka

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"strconv"
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
)

func TestClassify(t *testing.T) {
	p := &Publisher{name: "kafka test"}
	up := func() bool { return false }
	down := func() bool { return true }
	live := context.Background()
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	cases := []struct {
		name  string
		err   error
		ctx   context.Context
		down  func() bool
		class error // nil: ordinary
	}{
		{"too large, refused before sending", fmt.Errorf("%w (2000 > 1000 bytes)", ErrMessageTooLarge), live, up, outbox.ErrPermanent},
		{"too large, from the broker", fmt.Errorf("%w (uncompressed_bytes=9000)", kerr.MessageTooLarge), live, up, outbox.ErrPermanent},
		{"not enough replicas", kerr.NotEnoughReplicas, live, up, outbox.ErrUnavailable},
		{"leader not available", kerr.LeaderNotAvailable, live, up, outbox.ErrUnavailable},
		{"not leader", kerr.NotLeaderForPartition, live, up, outbox.ErrUnavailable},
		{"request timed out", kerr.RequestTimedOut, live, up, outbox.ErrUnavailable},
		{"record retries", kgo.ErrRecordRetries, live, up, outbox.ErrUnavailable},
		{"record timeout", fmt.Errorf("%w, last err: %w", kgo.ErrRecordTimeout, kerr.NotEnoughReplicas), live, up, outbox.ErrUnavailable},
		{"out of order sequence", kerr.OutOfOrderSequenceNumber, live, down, outbox.ErrNotAttempted},
		{"unknown producer id", kerr.UnknownProducerID, live, up, outbox.ErrNotAttempted},
		{"producer fenced", kerr.ProducerFenced, live, up, outbox.ErrNotAttempted},
		{"dial refused", &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connect: connection refused")}, live, up, outbox.ErrUnavailable},
		{"eof, cluster answers", fmt.Errorf("read: %w", net.ErrClosed), live, up, outbox.ErrNotAttempted},
		{"eof, cluster down", fmt.Errorf("read: %w", net.ErrClosed), live, down, outbox.ErrUnavailable},
		{"no answer, cluster answers", errNoAnswer, live, up, outbox.ErrNotAttempted},
		{"no answer, cluster down", errNoAnswer, live, down, outbox.ErrUnavailable},
		{"another call's context", context.Canceled, live, down, outbox.ErrNotAttempted},
		{"this call's context", context.Canceled, ended, down, nil},
		{"client closed", kgo.ErrClientClosed, live, down, ErrClosed},
		{"unknown topic", kerr.UnknownTopicOrPartition, live, down, nil},
		{"authorization", kerr.TopicAuthorizationFailed, live, up, nil},
		{"held back", forwarder.ErrHeldBack, live, down, nil},
	}
	for _, c := range cases {
		err := p.classify(c.ctx, c.err, c.down)
		switch {
		case c.class == nil:
			if err != c.err {
				t.Errorf("%s: %v classified as %v, want unchanged", c.name, c.err, err)
			}
		case !errors.Is(err, c.class) || !errors.Is(err, c.err):
			t.Errorf("%s: %v classified as %v, want %v wrapping it", c.name, c.err, err, c.class)
		case c.class == outbox.ErrUnavailable:
			var ue *outbox.UnavailableError
			if !errors.As(err, &ue) || ue.Destination != "kafka test" {
				t.Errorf("%s: %v, want the destination named", c.name, err)
			}
		}
	}
}

// TestUnavailableRealClient: against kfake, produce requests answered with NOT_ENOUGH_REPLICAS
// fail their messages as unavailable after kgo's retries, and a key's second message (failed
// by kgo behind the first) is held back; the same batch goes through once the broker answers
// again, and after the cluster is closed every message fails as unavailable.
func TestUnavailableRealClient(t *testing.T) {
	const topic = "kafka-unavailable"
	c := brokertest.Kafka(t, kfake.NumBrokers(1), kfake.SeedTopics(2, topic))
	p, err := NewPublisher(Config{Brokers: c.ListenAddrs(), ClientOptions: fastOpts()}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var failing atomic.Bool
	failing.Store(true)
	c.ControlKey(int16(kmsg.Produce), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if !failing.Load() {
			return nil, nil, false
		}
		return brokertest.ProduceRefusal(kreq, kerr.NotEnoughReplicas.Code), nil, true
	})
	batch := messages(topic, "a", "b", "", "a")
	errs := p.PublishBatch(context.Background(), batch)
	if errs[3] != forwarder.ErrHeldBack {
		t.Errorf("second message of key a: %v, want ErrHeldBack", errs[3])
	}
	wantAll(t, "not enough replicas", errs[:3], func(err error) bool {
		var ue *outbox.UnavailableError
		return errors.Is(err, kerr.NotEnoughReplicas) && errors.As(err, &ue) && ue.Destination == "kafka "+c.ListenAddrs()[0]
	})
	failing.Store(false)
	wantAll(t, "after recovery", p.PublishBatch(context.Background(), batch), func(err error) bool { return err == nil })

	c.Close()
	wantAll(t, "cluster closed", p.PublishBatch(context.Background(), messages(topic, "a", "")), func(err error) bool {
		return errors.Is(err, outbox.ErrUnavailable)
	})
}

// TestPermanentRealBroker: with the topic limit lookup off, kfake refuses the record batch that
// holds an oversized message (MESSAGE_TOO_LARGE) and kgo fails the partition's records with
// it; sent again one by one, only the oversized message fails, as permanent, its key's later
// message is held back, and the others are written, each key in order. Refused before sending
// (lookup on), the result is the same without the broker's refusal.
func TestPermanentRealBroker(t *testing.T) {
	for _, lookup := range []bool{false, true} {
		t.Run(fmt.Sprintf("lookup=%v", lookup), func(t *testing.T) {
			const topic = "kafka-permanent"
			c := brokertest.Kafka(t, kfake.SeedTopics(1, topic))
			setTopicConfig(t, c, topic, "max.message.bytes", "4096")
			p, err := NewPublisher(Config{Brokers: c.ListenAddrs(), ClientOptions: fastOpts(), DisableTopicLimits: !lookup}, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			batch := messages(topic, "a", "k", "k", "k", "b", "")
			pad := make([]byte, 6000) // random: the broker's check is not fooled by compression
			_, _ = rand.Read(pad)
			big := outbox.NewMessage([]byte(`{"pad":"` + base64.StdEncoding.EncodeToString(pad) + `"}`))
			big.Metadata = batch[2].Message.Metadata
			batch[2].Message = big
			errs := p.PublishBatch(context.Background(), batch)
			for i, err := range errs {
				switch i {
				case 2:
					if !errors.Is(err, outbox.ErrPermanent) || !errors.Is(err, kerr.MessageTooLarge) {
						t.Errorf("oversized message: %v, want permanent MESSAGE_TOO_LARGE", err)
					}
					if lookup != errors.Is(err, ErrMessageTooLarge) {
						t.Errorf("oversized message: %v, refused before sending: %v", err, lookup)
					}
				case 3:
					if err != forwarder.ErrHeldBack {
						t.Errorf("message after it: %v, want ErrHeldBack", err)
					}
				default:
					if err != nil {
						t.Errorf("message %d: %v", i, err)
					}
				}
			}
			sent := []forwarder.Outgoing{batch[0], batch[1], batch[4], batch[5]}
			checkOrderOnce(t, readBack(t, c, topic, len(sent)), sent)
		})
	}
}

// setTopicConfig sets a topic config with an AlterConfigs request.
func setTopicConfig(t *testing.T, c *kfake.Cluster, topic, name, value string) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	req := kmsg.NewPtrAlterConfigsRequest()
	rr := kmsg.NewAlterConfigsRequestResource()
	rr.ResourceType, rr.ResourceName = kmsg.ConfigResourceTypeTopic, topic
	cfg := kmsg.NewAlterConfigsRequestResourceConfig()
	cfg.Name, cfg.Value = name, &value
	rr.Configs = append(rr.Configs, cfg)
	req.Resources = append(req.Resources, rr)
	resp, err := req.RequestWith(context.Background(), cl)
	if err == nil && len(resp.Resources) == 1 {
		err = kerr.ErrorForCode(resp.Resources[0].ErrorCode)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// TestBrokerDownAtStart: a Publisher built while no broker listens is no error; each message
// fails as unavailable (naming the brokers) until a broker is up on that address, and then
// goes through; Close of a Publisher that never connected is no error either.
func TestBrokerDownAtStart(t *testing.T) {
	const topic = "kafka-down-at-start"
	addr := brokertest.ClosedPort(t)
	_, port, _ := net.SplitHostPort(addr)
	pn, _ := strconv.Atoi(port)
	never, err := NewPublisher(Config{Brokers: []string{addr}, ClientOptions: fastOpts()}, nil)
	if err != nil {
		t.Fatalf("NewPublisher with the brokers down: %v", err)
	}
	if err := never.Close(); err != nil {
		t.Fatalf("Close before connecting: %v", err)
	}
	p, err := NewPublisher(Config{Brokers: []string{addr}, ClientOptions: fastOpts()}, nil)
	if err != nil {
		t.Fatalf("NewPublisher with the brokers down: %v", err)
	}
	defer p.Close()
	wantAll(t, "brokers down", p.PublishBatch(context.Background(), messages(topic, "a", "")), func(err error) bool {
		var ue *outbox.UnavailableError
		return errors.As(err, &ue) && ue.Destination == "kafka "+addr
	})
	brokertest.Kafka(t, kfake.Ports(pn), kfake.SeedTopics(1, topic))
	wantAll(t, "broker up", p.PublishBatch(context.Background(), messages(topic, "a", "")), func(err error) bool { return err == nil })
}

// TestFailedLimitLookupIsNotRepeated: a cluster that refuses DescribeConfigs (no ACL for it:
// TOPIC_AUTHORIZATION_FAILED) is asked once per topic, not once per message.
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
	p, err := NewPublisher(Config{Brokers: c.ListenAddrs(), ClientOptions: fastOpts()}, nil)
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

// javaMurmur2 is the Kafka Java client's Utils.murmur2, transcribed as the reference.
func javaMurmur2(data []byte) int32 {
	const seed, m, r = uint32(0x9747b28c), uint32(0x5bd1e995), 24
	length := len(data)
	h := seed ^ uint32(length)
	for i := 0; i+4 <= length; i += 4 {
		k := uint32(data[i]) | uint32(data[i+1])<<8 | uint32(data[i+2])<<16 | uint32(data[i+3])<<24
		k *= m
		k ^= k >> r
		k *= m
		h *= m
		h ^= k
	}
	tail := data[length&^3:]
	switch len(tail) {
	case 3:
		h ^= uint32(tail[2]) << 16
		fallthrough
	case 2:
		h ^= uint32(tail[1]) << 8
		fallthrough
	case 1:
		h ^= uint32(tail[0])
		h *= m
	}
	h ^= h >> 13
	h *= m
	h ^= h >> 15
	return int32(h)
}

// javaPartition is the Java client's partition of a keyed record: toPositive(murmur2(key)) % n.
func javaPartition(key []byte, n int) int32 {
	return (javaMurmur2(key) & 0x7fffffff) % int32(n)
}

// TestMurmur2Partitions: keyed records land in the partition the Kafka Java client computes
// (toPositive(murmur2(key)) % partitions): the reference murmur2 reproduces the vectors of
// Kafka's UtilsTest.testMurmur2, the keys of those vectors land where those values put them
// (hard-coded for 7 partitions), and 300 other keys where the reference puts them.
func TestMurmur2Partitions(t *testing.T) {
	const topic, parts = "kafka-murmur2", 7
	vectors := []struct {
		key  string
		hash int32
		part int32 // of 7 partitions
	}{
		{"21", -973932308, 3},
		{"foobar", -790332482, 0},
		{"a-little-bit-long-string", -985981536, 1},
		{"a-little-bit-longer-string", -1486304829, 0},
		{"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971, 3},
		{"abc", 479470107, 4},
	}
	want := map[string]int32{}
	for _, v := range vectors {
		if h := javaMurmur2([]byte(v.key)); h != v.hash {
			t.Fatalf("reference murmur2(%q) = %d, want %d", v.key, h, v.hash)
		}
		want[v.key] = v.part
	}
	for i := range 300 {
		k := "order-" + strconv.Itoa(i)
		want[k] = javaPartition([]byte(k), parts)
	}
	c := brokertest.Kafka(t, kfake.SeedTopics(parts, topic))
	p, err := NewPublisher(Config{Brokers: c.ListenAddrs()}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var keys []string
	for k := range want {
		keys = append(keys, k)
	}
	wantAll(t, "publish", p.PublishBatch(context.Background(), messages(topic, keys...)), func(err error) bool { return err == nil })
	used := map[int32]bool{}
	for _, r := range readBack(t, c, topic, len(keys)) {
		used[r.Partition] = true
		if w := want[string(r.Key)]; r.Partition != w {
			t.Errorf("key %q in partition %d, the Java client puts it in %d", r.Key, r.Partition, w)
		}
	}
	if len(used) != parts {
		t.Errorf("%d keys used %d of %d partitions", len(keys), len(used), parts)
	}
}

// TestProducerStateLossKeepsOrder: kfake answers produce requests now and then with
// OUT_OF_ORDER_SEQUENCE_NUMBER or UNKNOWN_PRODUCER_ID for every partition (nothing appended),
// as a broker that forgot the idempotent producer does; kgo takes a new producer epoch and
// sends the batches again, in order: every message is acknowledged, and read back each key
// holds its messages once, in order.
func TestProducerStateLossKeepsOrder(t *testing.T) {
	const topic = "kafka-producer-state"
	c := brokertest.Kafka(t, kfake.SeedTopics(3, topic))
	codes := []int16{kerr.OutOfOrderSequenceNumber.Code, kerr.UnknownProducerID.Code}
	var n, refused atomic.Int32
	c.ControlKey(int16(kmsg.Produce), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if n.Add(1)%3 != 2 || refused.Load() >= 6 {
			return nil, nil, false
		}
		return brokertest.ProduceRefusal(kreq, codes[refused.Add(1)%2]), nil, true
	})
	p, err := NewPublisher(Config{Brokers: c.ListenAddrs(), ClientOptions: fastOpts()}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var batches [][]forwarder.Outgoing
	for round := range 12 {
		b := keyedBatch(topic, round, 200, 20)
		batches = append(batches, b)
		wantAll(t, fmt.Sprintf("round %d", round), p.PublishBatch(context.Background(), b), func(err error) bool { return err == nil })
	}
	if got := refused.Load(); got != 6 {
		t.Fatalf("%d produce requests refused, want 6", got)
	}
	checkOrderOnce(t, readBack(t, c, topic, 12*200), batches...)
}

// TestLeaderMovesKeepOrder: on a 3-broker kfake cluster, partition leaders move to other
// brokers every 5 ms while batches are produced concurrently by two callers; kgo follows the leaders, retrying in order: every message is
// acknowledged, and read back each key holds its messages once, in order.
func TestLeaderMovesKeepOrder(t *testing.T) {
	const topic, parts = "kafka-leader-moves", 6
	c := brokertest.Kafka(t, kfake.NumBrokers(3), kfake.SeedTopics(parts, topic))
	p, err := NewPublisher(Config{Brokers: c.ListenAddrs(), ClientOptions: fastOpts()}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	stop := make(chan struct{})
	moved := make(chan int)
	go func() {
		moves := 0
		defer func() { moved <- moves }()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
			part := int32(i % parts)
			if err := c.MoveTopicPartition(topic, part, (c.LeaderFor(topic, part)+1)%3); err == nil {
				moves++
			}
		}
	}()
	type caller struct {
		batches [][]forwarder.Outgoing
		errs    []string
	}
	callers := make([]caller, 2)
	done := make(chan struct{})
	for ci := range callers {
		go func() {
			defer func() { done <- struct{}{} }()
			for round := range 15 {
				// Each caller has its own keys, as each relay subscription has.
				b := keyedBatch(topic, round, 300, 30)
				for _, o := range b {
					k := o.Message.Metadata.Get(outbox.MetadataOrderingKey)
					o.Message.Metadata.Set(outbox.MetadataOrderingKey, fmt.Sprintf("c%d-%s", ci, k))
				}
				callers[ci].batches = append(callers[ci].batches, b)
				for i, err := range p.PublishBatch(context.Background(), b) {
					if err != nil {
						callers[ci].errs = append(callers[ci].errs, fmt.Sprintf("round %d message %d: %v", round, i, err))
					}
				}
			}
		}()
	}
	<-done
	<-done
	close(stop)
	if m := <-moved; m < 10 {
		t.Fatalf("only %d leader moves during the run", m)
	}
	var all [][]forwarder.Outgoing
	for _, cl := range callers {
		for _, e := range cl.errs {
			t.Error(e)
		}
		all = append(all, cl.batches...)
	}
	checkOrderOnce(t, readBack(t, c, topic, 2*15*300), all...)
}
