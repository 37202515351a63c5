package amqp

import (
	"context"
	"errors"
	"net/url"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/internal/netfail"
)

// probeTimeout bounds the dial that tells a dropped connection from a broker that is down.
const probeTimeout = 2 * time.Second

// classify maps a publish error to the outbox's failure classes. Unavailable: the broker
// cannot be connected to (refused, DNS, dial or handshake timeout), closed the connection
// with 320 CONNECTION_FORCED (it is shutting down), or the connection or channel broke without
// an answer from the broker while a new connection cannot be made either (down is called at
// most once per batch). Not attempted (outbox.NotAttempted: released, no attempt, sent again
// at once): the connection or channel broke without an answer about the message (no confirm,
// no nack, no return) and a new connection can be made. A channel or connection the broker
// closed with a reason (404 for a missing exchange, 406, 501) and every other error stay
// ordinary failures; refusals before publishing are permanent (see PublishBatch).
func (p *Publisher) classify(err error, down func() bool) error {
	if errors.Is(err, ErrClosed) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, outbox.ErrPermanent) || errors.Is(err, outbox.ErrUnavailable) {
		return err
	}
	var ae *amqp091.Error
	isAMQP := errors.As(err, &ae)
	switch {
	case netfail.Unreachable(err), isAMQP && ae.Code == amqp091.ConnectionForced:
	case isAMQP && ae.Server:
		return err
	case netfail.Dropped(err) || errors.Is(err, amqp091.ErrClosed) || errors.Is(err, ErrChannelClosed) || isAMQP:
		if !down() {
			// The outcome is unknown, not refused: the next claim sends it again on a new
			// connection (duplicates at most the unconfirmed messages).
			return outbox.NotAttempted(err)
		}
	default:
		return err
	}
	return &outbox.UnavailableError{Destination: p.name, Err: err}
}

// downCheck returns a function that reports, once per batch, whether the broker cannot be
// reached (see reachable).
func (p *Publisher) downCheck(ctx context.Context) func() bool {
	var once sync.Once
	var down bool
	return func() bool {
		once.Do(func() { down = !p.reachable(ctx) })
		return down
	}
}

// reachable reports whether the Publisher's connection is open, or, when it dialed the
// connection itself, whether a new one can be opened within probeTimeout (which then becomes
// the connection). A Connection from Config that closed is unreachable for good: the
// Publisher does not redial it.
func (p *Publisher) reachable(ctx context.Context) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || (p.conn != nil && !p.conn.IsClosed()) {
		return true
	}
	if !p.own || ctx.Err() != nil {
		return false
	}
	cfg := amqp091.Config{Heartbeat: 10 * time.Second, Locale: "en_US"} // amqp091.Dial's
	if p.cfg.AMQPConfig != nil {
		cfg = *p.cfg.AMQPConfig
	}
	if cfg.Dial == nil {
		cfg.Dial = amqp091.DefaultDial(probeTimeout)
	}
	conn, err := amqp091.DialConfig(p.cfg.URL, cfg)
	if err != nil {
		return false
	}
	p.logger.Info("outbox amqp: reconnected", watermill.LogFields{"by": "probe"})
	p.conn = conn
	return true
}

// destinationName names the broker for *outbox.UnavailableError: "amqp host:port".
func destinationName(cfg Config) string {
	if cfg.Connection != nil {
		if a := cfg.Connection.RemoteAddr(); a != nil {
			return "amqp " + a.String()
		}
		return "amqp"
	}
	if u, err := url.Parse(cfg.URL); err == nil && u.Host != "" {
		return "amqp " + u.Host
	}
	return "amqp"
}
