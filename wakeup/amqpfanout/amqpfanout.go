// Package amqpfanout is the RabbitMQ (AMQP 0-9-1) wakeup: writers publish each committed topic
// to a fanout exchange after COMMIT (coalesced: at most one batch per window, one transient
// message per distinct topic); each relay process consumes from its own exclusive, auto-delete,
// server-named queue bound to that exchange, and its subscriptions poll when a message names a
// topic they serve.
//
// Messages are transient and published without confirms: a lost signal is harmless. The
// listener's queue is bounded (MaxQueueLength, oldest dropped first), so a stalled relay never
// piles signals up in the broker; it vanishes with the listener's connection, and the
// listener declares a new one after reconnecting, then makes every subscription poll once.
package amqpfanout

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/wakeup"
)

// Defaults of Config.
const (
	// DefaultExchange is Config.Exchange's default.
	DefaultExchange = "watermill-outbox-wakeup"
	// DefaultMaxQueueLength is Config.MaxQueueLength's default.
	DefaultMaxQueueLength = 1000
	// DefaultDialTimeout is the connect timeout used when Config.AMQP.Dial is nil.
	DefaultDialTimeout = 10 * time.Second
	// DefaultListenerConnectionName is Config.ListenerConnectionName's default.
	DefaultListenerConnectionName = "watermill-outbox-wakeup-listener"
	// DefaultWriterConnectionName is Config.WriterConnectionName's default.
	DefaultWriterConnectionName = "watermill-outbox-wakeup-writer"
)

// Config configures a Wakeup. The zero value is valid.
type Config struct {
	// Exchange is the fanout exchange, declared durable (not auto-delete) by both sides; an
	// existing exchange of that name must have those properties. Writers and relays of one
	// outbox table must use the same exchange. Default DefaultExchange.
	Exchange string
	// MaxQueueLength bounds each listener's queue (x-max-length, oldest dropped first).
	// Default 1000; negative is a configuration error.
	MaxQueueLength int
	// AMQP is the connection config (TLS, SASL, vhost, heartbeat…) of both connections; a nil
	// Dial means amqp.DefaultDial(DefaultDialTimeout). Its Properties are copied, with
	// connection_name set to ListenerConnectionName or WriterConnectionName.
	AMQP amqp.Config
	// ListenerConnectionName names the listener's connection in the broker's management
	// view. Default DefaultListenerConnectionName.
	ListenerConnectionName string
	// WriterConnectionName names the writer's connection. Default
	// DefaultWriterConnectionName.
	WriterConnectionName string
	// Window is the writer side's coalescing window (see wakeup.Coalescer). Default
	// wakeup.DefaultWindow (5ms); negative is a configuration error.
	Window time.Duration
	// Reconnect shapes the listener's reconnect backoff and the writer's backoff after a
	// failed publish.
	Reconnect wakeup.Reconnect
}

func (c *Config) setDefaults() {
	if c.Exchange == "" {
		c.Exchange = DefaultExchange
	}
	if c.MaxQueueLength == 0 {
		c.MaxQueueLength = DefaultMaxQueueLength
	}
	if c.AMQP.Dial == nil {
		c.AMQP.Dial = amqp.DefaultDial(DefaultDialTimeout)
	}
	if c.ListenerConnectionName == "" {
		c.ListenerConnectionName = DefaultListenerConnectionName
	}
	if c.WriterConnectionName == "" {
		c.WriterConnectionName = DefaultWriterConnectionName
	}
}

// Validate returns a *outbox.ConfigError naming the first invalid field, or nil. Zero fields
// are valid.
func (c Config) Validate() error {
	switch {
	case c.MaxQueueLength < 0:
		return &outbox.ConfigError{Field: "amqpfanout.Config.MaxQueueLength", Reason: "must not be negative"}
	case c.Window < 0:
		return &outbox.ConfigError{Field: "amqpfanout.Config.Window", Reason: "must not be negative"}
	}
	return c.Reconnect.Validate("amqpfanout.Config.Reconnect")
}

// Wakeup is the RabbitMQ fanout wakeup (a wakeup.Wakeup). Safe for concurrent use.
type Wakeup struct {
	*wakeup.TransportWakeup
	url string
	cfg Config

	// The writer's connection, used by the coalescer's goroutine only.
	wconn *amqp.Connection
	wch   *amqp.Channel
}

