package wal

import (
	"errors"
	"fmt"
	"regexp"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/capture"
)

// Defaults of Config's zero fields.
const (
	DefaultSlot           = "outbox_wal"
	DefaultPublication    = "outbox_wal"
	DefaultBatchSize      = 1000
	DefaultConcurrency    = 8
	DefaultMaxAttempts    = 5
	DefaultRetryBackoff   = 100 * time.Millisecond
	DefaultMaxBackoff     = 5 * time.Second
	DefaultStatusInterval = time.Second
	DefaultHeartbeat      = 10 * time.Second
	// DefaultDeliveryTimeout is Config.DeliveryTimeout's default, the polling relay's too.
	DefaultDeliveryTimeout = 30 * time.Second
)

// Config configures a Source and the Setup of its slot and publication. The zero value of
// every field but Tables and Destination is the default.
type Config struct {
	// Tables are the captured tables, declared as for the trigger path (capture.Table). The
	// WAL source honours Name, Operations, Payload, Fields, Exclude, Topic, OrderingKey,
	// Unordered, Key, EmitUnchanged and Truncate (TruncateCapture writes a "truncated" event;
	// the other modes let TRUNCATE pass without one: the log cannot refuse a write). Extend,
	// OrderingKeySQL and LockOrderingKey need the writer's transaction and are refused with a
	// *outbox.ConfigError (ErrUnsupported).
	Tables []capture.Table
	// Slot is the logical replication slot (pgoutput). Default DefaultSlot.
	Slot string
	// Publication is the publication of the captured tables. Default DefaultPublication.
	Publication string
	// Schema names the outbox table where failed changes are parked (it must match the
	// table's Migrate config). The zero value is the default table.
	Schema outbox.SchemaConfig
	// Destination receives every change as a Watermill message (a forwarder, a Kafka
	// publisher…). Required. It must be safe for concurrent use: up to Concurrency calls run
	// at once, never two for one ordering key. A forwarder.BatchPublisher (forwarder/kafka,
	// forwarder/amqp…) gets each batch in one PublishBatch call first; the changes it does not
	// acknowledge, from each key's first failure on, then take the one-message path with its
	// MaxAttempts.
	Destination message.Publisher
	// BatchSize caps the changes delivered between two confirmations of the slot's position.
	// Default DefaultBatchSize.
	BatchSize int
	// Concurrency is the number of ordering keys delivered at once. Default
	// DefaultConcurrency.
	Concurrency int
	// MaxAttempts is the number of Publish calls a change gets before it is parked in the
	// outbox table. Default DefaultMaxAttempts.
	MaxAttempts int
	// RetryBackoff is the wait after the first failed Publish, doubled after each further
	// failure up to MaxBackoff. Defaults DefaultRetryBackoff and DefaultMaxBackoff.
	RetryBackoff, MaxBackoff time.Duration
	// DeliveryTimeout bounds each Publish (and PublishBatch) call: the message's context (the
	// batch call's context) ends after it, so a destination that honours it — forwarder/kafka,
	// forwarder/amqp, webhook, any client call made with the message's context — returns,
	// and the call counts as a failed attempt. A destination that ignores the context still
	// holds its key's lane, and the slot's confirmed position, until it returns. Default
	// DefaultDeliveryTimeout.
	DeliveryTimeout time.Duration
	// StatusInterval is the period of the standby status updates (the confirmed position) and
	// of the slot statistics query. Default DefaultStatusInterval.
	StatusInterval time.Duration
	// Heartbeat is the period of pg_logical_emit_message calls that move the slot while the
	// captured tables are idle. Default DefaultHeartbeat; negative disables them (keepalive
	// positions are still confirmed).
	Heartbeat time.Duration
	// MaxRetainedWAL bounds the WAL the slot retains, in bytes (pg_current_wal_lsn() -
	// restart_lsn). Above it the source logs an error and parks every change in the outbox
	// table without trying the destination, so the slot's position follows the log at the
	// speed of local inserts, until the retained WAL is back under three quarters of the
	// bound. Zero: no bound. It cannot act while no source runs: set PostgreSQL's
	// max_slot_wal_keep_size as the server's last resort.
	MaxRetainedWAL int64
	// Logger receives the source's log lines. Default watermill.NopLogger.
	Logger watermill.LoggerAdapter
}

