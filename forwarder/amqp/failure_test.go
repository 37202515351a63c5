package amqp

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	wmamqp "github.com/ThreeDotsLabs/watermill-amqp/v2/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/forwarder"
	"github.com/watermill-outbox/outbox/internal/brokertest"
)

func TestPreflight(t *testing.T) {
	long := strings.Repeat("n", 256)
	base := func() amqp091.Publishing {
		return amqp091.Publishing{Headers: amqp091.Table{"a": "b"}, Body: []byte("{}"), DeliveryMode: 2, MessageId: "id"}
	}
	cases := []struct {
		name   string
		mod    func(p *amqp091.Publishing)
		rk     string
		reason string // "" = accepted
	}{
		{"plain", func(*amqp091.Publishing) {}, "rk", ""},
		{"typed values", func(p *amqp091.Publishing) {
			p.Headers["i"], p.Headers["t"], p.Headers["n"] = int64(1), amqp091.Table{"x": []any{true, 1.5}}, nil
		}, "rk", ""},
		{"untypable value", func(p *amqp091.Publishing) { p.Headers["s"] = struct{}{} }, "rk", "not supported"},
		{"untypable nested", func(p *amqp091.Publishing) { p.Headers["t"] = amqp091.Table{"u": uint64(1)} }, "rk", "not supported"},
		{"header name 256 bytes", func(p *amqp091.Publishing) { p.Headers[long] = "v" }, "rk", "header name of 256 bytes"},
		{"routing key 256 bytes", func(*amqp091.Publishing) {}, long, "routing key of 256 bytes"},
		{"message id 256 bytes", func(p *amqp091.Publishing) { p.MessageId = long }, "rk", "message id of 256 bytes"},
		{"body too large", func(p *amqp091.Publishing) { p.Body = make([]byte, 1001) }, "rk", "body of 1001 bytes"},
		{"header frame too large", func(p *amqp091.Publishing) { p.Headers["big"] = strings.Repeat("x", 5000) }, "rk", "exceeds the negotiated frame size 4096"},
	}
	for _, c := range cases {
		pub := base()
		c.mod(&pub)
		err := preflight(&pub, "", c.rk, 4096, 1000)
		switch {
		case c.reason == "" && err != nil:
			t.Errorf("%s: refused: %v", c.name, err)
		case c.reason != "" && (!errors.Is(err, ErrUnsendable) || !strings.Contains(err.Error(), c.reason)):
			t.Errorf("%s: %v, want an *UnsendableError saying %q", c.name, err, c.reason)
		}
	}
}

func TestClassify(t *testing.T) {
	p := &Publisher{name: "amqp test"}
	up := func() bool { return false }
	down := func() bool { return true }
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connect: connection refused")}
	cases := []struct {
		name         string
		err          error
		down         func() bool
		unavailable  bool
		notAttempted bool
	}{
		{"dial refused", fmt.Errorf("outbox amqp: dial: %w", refused), up, true, false},
		{"connection forced", fmt.Errorf("%w: %w", ErrChannelClosed, &amqp091.Error{Code: amqp091.ConnectionForced, Server: true}), up, true, false},
		{"missing exchange", fmt.Errorf("%w: %w", ErrChannelClosed, &amqp091.Error{Code: amqp091.NotFound, Server: true}), down, false, false},
		{"frame error from broker", &amqp091.Error{Code: amqp091.FrameError, Server: true}, down, false, false},
		{"local i/o error, broker down", &amqp091.Error{Code: amqp091.FrameError, Reason: "EOF"}, down, true, false},
		{"local i/o error, broker up", &amqp091.Error{Code: amqp091.FrameError, Reason: "EOF"}, up, false, true},
		{"closed, broker down", ErrChannelClosed, down, true, false},
		{"closed, broker up", ErrChannelClosed, up, false, true},
		{"connection not open, broker up", fmt.Errorf("outbox amqp: publish: %w", amqp091.ErrClosed), up, false, true},
		{"nacked", ErrNacked, down, false, false},
		{"returned", &ReturnedError{ReplyCode: 312}, down, false, false},
		{"context", context.DeadlineExceeded, down, false, false},
	}
	for _, c := range cases {
		err := p.classify(c.err, c.down)
		var ue *outbox.UnavailableError
		got := errors.As(err, &ue) && ue.Destination == "amqp test" && errors.Is(err, c.err)
		var na *outbox.NotAttemptedError
		gotNA := errors.As(err, &na) && errors.Is(err, c.err)
		if got != c.unavailable || gotNA != c.notAttempted || (!c.unavailable && !c.notAttempted && err != c.err) {
			t.Errorf("%s: %v classified as %v, want unavailable %v, not attempted %v", c.name, c.err, err, c.unavailable, c.notAttempted)
		}
	}
}

