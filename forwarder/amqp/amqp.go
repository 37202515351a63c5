// Package amqp is the RabbitMQ (AMQP 0-9-1) destination of the outbox forwarder, on
// rabbitmq/amqp091-go with watermill-amqp/v2's message format.
//
// Unlike watermill-amqp's publisher (confirms off in every preset, mandatory off, returns
// ignored), a Publisher here: publishes persistent messages (delivery mode 2) through an
// existing exchange (the default exchange when Config.Exchange is empty), with the topic as
// routing key by default; puts every channel in confirm mode and waits for the broker's ack of
// each message; and sets mandatory, handling basic.return, so a message that no queue takes is
// a failure (*ReturnedError, errors.Is(err, ErrUnroutable)) — retried with backoff and
// dead-lettered by the outbox — never "delivered". A batch is pipelined on one channel and the
// confirms are awaited together.
//
// What lands on RabbitMQ is readable by the stock watermill-amqp subscriber with its
// DefaultMarshaler: the event id is the message UUID (header _watermill_message_uuid), the
// headers and outbox-* values are the metadata (AMQP headers), the payload is the body. The
// AMQP message-id property is the event id too (it matches returns to messages).
//
// Failure classes (outbox.ErrUnavailable, outbox.ErrPermanent): a broker that cannot be
// connected to, that closes the connection with 320 CONNECTION_FORCED (shutting down), or
// whose connection drops while a new one cannot be opened, or that blocks the connection
// during a memory or disk alarm (connection.blocked: ErrBlocked; a batch then fails at once,
// and the messages it left unconfirmed when the alarm began fail so at its context's end), is
// unavailable (the relay pauses and probes instead of counting attempts); a connection or channel that drops with messages
// unconfirmed (no ack, nack or return for them) while a new connection can be opened leaves
// them not attempted (outbox.ErrNotAttempted: released with no attempt, sent again on the new
// connection; duplicates at most the unconfirmed messages); a message that AMQP or the connection cannot carry
// (see Publisher.PublishBatch) is refused before publishing as permanent; a nack, a return
// (no queue bound) or a channel the broker closed for a reason (404 missing exchange) are
// ordinary failures.
package amqp

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmamqp "github.com/ThreeDotsLabs/watermill-amqp/v2/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/forwarder"
	"github.com/watermill-outbox/outbox/internal/netfail"
)

// DefaultChannels is Config.Channels' default.
const DefaultChannels = 4

// ErrUnroutable is matched (errors.Is) by every *ReturnedError.
var ErrUnroutable = errors.New("outbox amqp: message returned unroutable")

// ErrNacked is the cause of a message the broker answered with basic.nack.
var ErrNacked = errors.New("outbox amqp: message nacked by the broker")

// ErrClosed is returned for a publish after Close.
var ErrClosed = errors.New("outbox amqp: publisher closed")

// ErrChannelClosed is the cause of a message whose channel closed before the broker confirmed
// it (for example publishing to an exchange that does not exist: 404 NOT_FOUND); Unwrap of the
// wrapping error gives the broker's *amqp091.Error when known.
var ErrChannelClosed = errors.New("outbox amqp: channel closed before the broker confirmed the message")

// ReturnedError is the error of a message the broker returned (basic.return) because no queue
// took it: mandatory is set, so this is a failure, not a delivery. It matches ErrUnroutable.
type ReturnedError struct {
	ReplyCode  uint16
	ReplyText  string
	Exchange   string
	RoutingKey string
}

// Error describes the return: reply code and text, exchange and routing key.
func (e *ReturnedError) Error() string {
	return fmt.Sprintf("outbox amqp: message returned by the broker: %d %s (exchange %q, routing key %q)",
		e.ReplyCode, e.ReplyText, e.Exchange, e.RoutingKey)
}

// Is reports whether target is ErrUnroutable.
func (e *ReturnedError) Is(target error) bool { return target == ErrUnroutable }