// ErrUnsupported is the Err of the *outbox.ConfigError refusing a Table option the WAL source
// cannot honour.
var ErrUnsupported = errors.New("wal: option not supported by the WAL source")

var nameRe = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// withDefaults returns c with defaults filled.
func (c Config) withDefaults() Config {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	defD := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	if c.Slot == "" {
		c.Slot = DefaultSlot
	}
	if c.Publication == "" {
		c.Publication = DefaultPublication
	}
	def(&c.BatchSize, DefaultBatchSize)
	def(&c.Concurrency, DefaultConcurrency)
	def(&c.MaxAttempts, DefaultMaxAttempts)
	defD(&c.RetryBackoff, DefaultRetryBackoff)
	defD(&c.MaxBackoff, DefaultMaxBackoff)
	defD(&c.DeliveryTimeout, DefaultDeliveryTimeout)
	defD(&c.StatusInterval, DefaultStatusInterval)
	defD(&c.Heartbeat, DefaultHeartbeat)
	if c.Logger == nil {
		c.Logger = watermill.NopLogger{}
	}
	return c
}

// Validate returns a *outbox.ConfigError naming the first invalid field, or nil. Destination
// is checked by New only (Setup, SetupSQL and Drop do not need it).
func (c Config) Validate() error {
	_, err := c.names()
	return err
}

// names validates c and checks its tables.
func (c Config) names() ([]*capture.Names, error) {
	if len(c.Tables) == 0 {
		return nil, &outbox.ConfigError{Field: "wal.Config.Tables", Reason: "no table"}
	}
	if err := c.check(); err != nil {
		return nil, err
	}
	out := make([]*capture.Names, len(c.Tables))
	for i, t := range c.Tables {
		field := func(f string) string { return fmt.Sprintf("wal.Config.Tables[%d].%s", i, f) }
		switch {
		case len(t.Extend.Payload)+len(t.Extend.Headers)+len(t.Extend.Columns) > 0:
			return nil, &outbox.ConfigError{Field: field("Extend"), Reason: "SQL extensions run in the writer's transaction: the WAL source has none", Err: ErrUnsupported}
		case t.OrderingKeySQL != "":
			return nil, &outbox.ConfigError{Field: field("OrderingKeySQL"), Reason: "SQL runs in the writer's transaction: the WAL source has none", Err: ErrUnsupported}
		case t.LockOrderingKey:
			return nil, &outbox.ConfigError{Field: field("LockOrderingKey"), Reason: "the WAL source delivers in commit order without locks", Err: ErrUnsupported}
		}
		n, err := capture.CheckTable(i, t)
		if err != nil {
			return nil, err
		}
		out[i] = n
	}
	return out, nil
}

// check validates c's fields other than Tables and Destination.
func (c Config) check() error {
	c = c.withDefaults()
	for field, v := range map[string]string{"Slot": c.Slot, "Publication": c.Publication} {
		if !nameRe.MatchString(v) {
			return &outbox.ConfigError{Field: "wal.Config." + field, Reason: fmt.Sprintf("%q: want lower-case letters, digits and _, at most 63", v)}
		}
	}
	for field, v := range map[string]int{"BatchSize": c.BatchSize, "Concurrency": c.Concurrency, "MaxAttempts": c.MaxAttempts} {
		if v < 0 {
			return &outbox.ConfigError{Field: "wal.Config." + field, Reason: "must not be negative"}
		}
	}
	for field, v := range map[string]time.Duration{"RetryBackoff": c.RetryBackoff, "MaxBackoff": c.MaxBackoff, "StatusInterval": c.StatusInterval, "DeliveryTimeout": c.DeliveryTimeout} {
		if v < 0 {
			return &outbox.ConfigError{Field: "wal.Config." + field, Reason: "must not be negative"}
		}
	}
	if c.MaxRetainedWAL < 0 {
		return &outbox.ConfigError{Field: "wal.Config.MaxRetainedWAL", Reason: "must not be negative"}
	}
	return c.Schema.Validate()
}
