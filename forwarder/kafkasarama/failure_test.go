package kafkasarama

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/eapache/go-resiliency/breaker"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/forwarder"
	"github.com/watermill-outbox/outbox/internal/brokertest"
)

func TestClassify(t *testing.T) {
	p := &Publisher{name: "kafka test"}
	up := func() bool { return false }
	down := func() bool { return true }
	cases := []struct {
		name  string
		err   error
		down  func() bool
		class error // nil: ordinary
	}{
		{"too large, refused before sending", fmt.Errorf("%w (2000 > 1000 bytes)", ErrMessageTooLarge), up, outbox.ErrPermanent},
		{"too large, from the broker", sarama.ErrMessageSizeTooLarge, up, outbox.ErrPermanent},
		{"out of brokers", sarama.ErrOutOfBrokers, up, outbox.ErrUnavailable},
		{"not enough replicas", sarama.ErrNotEnoughReplicas, up, outbox.ErrUnavailable},
		{"leader not available", sarama.ErrLeaderNotAvailable, up, outbox.ErrUnavailable},
		{"not leader", sarama.ErrNotLeaderForPartition, up, outbox.ErrUnavailable},
		{"request timed out", sarama.ErrRequestTimedOut, up, outbox.ErrUnavailable},
		{"old epoch after a failed batch", sarama.ErrInvalidProducerEpoch, up, outbox.ErrNotAttempted},
		{"out of order sequence", sarama.ErrOutOfOrderSequenceNumber, down, outbox.ErrNotAttempted},
		{"unknown producer id", sarama.ErrUnknownProducerID, up, outbox.ErrNotAttempted},
		{"producer fenced", sarama.ErrProducerFenced, up, outbox.ErrNotAttempted},
		{"dial refused", &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connect: connection refused")}, up, outbox.ErrUnavailable},
		{"eof, cluster answers", fmt.Errorf("read: %w", net.ErrClosed), up, outbox.ErrNotAttempted},
		{"eof, cluster down", fmt.Errorf("read: %w", net.ErrClosed), down, outbox.ErrUnavailable},
		{"unknown topic", sarama.ErrUnknownTopicOrPartition, down, nil},
		{"breaker open, cluster answers", breaker.ErrBreakerOpen, up, nil},
		{"breaker open, cluster down", breaker.ErrBreakerOpen, down, outbox.ErrUnavailable},
		{"not connected, cluster answers", sarama.ErrNotConnected, up, outbox.ErrNotAttempted},
		{"not connected, cluster down", sarama.ErrNotConnected, down, outbox.ErrUnavailable},
		{"held back", forwarder.ErrHeldBack, down, nil},
		{"context", context.DeadlineExceeded, down, nil},
	}
	for _, c := range cases {
		err := p.classify(c.err, c.down)
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

// fastConfig is DefaultSaramaConfig with short retry backoffs, so failures surface quickly.
func fastConfig() *sarama.Config {
	sc := DefaultSaramaConfig()
	sc.Producer.Retry.Backoff = 20 * time.Millisecond
	sc.Metadata.Retry.Backoff = 20 * time.Millisecond
	sc.Net.DialTimeout = time.Second
	return sc
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

// TestUnavailableRealClient: with the real Sarama producer against kfake, produce requests
// answered with NOT_ENOUGH_REPLICAS fail their messages as unavailable after Sarama's retries
// and a key's second message (the next round) is held back unsent; the same batch goes
// through once the broker answers again, and after the cluster is closed every message fails
// as unavailable.
func TestUnavailableRealClient(t *testing.T) {
	const topic = "kafka-unavailable"
	c := brokertest.Kafka(t, kfake.NumBrokers(1), kfake.SeedTopics(2, topic))
	p, err := NewPublisher(Config{Brokers: c.ListenAddrs(), SaramaConfig: fastConfig()}, nil)
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
		req := kreq.(*kmsg.ProduceRequest)
		resp := req.ResponseKind().(*kmsg.ProduceResponse)
		for _, rt := range req.Topics {
			st := kmsg.NewProduceResponseTopic()
			st.Topic = rt.Topic
			for _, rp := range rt.Partitions {
				sp := kmsg.NewProduceResponseTopicPartition()
				sp.Partition = rp.Partition
				sp.ErrorCode = kerr.NotEnoughReplicas.Code
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		return resp, nil, true
	})
	batch := messages(topic, "a", "b", "", "a")
	errs := p.PublishBatch(context.Background(), batch)
	if errs[3] != forwarder.ErrHeldBack { // the second round never goes out
		t.Errorf("second message of key a: %v, want ErrHeldBack", errs[3])
	}
	wantAll(t, "not enough replicas", errs[:3], func(err error) bool {
		var ue *outbox.UnavailableError
		return errors.Is(err, sarama.ErrNotEnoughReplicas) && errors.As(err, &ue) && ue.Destination == "kafka "+c.ListenAddrs()[0]
	})
	failing.Store(false)
	wantAll(t, "after recovery", p.PublishBatch(context.Background(), batch), func(err error) bool { return err == nil })

	c.Close()
	wantAll(t, "cluster closed", p.PublishBatch(context.Background(), messages(topic, "a", "")), func(err error) bool {
		return errors.Is(err, outbox.ErrUnavailable)
	})
}

// TestPermanentRealBroker: with the topic limit lookup off, kfake refuses the record batch that
// holds an oversized message (MESSAGE_TOO_LARGE); resent alone, only that message fails, as
// permanent, its key's later message is held back, and the others are written. Refused before
// sending (lookup on), the result is the same without the broker's refusal.
func TestPermanentRealBroker(t *testing.T) {
	for _, lookup := range []bool{false, true} {
		t.Run(fmt.Sprintf("lookup=%v", lookup), func(t *testing.T) {
			const topic = "kafka-permanent"
			c := brokertest.Kafka(t, kfake.SeedTopics(1, topic))
			admin, err := sarama.NewClusterAdmin(c.ListenAddrs(), DefaultSaramaConfig())
			if err != nil {
				t.Fatal(err)
			}
			limit := "4096"
			if err := admin.AlterConfig(sarama.TopicResource, topic, map[string]*string{"max.message.bytes": &limit}, false); err != nil {
				t.Fatal(err)
			}
			_ = admin.Close()
			p, err := NewPublisher(Config{Brokers: c.ListenAddrs(), SaramaConfig: fastConfig(), DisableTopicLimits: !lookup}, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			batch := messages(topic, "a", "k", "k", "k", "b", "")
			big := outbox.NewMessage([]byte(`{"pad":"` + strings.Repeat("x", 8000) + `"}`))
			big.Metadata = batch[2].Message.Metadata
			batch[2].Message = big
			errs := p.PublishBatch(context.Background(), batch)
			for i, err := range errs {
				switch i {
				case 2:
					if !errors.Is(err, outbox.ErrPermanent) || !errors.Is(err, sarama.ErrMessageSizeTooLarge) {
						t.Errorf("oversized message: %v, want permanent MESSAGE_TOO_LARGE", err)
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
		})
	}
}

// TestStaleBreaker: a message refused by the circuit breaker is sent again unless a later
// message of its key in the same call was acknowledged.
func TestStaleBreaker(t *testing.T) {
	pm := func(key string) *sarama.ProducerMessage {
		m := &sarama.ProducerMessage{Topic: "t"}
		if key != "" {
			m.Key = sarama.StringEncoder(key)
		}
		return m
	}
	open := breaker.ErrBreakerOpen
	pms := []*sarama.ProducerMessage{pm("a"), pm("b"), pm("a"), pm("c"), pm(""), pm("c"), pm("")}
	res := []error{open, open, nil, open, open, open, nil}
	// 0: a later "a" acknowledged; 4: a later unkeyed one acknowledged.
	if got := staleBreaker(pms, res); fmt.Sprint(got) != "[1 3 5]" {
		t.Fatalf("staleBreaker = %v, want [1 3 5]", got)
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
	never, err := NewPublisher(Config{Brokers: []string{addr}, SaramaConfig: fastConfig()}, nil)
	if err != nil {
		t.Fatalf("NewPublisher with the brokers down: %v", err)
	}
	if err := never.Close(); err != nil {
		t.Fatalf("Close before connecting: %v", err)
	}
	p, err := NewPublisher(Config{Brokers: []string{addr}, SaramaConfig: fastConfig()}, nil)
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
