// Package redispubsub is the Redis pub/sub wakeup: writers PUBLISH each committed topic on a
// channel after COMMIT (coalesced: at most one batch per window, one message per distinct
// topic, pipelined); relays SUBSCRIBE to it on one dedicated connection per Wakeup and poll when
// a message names a topic they serve.
//
// Redis pub/sub is fire-and-forget: a message published while a relay is disconnected is lost,
// which is harmless — the listener reconnects with backoff, re-subscribes and then makes every
// subscription poll once, and polling stays the safety net.
package redispubsub

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/redis/go-redis/v9"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/wakeup"
)

// Defaults of Config.
const (
	// DefaultChannel is Config.Channel's default.
	DefaultChannel = "watermill-outbox-wakeup"
	// DefaultPingInterval is Config.PingInterval's default.
	DefaultPingInterval = 30 * time.Second
)

// Config configures a Wakeup. The zero value is valid.
type Config struct {
	// Channel is the pub/sub channel. Writers and relays of one outbox table must use the same
	// channel. Default DefaultChannel.
	Channel string
	// Window is the writer side's coalescing window (see wakeup.Coalescer). Default
	// wakeup.DefaultWindow (5ms); negative is a configuration error.
	Window time.Duration
	// PingInterval is how long the listener waits for a message before sending a PING; a
	// listener that then waits another PingInterval without an answer reconnects. Default 30s;
	// negative is a configuration error.
	PingInterval time.Duration
	// Reconnect shapes the listener's reconnect backoff and the writer's backoff after a
	// failed PUBLISH.
	Reconnect wakeup.Reconnect
}

func (c *Config) setDefaults() {
	if c.Channel == "" {
		c.Channel = DefaultChannel
	}
	if c.PingInterval == 0 {
		c.PingInterval = DefaultPingInterval
	}
}

// Validate returns a *outbox.ConfigError naming the first invalid field, or nil. Zero fields
// are valid.
func (c Config) Validate() error {
	switch {
	case c.Window < 0:
		return &outbox.ConfigError{Field: "redispubsub.Config.Window", Reason: "must not be negative"}
	case c.PingInterval < 0:
		return &outbox.ConfigError{Field: "redispubsub.Config.PingInterval", Reason: "must not be negative"}
	}
	return c.Reconnect.Validate("redispubsub.Config.Reconnect")
}

// Wakeup is the Redis pub/sub wakeup (a wakeup.Wakeup). Safe for concurrent use.
type Wakeup struct {
	*wakeup.TransportWakeup
	client redis.UniversalClient
	cfg    Config
}

// New returns a Wakeup over client (a *redis.Client, *redis.ClusterClient, …), which it
// does not close: the caller owns it. New does no I/O; the listener subscribes on the first
// Listen call (its SUBSCRIBE holds one connection of client for the Wakeup's life), and
// writers' messages go through client's pool. A nil logger means watermill.NopLogger.
// Errors: a *outbox.ConfigError for a nil client or an invalid config.
func New(client redis.UniversalClient, cfg Config, logger watermill.LoggerAdapter) (*Wakeup, error) {
	if client == nil {
		return nil, &outbox.ConfigError{Field: "redispubsub.New: client", Reason: "nil client"}
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	w := &Wakeup{client: client, cfg: cfg}
	w.TransportWakeup = wakeup.FromTransport(wakeup.Transport{
		Name:      "redis",
		Send:      w.send,
		Listen:    w.listen,
		Window:    cfg.Window,
		Reconnect: cfg.Reconnect,
		Logger:    logger.With(watermill.LogFields{"redis_channel": cfg.Channel}),
	})
	return w, nil
}

// Channel returns the pub/sub channel.
func (w *Wakeup) Channel() string { return w.cfg.Channel }

func (w *Wakeup) send(ctx context.Context, topics []string) error {
	_, err := w.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, t := range topics {
			p.Publish(ctx, w.cfg.Channel, t)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("redispubsub: publish: %w", err)
	}
	return nil
}

var errNoPong = errors.New("redispubsub: no answer to PING")

func (w *Wakeup) listen(ctx context.Context, hub *wakeup.Hub, subscribed func()) error {
	ps := w.client.Subscribe(ctx)
	stop := context.AfterFunc(ctx, func() { _ = ps.Close() })
	defer func() {
		stop()
		_ = ps.Close()
	}()
	if err := ps.Subscribe(ctx, w.cfg.Channel); err != nil {
		return fmt.Errorf("redispubsub: subscribe: %w", err)
	}
	// Wait for the server's confirmation.
	for {
		msg, err := ps.ReceiveTimeout(ctx, w.cfg.PingInterval)
		if err != nil {
			return fmt.Errorf("redispubsub: subscribe: %w", err)
		}
		if s, ok := msg.(*redis.Subscription); ok && s.Kind == "subscribe" && s.Channel == w.cfg.Channel {
			break
		}
	}
	subscribed()
	pinged := false
	for {
		msg, err := ps.ReceiveTimeout(ctx, w.cfg.PingInterval)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			var timeout interface{ Timeout() bool }
			if !errors.As(err, &timeout) || !timeout.Timeout() {
				return fmt.Errorf("redispubsub: receive: %w", err)
			}
			if pinged {
				return errNoPong
			}
			if err := ps.Ping(ctx); err != nil {
				return fmt.Errorf("redispubsub: ping: %w", err)
			}
			pinged = true
			continue
		}
		pinged = false
		if m, ok := msg.(*redis.Message); ok && m.Channel == w.cfg.Channel {
			hub.Dispatch(m.Payload)
		}
	}
}

var _ wakeup.Wakeup = (*Wakeup)(nil)
