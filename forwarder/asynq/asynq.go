// Package asynq is the task-queue destination of the outbox forwarder: events of a reserved
// topic prefix (default "task.") become hibiken/asynq tasks, run by asynq workers elsewhere.
// A business write and the job it asks for then commit together, and the relay enqueues the
// job at least once.
//
// Each event is enqueued as a task whose type is the topic without the prefix
// ("task.email:welcome" → "email:welcome"), whose payload is the event's payload, whose headers
// are the message's metadata (the event headers and the outbox-* values), and whose task id
// is the event id. asynq refuses a second task of an id that its queue still holds
// (asynq.ErrTaskIDConflict): that answer counts as delivered, so an event that the relay
// enqueued but could not mark (a relay killed between the enqueue and the mark) is recognised
// when it is delivered again, and no second task runs. asynq keeps a task's id only while the
// task is pending, running, retrying, or retained after it finished: Config.Retention (default
// 24h) is therefore the window in which a redelivered event is recognised after its task ran.
//
// Ordering: the outbox holds an event of an ordering key until the previous event of that key
// is delivered — here, until its task is enqueued. So tasks of one key are enqueued in order,
// but asynq's workers take tasks concurrently and retry a failed task later, so a key's tasks
// may run in any order, and a retried task runs after its successors. Ordering keys order the
// enqueueing only; for per-key execution order run one worker on the queue (Concurrency 1) and
// MaxRetry 0, or keep the order in the task handlers.
//
// asynq.Unique (in Config.Options) makes asynq refuse a task whose queue, type and payload equal
// those of a task it still holds (asynq.ErrDuplicateTask). The Publisher then reads which task
// holds that uniqueness lock: when it is the event's own task (a redelivered event) the answer
// counts as delivered, as for a task id conflict; when it is another event's task, the event is a
// permanent failure (dead-lettered at once, its last error naming the task that holds the lock).
// Unique needs Config.Redis, the connection the Publisher reads the lock with.
//
// Failure classes (outbox.Unavailable, outbox.Permanent): a Redis that cannot be reached
// (connection refused, reset, timed out dialling) or refuses every write (READONLY, OOM,
// LOADING, MASTERDOWN, CLUSTERDOWN, TRYAGAIN, BUSY, NOREPLICAS replies, as in
// forwarder/redisstream) is unavailable — no attempt is counted and the relay pauses; an event whose topic lacks the prefix or names no task type is permanent
// (dead-lettered at once); anything else is an ordinary failure (backoff, MaxAttempts).
package asynq

import (
	"context"
	"crypto/md5"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/internal/redisfail"
)

// Defaults of Config.
const (
	// DefaultTopicPrefix is Config.TopicPrefix's default.
	DefaultTopicPrefix = "task."
	// DefaultQueue is Config.Queue's default (asynq's own default queue).
	DefaultQueue = "default"
	// DefaultRetention is Config.Retention's default.
	DefaultRetention = 24 * time.Hour
	// Destination names this destination in *outbox.UnavailableError.
	Destination = "asynq"
)

// ErrClosed is returned for a publish after Close.
var ErrClosed = errors.New("outbox asynq: publisher closed")

// ErrUniqueHeld is the cause (wrapped in an *outbox.PermanentError) for an event whose task
// asynq refused under asynq.Unique because another event's task of the same type and payload
// holds the uniqueness lock.
var ErrUniqueHeld = errors.New("outbox asynq: a task of the same type and payload is enqueued already (asynq.Unique)")

// ErrNotATask is the cause (wrapped in an *outbox.PermanentError) for an event whose topic does
// not start with Config.TopicPrefix or has nothing after it.
var ErrNotATask = errors.New("outbox asynq: topic names no task type")

// Config configures a Publisher. Exactly one of Redis and Client is required.
type Config struct {
	// Redis describes the Redis server (asynq.RedisClientOpt{Addr: "127.0.0.1:6379", DB: 0},
	// or a failover/cluster option); the Publisher builds its client and closes it on Close.
	Redis asynq.RedisConnOpt
	// Client is an asynq client of yours to use instead; Close does not close it.
	Client *asynq.Client

	// TopicPrefix marks the outbox topics that are tasks; the task type is the rest of the
	// topic. Default DefaultTopicPrefix ("task."). Relay only these topics to this destination
	// (forwarder.Config.SubscribeTopic "task.*"): an event of another topic is a permanent
	// failure (dead-lettered).
	TopicPrefix string
	// Queue is the asynq queue the tasks go to. Default DefaultQueue ("default").
	Queue string
	// Retention is how long asynq keeps a finished task (and so its id): the window in which
	// a redelivered event is still recognised after its task ran. Default DefaultRetention
	// (24h); negative is a configuration error. Keep it longer than any redelivery can come
	// (the relay's LeaseDuration plus its retries).
	Retention time.Duration
	// MaxRetry is how many times asynq retries a failed task. Default 0 means asynq's own
	// default (25); negative is a configuration error; for no retries add asynq.MaxRetry(0)
	// to Options.
	MaxRetry int
	// Options are further asynq options for every task, applied after the package's. Accepted:
	// asynq.MaxRetry, asynq.Timeout, asynq.Deadline, asynq.ProcessAt, asynq.ProcessIn,
	// asynq.Retention and asynq.Unique (which needs Config.Redis; see the package doc).
	// Refused with a configuration error: asynq.TaskID (the task id is the event id),
	// asynq.Queue (use Config.Queue) and asynq.Group (an aggregated group replaces its tasks'
	// ids, so a redelivered event would no longer be recognised and would run twice).
	Options []asynq.Option
}

