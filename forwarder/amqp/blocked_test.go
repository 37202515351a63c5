package amqp

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/forwarder"
	"github.com/watermill-outbox/outbox/internal/brokertest"
	"github.com/watermill-outbox/outbox/internal/pgtest"
)

// blockingProxy relays one AMQP connection between a client and the broker (loopback). block
// does what RabbitMQ does under a memory or disk alarm: it sends the client connection.blocked
// and stops reading what the client sends; unblock sends connection.unblocked and reads again.
type blockingProxy struct {
	addr string

	mu     sync.Mutex // one frame at a time towards the client
	client net.Conn
	paused chan struct{} // non-nil while the client's bytes are not read
	pmu    sync.Mutex
}

func newBlockingProxy(t *testing.T, broker string) *blockingProxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &blockingProxy{addr: l.Addr().String()}
	var conns []net.Conn
	var cmu sync.Mutex
	t.Cleanup(func() {
		_ = l.Close()
		p.resume()
		cmu.Lock()
		defer cmu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", broker)
		if err != nil {
			_ = c.Close()
			return
		}
		cmu.Lock()
		conns = append(conns, c, up)
		cmu.Unlock()
		p.mu.Lock()
		p.client = c
		p.mu.Unlock()
		go func() { // broker → client, frame by frame (the broker sends no protocol header)
			hdr := make([]byte, 7)
			for {
				if _, err := io.ReadFull(up, hdr); err != nil {
					_ = c.Close()
					return
				}
				rest := make([]byte, binary.BigEndian.Uint32(hdr[3:7])+1)
				if _, err := io.ReadFull(up, rest); err != nil {
					_ = c.Close()
					return
				}
				p.mu.Lock()
				_, err1 := c.Write(hdr)
				_, err2 := c.Write(rest)
				p.mu.Unlock()
				if err1 != nil || err2 != nil {
					return
				}
			}
		}()
		buf := make([]byte, 32<<10) // client → broker, unless paused
		for {
			p.pmu.Lock()
			paused := p.paused
			p.pmu.Unlock()
			if paused != nil {
				<-paused
			}
			n, err := c.Read(buf)
			if n > 0 {
				if _, werr := up.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				_ = up.Close()
				return
			}
		}
	}()
	return p
}

// method sends the client a connection-class method frame (class 10) on channel 0.
func (p *blockingProxy) method(t *testing.T, id uint16, args []byte) {
	t.Helper()
	payload := append([]byte{0, 10, byte(id >> 8), byte(id)}, args...)
	frame := append([]byte{1, 0, 0, 0, 0, 0, 0}, payload...)
	binary.BigEndian.PutUint32(frame[3:7], uint32(len(payload)))
	frame = append(frame, 0xCE)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.client == nil {
		t.Fatal("no client connected to the proxy")
	}
	if _, err := p.client.Write(frame); err != nil {
		t.Fatal(err)
	}
}

func (p *blockingProxy) block(t *testing.T, reason string) {
	p.pmu.Lock()
	if p.paused == nil {
		p.paused = make(chan struct{})
	}
	p.pmu.Unlock()
	p.method(t, 60, append([]byte{byte(len(reason))}, reason...)) // connection.blocked
}

func (p *blockingProxy) unblock(t *testing.T) {
	p.method(t, 61, nil) // connection.unblocked
	p.resume()
}

func (p *blockingProxy) resume() {
	p.pmu.Lock()
	defer p.pmu.Unlock()
	if p.paused != nil {
		close(p.paused)
		p.paused = nil
	}
}

// TestBlockedConnectionIsUnavailable: while the broker blocks the connection (a resource
// alarm: connection.blocked, then it stops reading), a batch fails at once as unavailable
// (ErrBlocked inside an *outbox.UnavailableError: no attempt counted, the relay pauses and
// probes) instead of waiting for its context and failing with its error, an attempt per event
// that over a long alarm dead-lettered them. After connection.unblocked it publishes again.
func TestBlockedConnectionIsUnavailable(t *testing.T) {
	url := brokertest.RequireRabbitMQ(t)
	_, ch := dialChannel(t, url)
	q := queue(t, ch)
	broker := strings.TrimSuffix(strings.SplitN(url, "@", 2)[1], "/")
	px := newBlockingProxy(t, broker)
	p, err := NewPublisher(Config{URL: "amqp://guest:guest@" + px.addr + "/", Channels: 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	batch := func(n int) []forwarder.Outgoing {
		b := make([]forwarder.Outgoing, n)
		for i := range b {
			b[i] = forwarder.Outgoing{Topic: q, Message: outbox.NewMessage([]byte(`{}`))}
		}
		return b
	}
	for i, err := range p.PublishBatch(context.Background(), batch(2)) {
		if err != nil {
			t.Fatalf("before the alarm, message %d: %v", i, err)
		}
	}

	px.block(t, "low on memory")
	pgtest.Eventually(t, 10*time.Second, "the Publisher sees connection.blocked", func() bool { return p.block.Load() != nil })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for i, err := range p.PublishBatch(ctx, batch(3)) {
		var ue *outbox.UnavailableError
		if !errors.As(err, &ue) || !errors.Is(err, ErrBlocked) || ue.Destination != p.name || !strings.Contains(err.Error(), "low on memory") {
			t.Fatalf("while blocked, message %d: %v; want an *outbox.UnavailableError wrapping ErrBlocked with the broker's reason", i, err)
		}
	}
	if ctx.Err() != nil {
		t.Fatal("the blocked batch waited for its context to end")
	}

	px.unblock(t)
	pgtest.Eventually(t, 10*time.Second, "the Publisher sees connection.unblocked", func() bool { return p.block.Load() == nil })
	for i, err := range p.PublishBatch(context.Background(), batch(2)) {
		if err != nil {
			t.Fatalf("after the alarm, message %d: %v", i, err)
		}
	}
	if got := len(drain(t, ch, q)); got != 4 {
		t.Fatalf("%d messages in the queue, want the 4 published outside the alarm", got)
	}
}