// Config configures a Publisher. Exactly one of URL and Connection is required.
type Config struct {
	// URL of the broker, e.g. "amqp://guest:guest@127.0.0.1:5672/". The Publisher dials it,
	// redials when the connection drops (at the next publish) and closes it on Close. A
	// broker that cannot be reached when the Publisher is built (connection refused or
	// dropped, DNS, a dial timeout) is not an error: the Publisher dials at each publish
	// until it connects, and each message fails meanwhile with an *outbox.UnavailableError
	// (the relay pauses and probes, no attempt is counted).
	URL string
	// AMQPConfig is used to dial URL (TLS, heartbeat, vhost…); nil means amqp091's defaults.
	AMQPConfig *amqp091.Config
	// Connection is a connection of yours to use instead of URL. Close does not close it, and
	// the Publisher does not redial it: after it drops, publishes fail until you build a new
	// Publisher.
	Connection *amqp091.Connection

	// Exchange is the existing exchange to publish through; "" is the default exchange (the
	// routing key is then a queue name). It is never declared: a missing exchange makes each
	// publish fail (ErrChannelClosed) and the events retry and dead-letter.
	Exchange string
	// RoutingKey maps the destination topic and message to the routing key; nil means the
	// topic. It must be safe for concurrent use.
	RoutingKey func(topic string, msg *message.Message) string
	// Marshaler turns a message into a publishing; nil means watermill-amqp's
	// DefaultMarshaler{}. The delivery mode is set to persistent whatever it returns.
	Marshaler wmamqp.Marshaler
	// Channels is how many confirm-mode channels publish at once (each publish call uses one
	// channel for its whole batch), 1..1024. Default 4.
	Channels int
	// MaxMessageBytes is the largest body sent; a larger one is refused before publishing
	// (*UnsendableError inside an *outbox.PermanentError) instead of making the broker close
	// the channel with every unconfirmed message on it. Default 0 means
	// DefaultMaxMessageBytes (16 MiB, RabbitMQ 4's max_message_size); set it to your broker's
	// max_message_size. Negative is a configuration error.
	MaxMessageBytes int
}

func (c *Config) setDefaults() {
	if c.Channels == 0 {
		c.Channels = DefaultChannels
	}
	if c.Marshaler == nil {
		c.Marshaler = wmamqp.DefaultMarshaler{}
	}
	if c.MaxMessageBytes == 0 {
		c.MaxMessageBytes = DefaultMaxMessageBytes
	}
}

// Validate returns an *outbox.ConfigError (errors.Is(err, outbox.ErrConfig)) naming the first
// invalid field, or nil.
func (c Config) Validate() error {
	c.setDefaults()
	bad := func(field, reason string) error {
		return &outbox.ConfigError{Field: "amqp.Config." + field, Reason: reason}
	}
	switch {
	case c.URL == "" && c.Connection == nil:
		return bad("URL", "URL or Connection is required")
	case c.URL != "" && c.Connection != nil:
		return bad("Connection", "give URL or Connection, not both")
	case c.Channels < 1 || c.Channels > 1024:
		return bad("Channels", fmt.Sprintf("%d outside 1..1024", c.Channels))
	case c.MaxMessageBytes < 0:
		return bad("MaxMessageBytes", "must not be negative")
	case len(c.Exchange) > 255:
		return bad("Exchange", fmt.Sprintf("%d bytes, AMQP short strings hold at most 255", len(c.Exchange)))
	}
	return nil
}

// Publisher publishes to RabbitMQ with confirms and mandatory routing. It implements
// message.Publisher and forwarder.BatchPublisher and is safe for concurrent use.
type Publisher struct {
	cfg    Config
	name   string // Destination of *outbox.UnavailableError
	logger watermill.LoggerAdapter
	sem    chan struct{}        // one slot per channel in use
	idle   chan *confirmChannel // channels ready for reuse

	mu     sync.Mutex
	conn   *amqp091.Connection
	own    bool
	closed bool
	inUse  map[*confirmChannel]bool

	// block is the broker's connection.blocked of the current connection (nil: not blocked),
	// see watchBlocked.
	block atomic.Pointer[blockState]
}

// blockState is a connection the broker blocked, with the reason it gave.
type blockState struct {
	conn   *amqp091.Connection
	reason string
}

// ErrBlocked is the cause of the messages refused while the broker blocks the connection
// (connection.blocked: RabbitMQ stops reading from publishing connections during a memory or
// disk alarm, https://www.rabbitmq.com/docs/connection-blocked): inside an
// *outbox.UnavailableError, so no attempt is counted and the relay pauses and probes until
// the broker unblocks it.
var ErrBlocked = errors.New("outbox amqp: the broker blocked the connection (a resource alarm)")

// watchBlocked follows the broker's connection.blocked and connection.unblocked notifications
// for conn (amqp091 delivers them when the client announces the capability, which it does).
// While blocked, a publish would never be confirmed (the broker does not read it), so
// PublishBatch refuses at once as unavailable instead of waiting for its context to end and
// counting an attempt per event, which over a long alarm dead-lettered them.
func (p *Publisher) watchBlocked(conn *amqp091.Connection) {
	notes := conn.NotifyBlocked(make(chan amqp091.Blocking, 4))
	go func() {
		var mine *blockState
		for b := range notes { // closed when the connection closes
			switch {
			case b.Active && mine == nil:
				mine = &blockState{conn: conn, reason: b.Reason}
				p.block.Store(mine)
				p.logger.Info("outbox amqp: the broker blocked the connection; publishes are refused as unavailable until it unblocks", watermill.LogFields{"reason": b.Reason})
			case !b.Active && mine != nil:
				p.block.CompareAndSwap(mine, nil)
				mine = nil
				p.logger.Info("outbox amqp: the broker unblocked the connection", nil)
			}
		}
		if mine != nil {
			p.block.CompareAndSwap(mine, nil) // a new connection starts unblocked
		}
	}()
}