// New returns a Wakeup connecting to url (amqp:// or amqps://). It does no I/O: the writer
// connects on its first send, the listener on the first Listen call, each on its own
// connection. A nil logger means watermill.NopLogger. Errors: a *outbox.ConfigError for an
// empty url or an invalid config.
func New(url string, cfg Config, logger watermill.LoggerAdapter) (*Wakeup, error) {
	if url == "" {
		return nil, &outbox.ConfigError{Field: "amqpfanout.New: url", Reason: "empty"}
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	w := &Wakeup{url: url, cfg: cfg}
	w.TransportWakeup = wakeup.FromTransport(wakeup.Transport{
		Name:      "amqp",
		Send:      w.send,
		Listen:    w.listen,
		Window:    cfg.Window,
		Reconnect: cfg.Reconnect,
		Logger:    logger.With(watermill.LogFields{"amqp_exchange": cfg.Exchange}),
		Close:     w.closeWriter,
	})
	return w, nil
}

// Exchange returns the fanout exchange's name.
func (w *Wakeup) Exchange() string { return w.cfg.Exchange }

// dial connects, opens a channel and declares the exchange.
func (w *Wakeup) dial(name string) (*amqp.Connection, *amqp.Channel, error) {
	c := w.cfg.AMQP
	c.Properties = amqp.Table{}
	for k, v := range w.cfg.AMQP.Properties {
		c.Properties[k] = v
	}
	c.Properties["connection_name"] = name
	conn, err := amqp.DialConfig(w.url, c)
	if err != nil {
		return nil, nil, fmt.Errorf("amqpfanout: dial: %w", err)
	}
	ch, err := conn.Channel()
	if err == nil {
		err = ch.ExchangeDeclare(w.cfg.Exchange, amqp.ExchangeFanout, true, false, false, false, nil)
	}
	if err != nil {
		_ = conn.Close()
		return nil, nil, fmt.Errorf("amqpfanout: declare exchange %q: %w", w.cfg.Exchange, err)
	}
	return conn, ch, nil
}

func (w *Wakeup) send(ctx context.Context, topics []string) error {
	if w.wconn == nil || w.wconn.IsClosed() || w.wch == nil || w.wch.IsClosed() {
		_ = w.closeWriter()
		conn, ch, err := w.dial(w.cfg.WriterConnectionName)
		if err != nil {
			return err
		}
		w.wconn, w.wch = conn, ch
	}
	for _, t := range topics {
		err := w.wch.PublishWithContext(ctx, w.cfg.Exchange, "", false, false, amqp.Publishing{
			ContentType:  "text/plain",
			DeliveryMode: amqp.Transient,
			Body:         []byte(t),
		})
		if err != nil {
			_ = w.closeWriter()
			return fmt.Errorf("amqpfanout: publish: %w", err)
		}
	}
	return nil
}

func (w *Wakeup) closeWriter() error {
	if w.wconn == nil {
		return nil
	}
	err := w.wconn.Close()
	w.wconn, w.wch = nil, nil
	if errors.Is(err, amqp.ErrClosed) {
		return nil
	}
	return err
}

func (w *Wakeup) listen(ctx context.Context, hub *wakeup.Hub, subscribed func()) error {
	conn, ch, err := w.dial(w.cfg.ListenerConnectionName)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	q, err := ch.QueueDeclare("", false, true, true, false, amqp.Table{
		"x-max-length": int64(w.cfg.MaxQueueLength),
		"x-overflow":   "drop-head",
	})
	if err != nil {
		return fmt.Errorf("amqpfanout: declare queue: %w", err)
	}
	if err := ch.QueueBind(q.Name, "", w.cfg.Exchange, false, nil); err != nil {
		return fmt.Errorf("amqpfanout: bind queue: %w", err)
	}
	deliveries, err := ch.Consume(q.Name, "", true, true, false, false, nil)
	if err != nil {
		return fmt.Errorf("amqpfanout: consume: %w", err)
	}
	subscribed()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case d, ok := <-deliveries:
			if !ok {
				select {
				case e := <-closed:
					if e != nil {
						return fmt.Errorf("amqpfanout: connection closed: %w", e)
					}
				default:
				}
				return errors.New("amqpfanout: consumer closed")
			}
			hub.Dispatch(string(d.Body))
		}
	}
}

var _ wakeup.Wakeup = (*Wakeup)(nil)
