package redisstream

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/forwarder"
	"github.com/watermill-outbox/outbox/internal/brokertest"
)

func TestClassify(t *testing.T) {
	p := &Publisher{name: "redis test"}
	up := func() bool { return false }
	down := func() bool { return true }
	cases := []struct {
		name  string
		err   error
		down  func() bool
		class error // outbox.ErrUnavailable or nil (ordinary)
	}{
		{"refused", &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connect: connection refused")}, up, outbox.ErrUnavailable},
		{"loading", &ServerError{Message: "LOADING Redis is loading the dataset in memory"}, up, outbox.ErrUnavailable},
		{"oom", fmt.Errorf("xadd: %w", &ServerError{Message: "OOM command not allowed when used memory > 'maxmemory'."}), up, outbox.ErrUnavailable},
		{"readonly", &ServerError{Message: "READONLY You can't write against a read only replica."}, up, outbox.ErrUnavailable},
		{"busy", &ServerError{Message: "BUSY Redis is busy running a script."}, up, outbox.ErrUnavailable},
		{"busygroup is not busy", &ServerError{Message: "BUSYGROUP Consumer Group name already exists"}, up, nil},
		{"wrongtype", &ServerError{Message: "WRONGTYPE Operation against a key holding the wrong kind of value"}, up, nil},
		{"eof, server answers", fmt.Errorf("xadd: %w", net.ErrClosed), up, nil},
		{"eof, server down", fmt.Errorf("xadd: %w", net.ErrClosed), down, outbox.ErrUnavailable},
		{"context", context.DeadlineExceeded, down, nil},
	}
	for _, c := range cases {
		err := p.classify(c.err, c.down)
		if c.class == nil {
			if err != c.err {
				t.Errorf("%s: %v classified as %v, want unchanged", c.name, c.err, err)
			}
			continue
		}
		var ue *outbox.UnavailableError
		if !errors.Is(err, c.class) || !errors.As(err, &ue) || ue.Destination != "redis test" || !errors.Is(err, c.err) {
			t.Errorf("%s: %v classified as %v, want unavailable of %q wrapping it", c.name, c.err, err, "redis test")
		}
	}
}

// TestUnavailableRealClient: the real go-redis client against a closed loopback port (connection
// refused) and against a server that accepts connections but never answers (a stopped Redis:
// read timeout, then the PING times out too): every message fails with outbox.ErrUnavailable.
func TestUnavailableRealClient(t *testing.T) {
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	go func() {
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			defer c.Close() // held open, never answered
		}
	}()
	for _, tc := range []struct{ name, addr string }{
		{"refused", brokertest.ClosedPort(t)},
		{"silent", silent.Addr().String()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := NewPublisher(Config{Options: &redis.Options{Addr: tc.addr, DialTimeout: time.Second, ReadTimeout: 300 * time.Millisecond, WriteTimeout: 300 * time.Millisecond}}, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			batch := outgoing("s", "k", "k", "")
			for i, err := range p.PublishBatch(context.Background(), batch) {
				var ue *outbox.UnavailableError
				if !errors.As(err, &ue) || ue.Destination != "redis "+tc.addr {
					t.Errorf("message %d: %v, want *outbox.UnavailableError of %q", i, err, "redis "+tc.addr)
				}
			}
		})
	}
}

// outgoing returns one message per key ("" = unordered) to stream, in order.
func outgoing(stream string, keys ...string) []forwarder.Outgoing {
	out := make([]forwarder.Outgoing, len(keys))
	for i, k := range keys {
		m := outbox.NewMessage([]byte(fmt.Sprintf(`{"i":%d}`, i)))
		if k != "" {
			outbox.SetOrderingKey(m, k)
		}
		out[i] = forwarder.Outgoing{Topic: stream, Message: m}
	}
	return out
}

// TestEntryTooLarge: an entry above MaxEntryBytes is refused as permanent before sending and
// holds back its key's later messages; the other messages are appended.
func TestEntryTooLarge(t *testing.T) {
	addr := brokertest.RequireRedis(t)
	stream := fmt.Sprintf("rs-too-large-%d", time.Now().UnixNano())
	client := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer client.Close()
	defer client.Del(context.Background(), stream)
	p, err := NewPublisher(Config{Client: client, MaxEntryBytes: 1000}, nil)
	if err != nil {
		t.Fatal(err)
	}
	batch := outgoing(stream, "a", "b", "a", "a", "")
	batch[1].Message = withPayload(batch[1].Message, strings.Repeat("x", 1000))
	batch[0].Message = withPayload(batch[0].Message, strings.Repeat("y", 1000))
	errs := p.PublishBatch(context.Background(), batch)
	if !errors.Is(errs[0], ErrEntryTooLarge) || !errors.Is(errs[0], outbox.ErrPermanent) ||
		!errors.Is(errs[1], outbox.ErrPermanent) || errs[2] != forwarder.ErrHeldBack || errs[3] != forwarder.ErrHeldBack || errs[4] != nil {
		t.Fatalf("results %v", errs)
	}
	n, err := client.XLen(context.Background(), stream).Result()
	if err != nil || n != 1 {
		t.Fatalf("XLEN = %d (%v), want 1", n, err)
	}
}

func withPayload(m *message.Message, pad string) *message.Message {
	out := message.NewMessage(m.UUID, []byte(`{"pad":"`+pad+`"}`))
	out.Metadata = m.Metadata
	return out
}

// TestScriptWithMaxLen: a key's run (the append script) with MAXLEN trims like single XADDs,
// and the entries are in batch order.
func TestScriptWithMaxLen(t *testing.T) {
	addr := brokertest.RequireRedis(t)
	stream := fmt.Sprintf("rs-script-maxlen-%d", time.Now().UnixNano())
	client := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer client.Close()
	defer client.Del(context.Background(), stream)
	p, err := NewPublisher(Config{Client: client, MaxLen: 10}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for round := range 30 {
		batch := outgoing(stream, "k", "k", "k", "k", "k", "k", "k", "k", "k", "k")
		for i, err := range p.PublishBatch(context.Background(), batch) {
			if err != nil {
				t.Fatalf("round %d message %d: %v", round, i, err)
			}
		}
		for _, o := range batch {
			want = append(want, o.Message.UUID)
		}
	}
	entries, err := client.XRange(context.Background(), stream, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	// MAXLEN ~ 10 trims whole macro nodes (100 entries by default): fewer than the 300 sent,
	// at least 10, and what is left is the tail of the batches in order.
	if len(entries) < 10 || len(entries) >= 300 {
		t.Fatalf("%d entries after 300 appends with MAXLEN ~ 10", len(entries))
	}
	tail := want[len(want)-len(entries):]
	for i, en := range entries {
		if en.Values["_watermill_message_uuid"] != tail[i] {
			t.Fatalf("entry %d is %v, want %s", i, en.Values["_watermill_message_uuid"], tail[i])
		}
	}
}