// blockedErr is the error of a message refused because the broker blocks the connection, or
// nil when it does not.
func (p *Publisher) blockedErr() error {
	if b := p.block.Load(); b != nil {
		return &outbox.UnavailableError{Destination: p.name, Err: fmt.Errorf("%w: %s", ErrBlocked, b.reason)}
	}
	return nil
}

// NewPublisher returns a Publisher; with Config.URL it dials the broker first, and when the
// broker cannot be reached it logs that at INFO and dials again at the next publish (see
// Config.URL). A nil logger means watermill.NopLogger. Errors: an *outbox.ConfigError for an
// invalid cfg, or a dial error other than an unreachable broker (refused credentials, a
// malformed URL, a TLS error).
func NewPublisher(cfg Config, logger watermill.LoggerAdapter) (*Publisher, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	p := &Publisher{
		cfg: cfg, name: destinationName(cfg), logger: logger.With(watermill.LogFields{"exchange": cfg.Exchange}),
		sem: make(chan struct{}, cfg.Channels), idle: make(chan *confirmChannel, cfg.Channels),
		conn: cfg.Connection, own: cfg.Connection == nil, inUse: map[*confirmChannel]bool{},
	}
	if p.own {
		conn, err := p.dial()
		switch {
		case err != nil && (netfail.Unreachable(err) || netfail.Dropped(err)):
			// Down at start is an outage, not a configuration error: open dials again.
			p.logger.Info("outbox amqp: broker not reachable yet; dialing again at each publish", watermill.LogFields{"destination": p.name, "err": err.Error()})
			return p, nil
		case err != nil:
			return nil, err
		}
		p.conn = conn
	}
	p.watchBlocked(p.conn)
	return p, nil
}

func (p *Publisher) dial() (*amqp091.Connection, error) {
	var (
		conn *amqp091.Connection
		err  error
	)
	if p.cfg.AMQPConfig != nil {
		conn, err = amqp091.DialConfig(p.cfg.URL, *p.cfg.AMQPConfig)
	} else {
		conn, err = amqp091.Dial(p.cfg.URL)
	}
	if err != nil {
		return nil, fmt.Errorf("outbox amqp: dial: %w", err)
	}
	return conn, nil
}

// Publish sends msgs to topic (routing key per Config.RoutingKey) through the exchange on one
// channel and waits for every confirm. It returns nil when each message was confirmed and
// routed, otherwise the per-message errors joined, each naming its message UUID.
func (p *Publisher) Publish(topic string, msgs ...*message.Message) error {
	return forwarder.PublishViaBatch(p.PublishBatch, topic, msgs...)
}