// queue declares a fresh auto-delete queue on ch and returns its name.
func queue(t *testing.T, ch *amqp091.Channel) string {
	t.Helper()
	q, err := ch.QueueDeclare(fmt.Sprintf("amqp-failure-%d", time.Now().UnixNano()), false, true, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	return q.Name
}

func dialChannel(t *testing.T, url string) (*amqp091.Connection, *amqp091.Channel) {
	t.Helper()
	conn, err := amqp091.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	return conn, ch
}

// drain returns the ids (Watermill UUIDs) of the messages in q, in queue order.
func drain(t *testing.T, ch *amqp091.Channel, q string) []string {
	t.Helper()
	var ids []string
	for {
		d, ok, err := ch.Get(q, true)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			return ids
		}
		ids = append(ids, d.MessageId)
	}
}

// TestHeaderFrameSizeMatchesBroker: a message whose content header frame is exactly the
// negotiated frame size by headerFrameSize's count is confirmed by RabbitMQ; one byte more is
// refused by the pre-flight. Published raw with amqp091, RabbitMQ takes it up to 8 bytes more
// and closes the whole connection with 501 FRAME_ERROR at 9 — its FRAME_SIZE_FUDGE of 8 on top
// of frame_max — so the count is the broker's, byte for byte.
func TestHeaderFrameSizeMatchesBroker(t *testing.T) {
	url := brokertest.RequireRabbitMQ(t)
	conn, ch := dialChannel(t, url)
	q := queue(t, ch)
	frameMax := conn.Config.FrameSize
	if frameMax <= 0 {
		t.Fatalf("negotiated frame size %d", frameMax)
	}
	msgWithPad := func(n int) (*message.Message, amqp091.Publishing) {
		m := outbox.NewMessage([]byte(`{}`))
		m.Metadata.Set("pad", strings.Repeat("p", n))
		pub, err := wmamqp.DefaultMarshaler{}.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		pub.DeliveryMode, pub.MessageId = amqp091.Persistent, m.UUID
		return m, pub
	}
	_, pub0 := msgWithPad(0)
	size0, err := headerFrameSize(&pub0)
	if err != nil {
		t.Fatal(err)
	}
	fit := frameMax - size0
	atLimit, pub := msgWithPad(fit)
	if n, _ := headerFrameSize(&pub); n != frameMax {
		t.Fatalf("padded header frame %d bytes, want %d", n, frameMax)
	}
	p, err := NewPublisher(Config{URL: url}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if err := p.Publish(q, atLimit); err != nil {
		t.Fatalf("header frame of exactly frame_max: %v", err)
	}
	over, _ := msgWithPad(fit + 1)
	err = p.Publish(q, over)
	if !errors.Is(err, ErrUnsendable) || !errors.Is(err, outbox.ErrPermanent) {
		t.Fatalf("header frame one byte over: %v, want a permanent ErrUnsendable", err)
	}
	if ids := drain(t, ch, q); len(ids) != 1 || ids[0] != atLimit.UUID {
		t.Fatalf("queue holds %v, want [%s]", ids, atLimit.UUID)
	}

	// Published raw (confirm mode): RabbitMQ takes up to 8 bytes over frame_max (its
	// FRAME_SIZE_FUDGE for clients that forget the frame overhead) and closes the whole
	// connection with 501 FRAME_ERROR beyond that.
	rawConn, rawCh := dialChannel(t, url)
	if err := rawCh.Confirm(false); err != nil {
		t.Fatal(err)
	}
	closed := rawConn.NotifyClose(make(chan *amqp091.Error, 1))
	_, fudge := msgWithPad(fit + 8)
	dc, err := rawCh.PublishWithDeferredConfirmWithContext(context.Background(), "", q, false, false, fudge)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := dc.WaitContext(context.Background()); !ok || err != nil {
		t.Fatalf("raw publish 8 bytes over frame_max: ack %v, %v", ok, err)
	}
	_, beyond := msgWithPad(fit + 9)
	_ = rawCh.PublishWithContext(context.Background(), "", q, false, false, beyond)
	select {
	case e := <-closed:
		if e == nil || e.Code != amqp091.FrameError || !e.Server {
			t.Fatalf("raw publish closed the connection with %v, want 501 FRAME_ERROR from the broker", e)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("raw publish 9 bytes over frame_max did not close the connection")
	}
}

// typedMarshaler puts a header value AMQP has no type for on messages with metadata "untypable".
type typedMarshaler struct{ wmamqp.DefaultMarshaler }

func (m typedMarshaler) Marshal(msg *message.Message) (amqp091.Publishing, error) {
	pub, err := m.DefaultMarshaler.Marshal(msg)
	if msg.Metadata.Get("untypable") != "" {
		pub.Headers["untypable"] = struct{ X int }{1}
	}
	return pub, err
}

// TestOneBadEventFailsAlone: in one batch on one channel, an oversized header, a header name
// over 255 bytes and an untypable header value each fail alone and permanently, before
// publishing; their keys' later messages are held back; every other message is confirmed at
// once, and the queue holds exactly those, once each, in batch order. The connection stays up:
// the next batch goes through on it.
func TestOneBadEventFailsAlone(t *testing.T) {
	url := brokertest.RequireRabbitMQ(t)
	_, ch := dialChannel(t, url)
	q := queue(t, ch)
	p, err := NewPublisher(Config{URL: url, Marshaler: typedMarshaler{}, Channels: 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	msg := func(key string, meta ...string) forwarder.Outgoing {
		m := outbox.NewMessage([]byte(`{}`))
		if key != "" {
			outbox.SetOrderingKey(m, key)
		}
		for i := 0; i < len(meta); i += 2 {
			m.Metadata.Set(meta[i], meta[i+1])
		}
		return forwarder.Outgoing{Topic: q, Message: m}
	}
	batch := []forwarder.Outgoing{
		msg("a"), msg("k"),
		msg("k", "pad", strings.Repeat("x", 200_000)), // 2: over frame_max 131072
		msg("k"), msg(""),
		msg("m", strings.Repeat("n", 300), "v"), // 5: header name over 255 bytes
		msg("m"), msg("a"),
		msg("u", "untypable", "1"), // 8
		msg("u"), msg(""),
	}
	errs := p.PublishBatch(context.Background(), batch)
	want := map[int]error{2: outbox.ErrPermanent, 3: forwarder.ErrHeldBack, 5: outbox.ErrPermanent, 6: forwarder.ErrHeldBack,
		8: outbox.ErrPermanent, 9: forwarder.ErrHeldBack}
	var sent []string
	for i, err := range errs {
		if w := want[i]; w == nil {
			if err != nil {
				t.Errorf("message %d: %v", i, err)
			}
			sent = append(sent, batch[i].Message.UUID)
		} else if !errors.Is(err, w) {
			t.Errorf("message %d: %v, want %v", i, err, w)
		}
	}
	for _, i := range []int{2, 5, 8} {
		if !errors.Is(errs[i], ErrUnsendable) {
			t.Errorf("message %d: %v, want ErrUnsendable", i, errs[i])
		}
	}
	next := msg("k")
	if err := p.PublishBatch(context.Background(), []forwarder.Outgoing{next})[0]; err != nil {
		t.Fatalf("next batch: %v", err)
	}
	got := drain(t, ch, q)
	if want := append(sent, next.Message.UUID); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("queue holds %v, want %v", got, want)
	}
}

// TestUnavailableWhenBrokerGone: through a loopback proxy to RabbitMQ, a publish succeeds;
// once the proxy is gone (connections cut, port closed) every message of the next batches
// fails with an *outbox.UnavailableError naming the broker, not an ordinary failure.
func TestUnavailableWhenBrokerGone(t *testing.T) {
	url := brokertest.RequireRabbitMQ(t)
	_, ch := dialChannel(t, url)
	q := queue(t, ch)
	addr, cut := brokertest.Forward(t, "127.0.0.1:0", strings.TrimSuffix(strings.SplitN(url, "@", 2)[1], "/"))
	p, err := NewPublisher(Config{URL: "amqp://guest:guest@" + addr + "/"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if err := p.Publish(q, outbox.NewMessage([]byte(`{}`))); err != nil {
		t.Fatal(err)
	}
	cut()
	for round := range 2 {
		batch := []forwarder.Outgoing{{Topic: q, Message: outbox.NewMessage([]byte(`{}`))}, {Topic: q, Message: outbox.NewMessage([]byte(`{}`))}}
		for i, err := range p.PublishBatch(context.Background(), batch) {
			var ue *outbox.UnavailableError
			if !errors.As(err, &ue) || ue.Destination != "amqp "+addr {
				t.Errorf("round %d message %d: %v, want *outbox.UnavailableError of %q", round, i, err, "amqp "+addr)
			}
		}
	}
}

// TestBrokerDownAtStart: a Publisher built while nothing listens at its URL is no error; each
// message fails as unavailable (naming the broker) until the broker can be reached, and then
// goes through on a connection the Publisher dials itself.
func TestBrokerDownAtStart(t *testing.T) {
	url := brokertest.RequireRabbitMQ(t)
	_, ch := dialChannel(t, url)
	q := queue(t, ch)
	addr := brokertest.ClosedPort(t)
	p, err := NewPublisher(Config{URL: "amqp://guest:guest@" + addr + "/"}, nil)
	if err != nil {
		t.Fatalf("NewPublisher with the broker down: %v", err)
	}
	defer p.Close()
	batch := []forwarder.Outgoing{{Topic: q, Message: outbox.NewMessage([]byte(`{}`))}, {Topic: q, Message: outbox.NewMessage([]byte(`{}`))}}
	for i, err := range p.PublishBatch(context.Background(), batch) {
		var ue *outbox.UnavailableError
		if !errors.As(err, &ue) || ue.Destination != "amqp "+addr {
			t.Errorf("message %d: %v, want *outbox.UnavailableError of %q", i, err, "amqp "+addr)
		}
	}
	_, _ = brokertest.Forward(t, addr, strings.TrimSuffix(strings.SplitN(url, "@", 2)[1], "/"))
	for i, err := range p.PublishBatch(context.Background(), batch) {
		if err != nil {
			t.Errorf("broker up: message %d: %v", i, err)
		}
	}
	if got := drain(t, ch, q); len(got) != 2 || got[0] != batch[0].Message.UUID || got[1] != batch[1].Message.UUID {
		t.Fatalf("queue holds %v, want the two messages", got)
	}
}