func (c *Config) setDefaults() {
	if c.TopicPrefix == "" {
		c.TopicPrefix = DefaultTopicPrefix
	}
	if c.Queue == "" {
		c.Queue = DefaultQueue
	}
	if c.Retention == 0 {
		c.Retention = DefaultRetention
	}
}

// Validate returns an *outbox.ConfigError (errors.Is(err, outbox.ErrConfig)) naming the first
// invalid field, or nil.
func (c Config) Validate() error {
	bad := func(field, reason string) error {
		return &outbox.ConfigError{Field: "asynq.Config." + field, Reason: reason}
	}
	switch {
	case c.Redis == nil && c.Client == nil:
		return bad("Redis", "Redis or Client is required")
	case c.Redis != nil && c.Client != nil:
		return bad("Client", "give Redis or Client, not both")
	case c.Retention < 0:
		return bad("Retention", "must not be negative")
	case c.MaxRetry < 0:
		return bad("MaxRetry", "must not be negative (add asynq.MaxRetry(0) to Options for no retries)")
	case strings.TrimSpace(c.Queue) != c.Queue:
		return bad("Queue", fmt.Sprintf("%q: no leading or trailing spaces", c.Queue))
	}
	for i, o := range c.Options {
		switch {
		case o == nil:
			return bad(fmt.Sprintf("Options[%d]", i), "nil option")
		case o.Type() == asynq.TaskIDOpt:
			return bad(fmt.Sprintf("Options[%d]", i), "asynq.TaskID: the task id is the event id")
		case o.Type() == asynq.QueueOpt:
			return bad(fmt.Sprintf("Options[%d]", i), "asynq.Queue: set Config.Queue instead")
		case o.Type() == asynq.GroupOpt:
			return bad(fmt.Sprintf("Options[%d]", i), "asynq.Group: aggregation replaces the task ids, so a redelivered event would run twice")
		case o.Type() == asynq.UniqueOpt && c.Redis == nil:
			return bad(fmt.Sprintf("Options[%d]", i), "asynq.Unique needs Config.Redis (the Publisher reads which task holds the uniqueness lock), not Config.Client")
		}
	}
	return nil
}

// Stats counts a Publisher's results since it was built.
type Stats struct {
	// Enqueued counts tasks enqueued.
	Enqueued uint64
	// Conflicts counts events whose task was enqueued already (a redelivered event: its task
	// id exists, or under asynq.Unique its own task holds the lock), counted as delivered.
	Conflicts uint64
}

// Publisher enqueues outbox events as asynq tasks. It implements message.Publisher and is
// safe for concurrent use.
type Publisher struct {
	client *asynq.Client
	own    bool
	cfg    Config
	opts   []asynq.Option
	logger watermill.LoggerAdapter

	enqueued, conflicts atomic.Uint64

	// unique is set when Options hold asynq.Unique; locks reads uniqueness locks, built on the
	// first duplicate answer by whichever publishing goroutine gets it (under locksOnce).
	unique    bool
	locksOnce sync.Once
	locks     redis.UniversalClient
	locksErr  error

	mu     sync.RWMutex
	closed bool
}

// NewPublisher returns a Publisher. It does not contact Redis. A nil logger means
// watermill.NopLogger. Errors: an *outbox.ConfigError for an invalid cfg.
func NewPublisher(cfg Config, logger watermill.LoggerAdapter) (*Publisher, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	p := &Publisher{cfg: cfg, logger: logger.With(watermill.LogFields{"asynq_queue": cfg.Queue})}
	p.opts = []asynq.Option{asynq.Queue(cfg.Queue), asynq.Retention(cfg.Retention)}
	if cfg.MaxRetry > 0 {
		p.opts = append(p.opts, asynq.MaxRetry(cfg.MaxRetry))
	}
	p.opts = append(p.opts, cfg.Options...)
	for _, o := range cfg.Options {
		p.unique = p.unique || o.Type() == asynq.UniqueOpt
	}
	if cfg.Client != nil {
		p.client = cfg.Client
	} else {
		p.client, p.own = asynq.NewClient(cfg.Redis), true
	}
	return p, nil
}

// Stats returns the counters so far.
func (p *Publisher) Stats() Stats {
	return Stats{Enqueued: p.enqueued.Load(), Conflicts: p.conflicts.Load()}
}

// Publish enqueues one task per message, in order, with the message's context. A message whose
// task id is enqueued already counts as delivered. It returns nil when every message is
// delivered, otherwise the per-message errors joined, each naming its message UUID (and
// classified: *outbox.UnavailableError, *outbox.PermanentError, or an ordinary error).
func (p *Publisher) Publish(topic string, msgs ...*message.Message) error {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.closed {
		return ErrClosed
	}
	var errs []error
	for _, msg := range msgs {
		if err := p.enqueue(topic, msg); err != nil {
			errs = append(errs, fmt.Errorf("message %s: %w", msg.UUID, err))
		}
	}
	return errors.Join(errs...)
}