// PublishBatch implements forwarder.BatchPublisher: it publishes the batch in order on one
// confirm-mode channel with mandatory set, then waits for all confirms. A message is a success
// only when the broker acked it and did not return it.
//
// Before publishing, each message is checked against what AMQP and the connection can carry
// (pre-flight): the marshaler must succeed, every header value must have an AMQP field type
// (amqp091.Table.Validate), header names and short-string properties (message id, routing
// key, …) must fit 255 bytes, the content header frame (properties and headers) must fit the
// connection's negotiated frame size, and the body Config.MaxMessageBytes. A message that
// fails a check is not sent: it fails with an *outbox.PermanentError (wrapping an
// *UnsendableError or the marshal error) and its ordering key's later messages of the batch
// are held back (forwarder.ErrHeldBack), so one bad event fails alone instead of making the
// broker close the connection under its neighbours.
//
// Once a message is published it cannot be taken back: a nack or a return arrives after the
// key's later messages are already on the wire, so for those failures the key's later
// messages of the batch do reach the broker ahead of the failed one's retry (the outbox does
// not mark them published and delivers them again, in order, after it). When the channel
// closes mid-batch, the publishes after it fail on the client and are held back per key.
//
// Errors are classified as described at classify: unavailable (the broker cannot be reached
// or is shutting down), permanent (refused before publishing), otherwise ordinary. When ctx
// ends first, the unanswered messages fail with ctx's error and the channel is discarded.
// (Spreading a batch over several channels measured no faster here: the broker's persistence
// of one queue is the limit.)
func (p *Publisher) PublishBatch(ctx context.Context, batch []forwarder.Outgoing) []error {
	errs := make([]error, len(batch))
	fail := func(err error) []error {
		for i := range errs {
			if errs[i] == nil {
				errs[i] = err
			}
		}
		return errs
	}
	if err := p.blockedErr(); err != nil {
		return fail(err)
	}
	cc, err := p.acquire(ctx)
	if err != nil {
		return fail(p.classify(err, p.downCheck(ctx)))
	}
	discard := false
	defer func() { p.release(cc, discard) }()

	dcs := make([]*amqp091.DeferredConfirmation, len(batch))
	ids := make([]string, len(batch))
	held := map[string]bool{}
	for i, o := range batch {
		key := o.Message.Metadata.Get(outbox.MetadataOrderingKey)
		if key != "" && held[key] {
			errs[i] = forwarder.ErrHeldBack
			continue
		}
		pub, err := p.cfg.Marshaler.Marshal(o.Message)
		if err != nil {
			errs[i] = outbox.Permanent(fmt.Errorf("outbox amqp: marshal: %w", err))
			if key != "" {
				held[key] = true
			}
			continue
		}
		pub.DeliveryMode = amqp091.Persistent
		if pub.MessageId == "" {
			pub.MessageId = o.Message.UUID
		}
		rk := o.Topic
		if p.cfg.RoutingKey != nil {
			rk = p.cfg.RoutingKey(o.Topic, o.Message)
		}
		if err := preflight(&pub, p.cfg.Exchange, rk, cc.frameMax, p.cfg.MaxMessageBytes); err != nil {
			errs[i] = outbox.Permanent(err)
			if key != "" {
				held[key] = true
			}
			continue
		}
		if err := p.blockedErr(); err != nil {
			// Blocked under this batch: what is not on the wire yet stays off it.
			errs[i] = err
			if key != "" {
				held[key] = true
			}
			continue
		}
		dc, err := cc.ch.PublishWithDeferredConfirmWithContext(ctx, p.cfg.Exchange, rk, true, false, pub)
		if err != nil {
			if cc.ch.IsClosed() {
				// Closed under this batch: the broker's reason (404 missing exchange …) is
				// this message's too, not a dropped connection.
				err = cc.closeError()
			}
			errs[i] = fmt.Errorf("outbox amqp: publish: %w", err)
			if key != "" {
				held[key] = true
			}
			continue
		}
		dcs[i], ids[i] = dc, pub.MessageId
	}
	for i, dc := range dcs {
		if dc == nil {
			continue
		}
		ack, err := dc.WaitContext(ctx)
		switch {
		case err != nil && p.block.Load() != nil:
			// Unanswered because the broker blocked the connection: not the event's failure.
			errs[i] = errors.Join(p.blockedErr(), err)
			discard = true
		case err != nil:
			errs[i] = err
			discard = true
		case !ack && cc.ch.IsClosed():
			errs[i] = cc.closeError()
			discard = true
		case !ack:
			errs[i] = ErrNacked
		}
	}
	// A return precedes its message's ack, so every acked message's return is in by now. On a
	// discarded channel, returns of unanswered messages may still come: it is not reused.
	returned := map[string]amqp091.Return{}
	for _, r := range cc.takeReturns() {
		returned[r.MessageId] = r
	}
	for i := range batch {
		if errs[i] != nil || dcs[i] == nil {
			continue
		}
		if r, ok := returned[ids[i]]; ok {
			errs[i] = &ReturnedError{ReplyCode: r.ReplyCode, ReplyText: r.ReplyText, Exchange: r.Exchange, RoutingKey: r.RoutingKey}
		}
	}
	down := p.downCheck(ctx)
	for i, err := range errs {
		if err != nil && err != forwarder.ErrHeldBack {
			errs[i] = p.classify(err, down)
		}
	}
	return errs
}

// Close closes the Publisher's channels and, when it dialed the connection itself, the
// connection; publishes in flight fail. A Connection from Config is left open. Idempotent.
func (p *Publisher) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	chans := make([]*confirmChannel, 0, len(p.inUse))
	for cc := range p.inUse {
		chans = append(chans, cc)
	}
	conn, own := p.conn, p.own
	p.mu.Unlock()
	for _, cc := range chans {
		cc.close()
	}
	for {
		select {
		case cc := <-p.idle:
			cc.close()
			continue
		default:
		}
		break
	}
	if own && conn != nil && !conn.IsClosed() {
		if err := conn.Close(); err != nil && !errors.Is(err, amqp091.ErrClosed) {
			return fmt.Errorf("outbox amqp: close connection: %w", err)
		}
	}
	return nil
}

