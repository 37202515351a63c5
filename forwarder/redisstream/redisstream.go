// Package redisstream is the Redis Streams destination of the outbox forwarder, on
// redis/go-redis/v9 with watermill-redisstream's entry layout.
//
// Each message is one XADD to the stream named by its topic (or Config.Stream) with
// watermill-redisstream's fields — "_watermill_message_uuid" (event id), "payload", "metadata"
// (msgpack of the headers and outbox-* values) — plus "topic" and, for ordered events,
// "ordering_key", so the stock watermill-redisstream subscriber reads every entry. A batch goes
// out in one pipeline (one round trip) with a result per entry; optional MAXLEN trimming is
// approximate ("~"). XADD is never retried by the client (MaxRetries -1 on the client this
// package builds): retries are the outbox's job, and a blind client retry of an XADD whose
// reply was lost would append the entry twice.
package redisstream

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/ThreeDotsLabs/watermill"
	wmredis "github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/forwarder"
)

// Entry fields added to watermill-redisstream's layout.
const (
	// FieldTopic holds the destination topic.
	FieldTopic = "topic"
	// FieldOrderingKey holds the event's ordering key; absent for unordered events.
	FieldOrderingKey = "ordering_key"
)

// ErrClosed is returned for a publish after Close.
var ErrClosed = errors.New("outbox redisstream: publisher closed")

// Config configures a Publisher. Exactly one of Options and Client is required.
type Config struct {
	// Options describe the client this package builds (and closes on Close). Its MaxRetries
	// is forced to -1 (no client-level retry of XADD); the other fields are go-redis's.
	Options *redis.Options
	// Client is a client of yours to use instead of Options; Close does not close it. Build
	// it with MaxRetries: -1 (go-redis retries a failed command 3 times by default, and a
	// retried XADD whose reply was lost appends the entry twice); a *redis.Client with
	// retries on is logged at construction.
	Client redis.UniversalClient

	// Stream, when set, is the one stream every message goes to; default "" means the
	// destination topic is the stream name.
	Stream string
	// MaxLen trims each stream to about this many entries on every XADD (MAXLEN ~). Default 0:
	// no trimming; negative is a configuration error.
	MaxLen int64
	// Marshaller builds the entry's fields; nil means watermill-redisstream's
	// DefaultMarshallerUnmarshaller. FieldTopic and FieldOrderingKey are added to what it
	// returns.
	Marshaller wmredis.Marshaller
}

// Validate returns an *outbox.ConfigError (errors.Is(err, outbox.ErrConfig)) naming the first
// invalid field, or nil.
func (c Config) Validate() error {
	bad := func(field, reason string) error {
		return &outbox.ConfigError{Field: "redisstream.Config." + field, Reason: reason}
	}
	switch {
	case c.Options == nil && c.Client == nil:
		return bad("Options", "Options or Client is required")
	case c.Options != nil && c.Client != nil:
		return bad("Client", "give Options or Client, not both")
	case c.MaxLen < 0:
		return bad("MaxLen", "must not be negative")
	}
	return nil
}

// Publisher appends messages to Redis streams. It implements message.Publisher and
// forwarder.BatchPublisher and is safe for concurrent use.
type Publisher struct {
	client     redis.UniversalClient
	own        bool
	cfg        Config
	marshaller wmredis.Marshaller
	logger     watermill.LoggerAdapter

	mu     sync.RWMutex
	closed bool
}

// NewPublisher returns a Publisher. It does not contact Redis. A nil logger means
// watermill.NopLogger. Errors: an *outbox.ConfigError for an invalid cfg.
func NewPublisher(cfg Config, logger watermill.LoggerAdapter) (*Publisher, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	p := &Publisher{cfg: cfg, marshaller: cfg.Marshaller, logger: logger}
	if p.marshaller == nil {
		p.marshaller = wmredis.DefaultMarshallerUnmarshaller{}
	}
	if cfg.Options != nil {
		opts := *cfg.Options
		opts.MaxRetries = -1
		p.client, p.own = redis.NewClient(&opts), true
	} else {
		p.client = cfg.Client
		if c, ok := cfg.Client.(*redis.Client); ok && c.Options().MaxRetries > 0 {
			logger.Info("outbox redisstream: the client retries failed commands (MaxRetries > 0): a retried XADD may append an entry twice; build it with MaxRetries: -1",
				watermill.LogFields{"max_retries": c.Options().MaxRetries})
		}
	}
	return p, nil
}

// Publish appends msgs to topic's stream (or Config.Stream) in one pipeline. It returns nil
// when every XADD succeeded, otherwise the per-message errors joined, each naming its message
// UUID.
func (p *Publisher) Publish(topic string, msgs ...*message.Message) error {
	return forwarder.PublishViaBatch(p.PublishBatch, topic, msgs...)
}

// PublishBatch implements forwarder.BatchPublisher: one XADD per message, all in one pipeline,
// in batch order; each message gets its own command's result (a connection failure fails them
// all). A message that cannot be marshaled fails unsent and its ordering key's later messages
// are held back (forwarder.ErrHeldBack).
func (p *Publisher) PublishBatch(ctx context.Context, batch []forwarder.Outgoing) []error {
	errs := make([]error, len(batch))
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.closed {
		for i := range errs {
			errs[i] = ErrClosed
		}
		return errs
	}
	held := map[string]bool{}
	cmds := make([]*redis.StringCmd, len(batch))
	pipe := p.client.Pipeline()
	for i, o := range batch {
		key := o.Message.Metadata.Get(outbox.MetadataOrderingKey)
		if key != "" && held[key] {
			errs[i] = forwarder.ErrHeldBack
			continue
		}
		values, err := p.marshaller.Marshal(o.Topic, o.Message)
		if err != nil {
			errs[i] = fmt.Errorf("outbox redisstream: marshal: %w", err)
			if key != "" {
				held[key] = true
			}
			continue
		}
		values[FieldTopic] = o.Topic
		if key != "" {
			values[FieldOrderingKey] = key
		}
		stream := p.cfg.Stream
		if stream == "" {
			stream = o.Topic
		}
		cmds[i] = pipe.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: values, MaxLen: p.cfg.MaxLen, Approx: p.cfg.MaxLen > 0})
	}
	if pipe.Len() == 0 {
		return errs
	}
	_, _ = pipe.Exec(ctx) // every command carries its own error
	for i, cmd := range cmds {
		if cmd == nil {
			continue
		}
		if err := cmd.Err(); err != nil {
			errs[i] = fmt.Errorf("outbox redisstream: xadd: %w", err)
		}
	}
	return errs
}

// Close closes the client when this package built it (Config.Options); a Config.Client is
// left open. Later publishes fail with ErrClosed. Idempotent.
func (p *Publisher) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	if p.own {
		if err := p.client.Close(); err != nil {
			return fmt.Errorf("outbox redisstream: close client: %w", err)
		}
	}
	return nil
}