func (p *Publisher) enqueue(topic string, msg *message.Message) error {
	typ, ok := strings.CutPrefix(topic, p.cfg.TopicPrefix)
	if !ok || strings.TrimSpace(typ) == "" {
		return outbox.Permanent(fmt.Errorf("%w: topic %q (want %q followed by the task type)", ErrNotATask, topic, p.cfg.TopicPrefix))
	}
	if msg.UUID == "" {
		return outbox.Permanent(errors.New("outbox asynq: message has no UUID to use as the task id"))
	}
	headers := make(map[string]string, len(msg.Metadata))
	for k, v := range msg.Metadata {
		headers[k] = v
	}
	ctx := msg.Context()
	if ctx == nil {
		ctx = context.Background()
	}
	task := asynq.NewTaskWithHeaders(typ, msg.Payload, headers)
	_, err := p.client.EnqueueContext(ctx, task, append([]asynq.Option{asynq.TaskID(msg.UUID)}, p.opts...)...)
	switch {
	case err == nil:
		p.enqueued.Add(1)
		p.logger.Trace("outbox asynq: task enqueued", watermill.LogFields{"task_id": msg.UUID, "task_type": typ})
		return nil
	case errors.Is(err, asynq.ErrTaskIDConflict):
		p.conflicts.Add(1)
		p.logger.Debug("outbox asynq: task enqueued already (a redelivered event), counted as delivered", watermill.LogFields{"task_id": msg.UUID, "task_type": typ})
		return nil
	case errors.Is(err, asynq.ErrDuplicateTask) && p.unique:
		return p.duplicate(ctx, typ, msg)
	case unreachable(err), redisfail.UnavailableReply(err):
		// Redis not reached, or refusing every write (READONLY after a failover, OOM at
		// maxmemory with noeviction, LOADING …): the destination is unavailable, as for
		// forwarder/redisstream.
		return &outbox.UnavailableError{Destination: Destination, Err: fmt.Errorf("outbox asynq: enqueue: %w", err)}
	}
	return fmt.Errorf("outbox asynq: enqueue: %w", err)
}

// duplicate classifies asynq's answer that a task of msg's type and payload holds the
// uniqueness lock: the event's own task (a redelivery) is delivered; another task's is
// permanent. A lock that expired between the two answers is an ordinary failure (retried).
func (p *Publisher) duplicate(ctx context.Context, typ string, msg *message.Message) error {
	p.locksOnce.Do(func() {
		c, ok := p.cfg.Redis.MakeRedisClient().(redis.UniversalClient)
		if !ok {
			p.locksErr = fmt.Errorf("outbox asynq: %T makes no go-redis client", p.cfg.Redis)
		}
		p.locks = c
	})
	if p.locksErr != nil {
		return p.locksErr
	}
	holder, err := p.locks.Get(ctx, uniqueKey(p.cfg.Queue, typ, msg.Payload)).Result()
	switch {
	case errors.Is(err, redis.Nil):
		return fmt.Errorf("outbox asynq: enqueue: %w (the uniqueness lock expired before it was read; tried again later)", asynq.ErrDuplicateTask)
	case err != nil && (unreachable(err) || redisfail.UnavailableReply(err)):
		return &outbox.UnavailableError{Destination: Destination, Err: fmt.Errorf("outbox asynq: read uniqueness lock: %w", err)}
	case err != nil:
		return fmt.Errorf("outbox asynq: read uniqueness lock: %w", err)
	case holder == msg.UUID:
		p.conflicts.Add(1)
		p.logger.Debug("outbox asynq: task enqueued already (a redelivered event), counted as delivered", watermill.LogFields{"task_id": msg.UUID, "task_type": typ})
		return nil
	}
	return outbox.Permanent(fmt.Errorf("%w: task %s of type %q holds the lock", ErrUniqueHeld, holder, typ))
}

// uniqueKey is the Redis key of asynq's uniqueness lock for a task of queue, type and payload
// (asynq's internal/base.UniqueKey); its value is the id of the task that holds it.
func uniqueKey(queue, typ string, payload []byte) string {
	k := "asynq:{" + queue + "}:unique:" + typ + ":"
	if payload == nil {
		return k
	}
	sum := md5.Sum(payload)
	return k + hex.EncodeToString(sum[:])
}

// unreachable reports whether err says Redis could not be reached or dropped the connection.
func unreachable(err error) bool {
	var opErr *net.OpError
	return errors.As(err, &opErr) || errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET)
}

// Close closes the client when this package built it (Config.Redis); a Config.Client is left
// open. Later publishes fail with ErrClosed. Idempotent.
func (p *Publisher) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	if p.locks != nil {
		_ = p.locks.Close()
	}
	if p.own {
		if err := p.client.Close(); err != nil {
			return fmt.Errorf("outbox asynq: close client: %w", err)
		}
	}
	return nil
}
