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
//
// Per-key order on the wire: the entries of one ordering key in a batch are appended by one
// Lua script that stops at the first failing XADD, so a key's later entries never reach a
// stream ahead of an earlier one that failed (they fail with forwarder.ErrHeldBack and follow
// it later). A script touches every stream its key's entries go to; on Redis Cluster keep the
// streams of one ordering key in one hash slot (a hash tag in the topic or Config.Stream), or
// the script fails with CROSSSLOT.
//
// Failure classes (outbox.ErrUnavailable, outbox.ErrPermanent, see outbox.UnavailableError):
// a server that cannot be connected to (refused, DNS, dial timeout), that answers LOADING,
// MASTERDOWN, CLUSTERDOWN, TRYAGAIN, BUSY, OOM, READONLY or NOREPLICAS, or whose connection
// broke (EOF, reset, read timeout) while a PING does not get through either, is unavailable
// (the relay pauses and probes instead of counting attempts); an entry the marshaller refuses
// or one larger than Config.MaxEntryBytes is permanent (refused before sending); any other
// error (WRONGTYPE, a broken connection to a server that answers a PING) is an ordinary
// failure.
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
	// returns. A marshal error fails the message permanently (the same message always fails).
	Marshaller wmredis.Marshaller
	// MaxEntryBytes is the largest entry (field names and values, in bytes) sent; a larger
	// one is refused before sending with ErrEntryTooLarge inside an *outbox.PermanentError.
	// Default 0 means DefaultMaxEntryBytes (Redis's default proto-max-bulk-len, 512 MiB): set
	// it to your server's proto-max-bulk-len if you lowered it. Negative is a configuration
	// error.
	MaxEntryBytes int
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
	case c.MaxEntryBytes < 0:
		return bad("MaxEntryBytes", "must not be negative")
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
	maxEntry   int
	name       string // Destination of *outbox.UnavailableError
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
	p := &Publisher{cfg: cfg, marshaller: cfg.Marshaller, maxEntry: cfg.MaxEntryBytes, logger: logger}
	if p.maxEntry == 0 {
		p.maxEntry = DefaultMaxEntryBytes
	}
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
	p.name = destinationName(p.client)
	return p, nil
}

// Publish appends msgs to topic's stream (or Config.Stream) in one pipeline. It returns nil
// when every XADD succeeded, otherwise the per-message errors joined, each naming its message
// UUID.
func (p *Publisher) Publish(topic string, msgs ...*message.Message) error {
	return forwarder.PublishViaBatch(p.PublishBatch, topic, msgs...)
}

// PublishBatch implements forwarder.BatchPublisher, in one pipeline (one round trip): an
// unordered message, or the only message of its ordering key in the batch, is one XADD; the
// messages of an ordering key with more than one in the batch go out as one Lua script (EVAL)
// that runs their XADDs in batch order and stops at the first that fails, so a failing entry
// never has its key's later entries of the batch after it on the stream: those get
// forwarder.ErrHeldBack. A message that cannot be marshaled or is larger than
// Config.MaxEntryBytes fails unsent with an *outbox.PermanentError and its key's later
// messages are held back. Errors are classified (see the package doc): outbox.ErrUnavailable
// for an unreachable or failing-over server, outbox.ErrPermanent for refused messages,
// otherwise an ordinary failure.
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
	// Pre-flight: marshal and size every message; group the keyed ones by ordering key.
	type group struct {
		key     string
		entries []*entry
	}
	var order []*group // in batch order of each group's first message
	byKey := map[string]*group{}
	held := map[string]bool{}
	for i, o := range batch {
		key := o.Message.Metadata.Get(outbox.MetadataOrderingKey)
		if key != "" && held[key] {
			errs[i] = forwarder.ErrHeldBack
			continue
		}
		en, err := p.entry(i, o)
		if err != nil {
			errs[i] = outbox.Permanent(err)
			if key != "" {
				held[key] = true
			}
			continue
		}
		g := byKey[key]
		if g == nil || key == "" {
			g = &group{key: key}
			order = append(order, g)
			if key != "" {
				byKey[key] = g
			}
		}
		g.entries = append(g.entries, en)
	}
	if len(order) == 0 {
		return errs
	}
	pipe := p.client.Pipeline()
	cmds := make([]redis.Cmder, len(order))
	for j, g := range order {
		if len(g.entries) == 1 {
			cmds[j] = pipe.XAdd(ctx, g.entries[0].args(p.cfg.MaxLen))
			continue
		}
		keys, argv := runArgs(g.entries, p.cfg.MaxLen)
		cmds[j] = pipe.Eval(ctx, runScript, keys, argv...)
	}
	_, _ = pipe.Exec(ctx) // every command carries its own error
	down := p.downCheck(ctx)
	for j, g := range order {
		cmd := cmds[j]
		if err := cmd.Err(); err != nil {
			// The command's own failure: for a script, it may or may not have run.
			for _, en := range g.entries {
				errs[en.i] = p.classify(fmt.Errorf("outbox redisstream: xadd: %w", err), down)
			}
			continue
		}
		sc, ok := cmd.(*redis.Cmd)
		if !ok {
			continue // an XADD that succeeded
		}
		added, failure, err := runResult(sc)
		if err != nil {
			for _, en := range g.entries {
				errs[en.i] = fmt.Errorf("outbox redisstream: %w", err)
			}
			continue
		}
		for k, en := range g.entries {
			switch {
			case k < added:
			case k == added:
				errs[en.i] = p.classify(fmt.Errorf("outbox redisstream: xadd: %w", &ServerError{Message: failure}), down)
			default:
				errs[en.i] = forwarder.ErrHeldBack
			}
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