// acquire returns a channel for one publish call (a live idle one or a new one).
func (p *Publisher) acquire(ctx context.Context) (*confirmChannel, error) {
	select {
	case p.sem <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	for {
		var cc *confirmChannel
		select {
		case cc = <-p.idle:
		default:
		}
		if cc == nil {
			break
		}
		if !cc.ch.IsClosed() {
			p.mu.Lock()
			closed := p.closed
			if !closed {
				p.inUse[cc] = true
			}
			p.mu.Unlock()
			if closed {
				cc.close()
				<-p.sem
				return nil, ErrClosed
			}
			return cc, nil
		}
		cc.close()
	}
	cc, err := p.open()
	if err != nil {
		<-p.sem
		return nil, err
	}
	return cc, nil
}

func (p *Publisher) release(cc *confirmChannel, discard bool) {
	p.mu.Lock()
	delete(p.inUse, cc)
	closed := p.closed
	p.mu.Unlock()
	if discard || closed || cc.ch.IsClosed() {
		cc.close()
	} else {
		p.idle <- cc
	}
	<-p.sem
}

// open opens a confirm-mode channel, redialing an own connection that dropped.
func (p *Publisher) open() (*confirmChannel, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, ErrClosed
	}
	if p.conn == nil || p.conn.IsClosed() {
		if !p.own {
			return nil, fmt.Errorf("outbox amqp: open channel: %w", amqp091.ErrClosed)
		}
		conn, err := p.dial()
		if err != nil {
			return nil, err
		}
		p.logger.Info("outbox amqp: reconnected", nil)
		p.conn = conn
		p.watchBlocked(conn)
	}
	ch, err := p.conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("outbox amqp: open channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		_ = ch.Close()
		return nil, fmt.Errorf("outbox amqp: confirm mode: %w", err)
	}
	cc := newConfirmChannel(ch, p.conn.Config.FrameSize)
	p.inUse[cc] = true
	return cc, nil
}

// confirmChannel is a confirm-mode channel with its returns collected by a goroutine.
type confirmChannel struct {
	ch       *amqp091.Channel
	frameMax int // the connection's negotiated frame size; 0 = unlimited
	closes   chan *amqp091.Error
	barrier  chan chan []amqp091.Return
	stop     chan struct{}
	stopOnce sync.Once
	done     chan struct{}

	mu       sync.Mutex
	closeErr *amqp091.Error
}

func newConfirmChannel(ch *amqp091.Channel, frameMax int) *confirmChannel {
	cc := &confirmChannel{
		ch:       ch,
		frameMax: frameMax,
		closes:   ch.NotifyClose(make(chan *amqp091.Error, 1)),
		barrier:  make(chan chan []amqp091.Return),
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
	}
	// amqp091 hands a basic.return to this (unbuffered) channel before it processes the
	// broker's ack of the same message, so once a confirm is seen, its return (if any) has
	// been received here, and takeReturns (served by this same goroutine) includes it.
	returns := ch.NotifyReturn(make(chan amqp091.Return))
	go func() {
		defer close(cc.done)
		var got []amqp091.Return
		for {
			select {
			case r, ok := <-returns:
				if !ok {
					returns = nil
					continue
				}
				got = append(got, r)
			case reply := <-cc.barrier:
				reply <- got
				got = nil
			case <-cc.stop:
				return
			}
		}
	}()
	return cc
}

// takeReturns returns and forgets the returns received so far.
func (cc *confirmChannel) takeReturns() []amqp091.Return {
	reply := make(chan []amqp091.Return, 1)
	select {
	case cc.barrier <- reply:
		return <-reply
	case <-cc.done:
		return nil
	}
}

// closeError is the error of a channel that closed: amqp091 queues the broker's reason on
// NotifyClose before it fails the pending confirms.
func (cc *confirmChannel) closeError() error {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	if cc.closeErr == nil && cc.ch.IsClosed() {
		// amqp091 marks the channel closed before it hands the reason to NotifyClose (and
		// closes that channel right after): wait for it.
		select {
		case e := <-cc.closes:
			cc.closeErr = e
		case <-time.After(time.Second):
		}
	}
	if cc.closeErr != nil {
		return fmt.Errorf("%w: %w", ErrChannelClosed, cc.closeErr)
	}
	return ErrChannelClosed
}

func (cc *confirmChannel) close() {
	cc.stopOnce.Do(func() {
		_ = cc.ch.Close()
		close(cc.stop)
	})
}
