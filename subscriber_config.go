package outbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"math"
	"os"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-outbox/outbox/internal/engine"
)

// Seed defaults of SubscriberConfig.
const (
	DefaultPollInterval    = 5 * time.Second
	DefaultBatchSize       = 100
	DefaultMaxAttempts     = 5
	DefaultRetryBase       = time.Second
	DefaultRetryMax        = 300 * time.Second
	DefaultLeaseDuration   = 60 * time.Second
	DefaultDeliveryTimeout = 30 * time.Second
	DefaultConcurrency     = 10
	// DefaultKeyScan is KeyScan's default: enough to reach keys behind blocked ones within a
	// few claims, small enough that the scan stays a minor part of a claim's cost (1,000 keys
	// per claim cost 15–20% of the drain rate in BenchmarkDrain).
	DefaultKeyScan = 100
	// DefaultUnavailableBackoff and DefaultUnavailableBackoffMax are the first and the
	// longest wait between probes of an unavailable destination.
	DefaultUnavailableBackoff    = 200 * time.Millisecond
	DefaultUnavailableBackoffMax = 30 * time.Second
	// DefaultMarkInterval is MarkInterval's default.
	DefaultMarkInterval = 100 * time.Millisecond
	// DefaultMaxDeliveryStarts is MaxDeliveryStarts' default.
	DefaultMaxDeliveryStarts = 5
	// maxRelayName bounds RelayName so that a fencing token (name#nonce#claim) fits
	// MariaDB/MySQL's leased_by VARCHAR(1024).
	maxRelayName = 512
	// MaxBatchSize is the largest BatchSize.
	MaxBatchSize = 10000
	// DefaultWakeProbeInterval is WakeProbeInterval's default.
	DefaultWakeProbeInterval = 5 * time.Millisecond
	// WakeProbeIdleFactor: after a second without writes the wake probe runs every
	// WakeProbeIdleFactor × WakeProbeInterval (50ms by default) until the next write.
	WakeProbeIdleFactor = engine.WakeProbeIdleFactor
)

// SubscriberConfig configures a Subscriber. The zero value is valid: a zero field means the
// default its comment gives; negative and out-of-range values are configuration errors
// (*ConfigError from Validate and NewSubscriber), never clamped.
type SubscriberConfig struct {
	// The zero value is valid: each zero field means the default given in its comment.
	// Negative and out-of-range values are configuration errors, never clamped.
	//
	// Schema names the outbox table; it must match the table's Migrate config.
	Schema SchemaConfig
	// PollInterval is how long a subscription waits before polling again after a poll that
	// found nothing (a wakeup signal cuts the wait short). Default 5s. Below 100 ms, the wait
	// doubles (up to 100 ms) after each poll in a row that found claimable keyed events only
	// of keys another relay holds.
	PollInterval time.Duration
	// BatchSize is how many events one claim leases, 1..10000. Default 100.
	BatchSize int
	// MaxRunPerKey caps how many consecutive events of one ordering key one batch may hold
	// (a key's events are delivered one after another, in order). 1..BatchSize; default
	// BatchSize/10, at least 1. It trades the throughput of hot keys against fairness: a
	// larger cap lets a few keys that carry most of the events drain faster, since each
	// claim takes more of each key's backlog; a smaller cap spreads every batch over more
	// keys, so events of quiet keys wait less behind busy ones and more keys are delivered
	// concurrently (up to Concurrency). Relays sharing a table still share hot keys: a key
	// is not kept by one relay for good.
	MaxRunPerKey int
	// KeyScan caps how many ordering keys one claim inspects for their head event (a bounded
	// skip scan that resumes after the last key it reached, so every key is looked at within
	// keys/KeyScan claims however many keys are blocked). 1..100000; default DefaultKeyScan
	// (100).
	KeyScan int
	// MaxAttempts is the number of failed deliveries after which an event is dead-lettered.
	// Default 5; at least 1.
	MaxAttempts int
	// RetryBase and RetryMax shape the backoff: a failed event is tried again after
	// min(RetryBase·2^(attempts−1), RetryMax) with ±10% jitter. RetryBase defaults to 1s;
	// RetryMax defaults to max(300s, RetryBase) and, when set, must be ≥ RetryBase.
	RetryBase time.Duration
	RetryMax  time.Duration
	// LeaseDuration is how long a claim leases its events; the lease is renewed three times
	// per LeaseDuration from the claim until the batch's delivery ends (a batch claimed while
	// the previous one is out keeps its lease while it waits). Default 60s; at least 1s.
	LeaseDuration time.Duration
	// DeliveryTimeout is how long an emitted message may stay neither acked nor nacked before
	// it counts as failed (ErrDeliveryTimeout). Default min(30s, LeaseDuration/2); must be
	// below LeaseDuration.
	DeliveryTimeout time.Duration
	// CloseTimeout is how long a stopping subscription (Close, or the end of the context given
	// to Subscribe — as a Watermill Router's Close does) waits for the messages it has out to
	// be answered: it emits nothing new, their contexts stay live, and their Acks and Nacks
	// are recorded as usual. What is still unanswered then is released (lease cleared,
	// attempts unchanged) and its message contexts are canceled; a Nack caused by that
	// cancellation (context.Canceled) counts no attempt either. A claim statement running at
	// the stop is let finish (for up to 5 s) so that the events it leased are released too,
	// instead of waiting for their lease. Default DeliveryTimeout; must not be negative or
	// above DeliveryTimeout.
	CloseTimeout time.Duration
	// Concurrency is how many messages one subscription has out (emitted, not yet acked or
	// nacked) at once. Default 10.
	Concurrency int
	// RelayName identifies this relay in leased_by. The fencing token written there is
	// RelayName, a random nonce of this Subscriber and a claim number, so it stays unique even
	// when processes share a name. Default "host:pid:random". At most 512 bytes of valid
	// UTF-8 without NUL (a *ConfigError otherwise).
	//
	// Give a relay a stable name (a StatefulSet pod's name, a systemd unit's) to have its
	// restart resume at once: each Subscribe of a Subscriber with an explicit RelayName first
	// releases the unexpired leases of earlier Subscribers of that name — a predecessor that
	// was killed — instead of waiting up to LeaseDuration for them. A name must therefore be
	// unique among live relays; two live relays sharing one stay safe (the fencing token
	// refuses the first one's marks, so nothing is lost or recorded out of order), but events
	// taken back from a relay that is still delivering them are delivered twice, and a key's
	// events may then reach the destination interleaved.
	RelayName string
	// ExcludeTopics are topic patterns (exact, "prefix*", "*") never delivered by this
	// subscriber, so relays of different topics share one table. Order is per ordering key
	// across topics: a key whose oldest undelivered event is on a topic this subscriber does
	// not serve is held until another relay delivers that event, so topics that share keys
	// belong to the same relay.
	ExcludeTopics []string
	// Hooks observe deliveries; nil fields are skipped. See Hooks.
	Hooks Hooks
	// SyncCommit makes the relay's own statements (claims, lease renewals, marks) wait for
	// PostgreSQL's WAL flush like ordinary commits. Default false: over a *pgxpool.Pool or a
	// pgx stdlib *sql.DB (also inside a watermill-sql Beginner) each runs in a transaction of
	// its own with SET LOCAL synchronous_commit = off (PostgreSQL docs, "Asynchronous
	// Commit"; other handles, SQLite and MariaDB/MySQL always commit synchronously). That
	// saves a flush per claim and per mark; a server crash can then forget the last few
	// hundred milliseconds of leases and marks, which only makes those events be delivered
	// again (at least once) — events and their order are never lost, and writers'
	// transactions are not affected.
	SyncCommit bool
	// Wakeup, when set, lets a subscription poll as soon as events of its topics are
	// committed instead of waiting for PollInterval (see package wakeup). Polling stays the
	// safety net: a lost signal only delays delivery until the next poll.
	Wakeup Wakeup
	// UnavailableBackoff and UnavailableBackoffMax shape how an unavailable destination is
	// probed (a delivery error matching ErrUnavailable, see UnavailableError): such an event
	// is released with no attempt counted, the subscription stops claiming the topics whose
	// events that destination refused, and it delivers one event of them (a probe) after
	// UnavailableBackoff, then every 1/32 of the outage's age, at least UnavailableBackoff and
	// at most UnavailableBackoffMax, while the destination stays unavailable (or after the
	// error's RetryAfter when that is longer, but never more than UnavailableBackoffMax, so a
	// destination's hint cannot pause its topics for longer): a destination back after 30 s
	// is probed within about 1 s, one down for hours every UnavailableBackoffMax. The first
	// probe that gets any other answer ends the outage: those topics are claimed at full rate
	// again.
	// The outage is logged once at WARN when it starts and once at INFO when it ends.
	// An outage whose topics have no event left to probe (three probes in a row claim nothing
	// and none of its events was refused for UnavailableBackoffMax) is closed as well. A
	// subscription tracks at most 256 destinations in an outage by name; further ones share
	// one outage named "other" (their topics are paused and probed the same way, and the
	// first answer other than unavailable to its probe ends it).
	// Defaults 200ms and 30s; UnavailableBackoffMax must not be below UnavailableBackoff.
	UnavailableBackoff    time.Duration
	UnavailableBackoffMax time.Duration
	// Destination, when set, names the destination each event's message is bound for (a
	// webhook host, a route: what an operator would call one destination; see
	// webhook.Publisher.Destination), for Subscribe's per-message delivery (SubscribeBatches
	// hands a batch to one destination and ignores it). It is called just before the message
	// is emitted, from the delivery goroutines; "" names none (the topic-wide behaviour below).
	// With it, outages and flow control are per destination:
	//   - an unavailable answer opens an outage of the named destination; while it lasts the
	//     events bound for it are held — not emitted, released with no attempt and no
	//     delivery start counted, due again at the outage's next probe (the waits above) —
	//     and their ordering keys wait behind them, while the topic's events bound for other
	//     destinations keep flowing; one event per probe wait goes out as the probe, and the
	//     destination's first other answer ends the outage. A topic is paused as above only
	//     when a batch had none of its events answered by another destination (a topic with
	//     one destination);
	//   - DestinationLimits apply.
	// Held events show last_error_class "held" and a last_error saying why.
	Destination func(topic string, msg *message.Message) string
	// DestinationLimits is the flow control of the destinations Destination names, by name
	// (exact match; requires Destination). A destination over its Rate has its further events
	// held until its tokens allow them (spread 1/Rate apart), so it never delays another
	// destination; one at its MaxInFlight makes its key's next event wait for one of its
	// deliveries of the same batch to end (held for UnavailableBackoff when the slots are taken
	// by other subscriptions of this Subscriber). Limits hold per Subscriber (per relay
	// process); relays sharing a destination each apply them. Nil: no limits.
	DestinationLimits map[string]DestinationLimit
	// UnavailableDeadLetterAfter bounds an outage: once a destination has been unavailable
	// for this long without a break, each of its events that is refused as unavailable is
	// dead-lettered at once (last_error says why) and its topics are claimed at full rate, so
	// a destination that never comes back does not hold a backlog forever; such an outage
	// ends at the first other answer of one of its topics, or once none of its events was
	// refused for UnavailableDeadLetterAfter again. Zero (the default) never dead-letters for
	// unavailability.
	UnavailableDeadLetterAfter time.Duration
	// MarkInterval is how often the acks of a batch that is still out are written: a relay
	// that is killed repeats at most the deliveries acked since the last write (plus those in
	// flight). A batch delivered within MarkInterval writes its marks once, at its end. Each
	// write is one statement. Default 100ms; at least 1ms. On SQLite (one writer) a
	// batch's acks are written at its end.
	MarkInterval time.Duration
	// MaxDeliveryStarts detects poison events: an event whose delivery was started this many
	// times in a row without any outcome being recorded (no ack, no failure: the relay was
	// killed, crashed or lost its lease while delivering it each time, or the destination
	// answered NotAttempted each time, e.g. the event made it drop its connection) is
	// dead-lettered at its next claim with ErrPoisonEvent instead of being delivered again. A
	// relay that stops gracefully does not count the deliveries it leaves unanswered, nor those
	// cut short by the stop. Default 5; at least 1.
	//
	// Only the event that kills the relay is dead-lettered, not the events that were out with
	// it: an event's last allowed start (its MaxDeliveryStarts-th) is made alone — a batch that
	// holds such a suspect delivers that one event, and the others are released with their
	// start taken back and go out in later batches — so the death that ends it counts against
	// the event that causes it. The deaths before charge every event that was out. One INFO
	// line marks the start and the end of such an isolation. With 1 every event out at a
	// death is charged.
	MaxDeliveryStarts int
	// WakeProbeInterval is how often a PostgreSQL Subscriber probes the table's identity
	// sequence (behind "sequence"), to claim within about one interval of a commit — by any
	// writer, in any process, with no signal from it — instead of waiting for PollInterval.
	// A probe is one statement that reads no table rows, so its cost does not grow with the
	// backlog, dead row versions or a snapshot held open elsewhere. A sequence value is taken
	// before its writer commits, so when the sequence moves the probe also watches the
	// transactions then in progress (the snapshot and the backends' transaction ids) and the
	// relay claims again as each of them ends; otherwise a probe claims nothing. After a second
	// without writes the probe runs every WakeProbeIdleFactor intervals (50ms by default) until
	// the next write: each probe wakes a database backend, which costs it CPU whatever the
	// statement, and an idle relay's probes cost the database under 1% of one core that way.
	// It works through a transaction pooler (PgBouncer in transaction mode). Writes served
	// from a sequence cache above 1 do not move it (the schema's sequence has CACHE 1; a larger
	// cache is logged at start). RetryDeadLettered and PurgeDeadLettered advance the sequence
	// by one, so that probing relays act on them at once. One probe runs per Subscriber while
	// it has subscriptions (a MultiSubscriber: one per table, each costing an idle database as
	// much). Default 5ms; at least 1ms. Setting it for SQLite or MariaDB/MySQL
	// is a configuration error (no probe there).
	WakeProbeInterval time.Duration
	// DisableWakeProbe turns the wake probe off: the relay then learns of new events only
	// through Wakeup or at each PollInterval. Setting it with WakeProbeInterval is a
	// configuration error.
	DisableWakeProbe bool

	takeBack bool // RelayName was set explicitly (see setDefaults)
}

// Wakeup is the relay side of a wakeup (package wakeup implements it): Listen returns a channel
// that receives a value whenever events of a topic that accept accepts may have been committed,
// and is closed when ctx ends. Implementations must be safe for concurrent use.
type Wakeup interface {
	Listen(ctx context.Context, accept func(topic string) bool) <-chan struct{}
}

// Hooks observe the relay. Each function is called synchronously from the subscription's
// goroutine after the marks are written (no database connection is held meanwhile), so it
// must be fast and safe for concurrent use, and must not call the Subscriber's Close.
type Hooks struct {
	// OnDelivered is called for each event marked published.
	OnDelivered func(DeliveredInfo)
	// OnFailed is called for each failed delivery that will be retried.
	OnFailed func(FailedInfo)
	// OnDeadLettered is called for each event dead-lettered.
	OnDeadLettered func(FailedInfo)
	// OnUnavailable is called for each event released because its destination was
	// unavailable (no attempt counted; FailedInfo.Attempts is the unchanged count).
	OnUnavailable func(FailedInfo)
	// OnOutage is called when a subscription starts treating a destination as unavailable
	// (Outage.Since set, Ended zero) and when it ends (Ended set): the destination's state.
	OnOutage func(OutageInfo)
	// OnLeaseLost is called once per batch (or flush of a batch's acks) whose lease had
	// passed to another relay, with the number of events whose marks the fencing refused or
	// whose renewal found them taken over.
	OnLeaseLost func(LeaseLostInfo)
	// OnClaim is called after each claim statement that succeeded, with the events it leased
	// (0 for an empty claim) and its duration; OnMark after each mark statement (including the
	// flushes of acks while a batch is out), with its duration and error.
	OnClaim func(ClaimInfo)
	OnMark  func(MarkInfo)
	// OnHeld is called for each event held back for its destination (see
	// SubscriberConfig.Destination): not emitted, no attempt counted.
	OnHeld func(HeldInfo)
}

// HeldInfo describes an event held back for its destination (SubscriberConfig.Destination).
type HeldInfo struct {
	// EventID, Topic and Destination name the event and where it is bound.
	EventID, Topic, Destination string
	// Reason is HeldOutage, HeldRate or HeldInFlight.
	Reason string
	// Until is when it is due again (database clock where the dialect has one).
	Until time.Time
}

// The reasons of HeldInfo: the destination is in an outage, over its DestinationLimit.Rate, or
// at its DestinationLimit.MaxInFlight.
const (
	HeldOutage   = engine.HeldOutage
	HeldRate     = engine.HeldRate
	HeldInFlight = engine.HeldInFlight
)

// OutageInfo describes a destination's outage as a subscription sees it (see
// SubscriberConfig.UnavailableBackoff).
type OutageInfo struct {
	// Destination is UnavailableError.Destination ("" when unnamed); Topics the topics paused.
	Destination string
	Topics      []string
	// Since is when it started; Ended is zero while it lasts, and when it ended (relay clock).
	Since, Ended time.Time
	// Released counts the events released as unavailable during the outage.
	Released int
	// Err is the last refusal's error.
	Err error
}

// LeaseLostInfo describes a batch whose lease another relay took over.
type LeaseLostInfo struct {
	// Token is the batch's fencing token; Events how many of its events were taken over.
	Token  string
	Events int
}

// ClaimInfo describes one claim statement.
type ClaimInfo struct {
	Events   int
	Duration time.Duration
	// Probe is true for a claim of one event of an unavailable destination's topics.
	Probe bool
}

// MarkInfo describes one mark statement: Events is how many events it was given.
type MarkInfo struct {
	Events   int
	Duration time.Duration
	Err      error
}

// DeliveredInfo describes a delivered event.
type DeliveredInfo struct {
	EventID string
	Topic   string
	// Attempts is the number of deliveries it took, 1 for the first.
	Attempts int
	// Delay is the time from created_at to the mark, both read from the database clock.
	Delay time.Duration
}

// FailedInfo describes a failed delivery.
type FailedInfo struct {
	EventID string
	Topic   string
	// Attempts counts failed deliveries so far, this one included.
	Attempts int
	Err      error
	// NextAttemptAt is when it is tried again (database clock); zero when dead-lettered.
	NextAttemptAt time.Time
	// At is when the failure was recorded (database clock).
	At time.Time
}

func (c *SubscriberConfig) setDefaults() {
	if c.PollInterval == 0 {
		c.PollInterval = DefaultPollInterval
	}
	if c.BatchSize == 0 {
		c.BatchSize = DefaultBatchSize
	}
	if c.MaxRunPerKey == 0 {
		c.MaxRunPerKey = max(1, c.BatchSize/10)
	}
	if c.KeyScan == 0 {
		c.KeyScan = DefaultKeyScan
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = DefaultMaxAttempts
	}
	if c.RetryBase == 0 {
		c.RetryBase = DefaultRetryBase
	}
	if c.RetryMax == 0 {
		c.RetryMax = max(DefaultRetryMax, c.RetryBase)
	}
	if c.LeaseDuration == 0 {
		c.LeaseDuration = DefaultLeaseDuration
	}
	if c.DeliveryTimeout == 0 {
		c.DeliveryTimeout = min(DefaultDeliveryTimeout, c.LeaseDuration/2)
	}
	if c.CloseTimeout == 0 {
		c.CloseTimeout = c.DeliveryTimeout
	}
	if c.Concurrency == 0 {
		c.Concurrency = DefaultConcurrency
	}
	if c.UnavailableBackoff == 0 {
		c.UnavailableBackoff = DefaultUnavailableBackoff
	}
	if c.UnavailableBackoffMax == 0 {
		c.UnavailableBackoffMax = max(DefaultUnavailableBackoffMax, c.UnavailableBackoff)
	}
	if c.MarkInterval == 0 {
		c.MarkInterval = DefaultMarkInterval
	}
	if c.MaxDeliveryStarts == 0 {
		c.MaxDeliveryStarts = DefaultMaxDeliveryStarts
	}
	if c.WakeProbeInterval == 0 && !c.DisableWakeProbe && c.Schema.Dialect == DialectPostgreSQL {
		c.WakeProbeInterval = DefaultWakeProbeInterval
	}
	c.takeBack = c.RelayName != ""
	if c.RelayName == "" {
		host, _ := os.Hostname()
		var b [4]byte
		_, _ = rand.Read(b[:])
		c.RelayName = fmt.Sprintf("%s:%d:%s", host, os.Getpid(), hex.EncodeToString(b[:]))
	}
}

// Validate returns a *ConfigError naming the first invalid field, or nil. It applies the
// defaults to a copy first, so a zero field is valid.
func (c SubscriberConfig) Validate() error {
	c.setDefaults()
	bad := func(field, reason string) error {
		return &ConfigError{Field: "SubscriberConfig." + field, Reason: reason}
	}
	switch {
	case c.PollInterval < 0:
		return bad("PollInterval", "must not be negative")
	case c.BatchSize < 1 || c.BatchSize > MaxBatchSize:
		return bad("BatchSize", fmt.Sprintf("%d outside 1..%d", c.BatchSize, MaxBatchSize))
	case c.MaxRunPerKey < 1 || c.MaxRunPerKey > c.BatchSize:
		return bad("MaxRunPerKey", fmt.Sprintf("%d outside 1..BatchSize (%d)", c.MaxRunPerKey, c.BatchSize))
	case c.KeyScan < 1 || c.KeyScan > 100000:
		return bad("KeyScan", fmt.Sprintf("%d outside 1..100000", c.KeyScan))
	case c.MaxAttempts < 1:
		return bad("MaxAttempts", "must be at least 1")
	case c.RetryBase < 0:
		return bad("RetryBase", "must not be negative")
	case c.RetryMax < c.RetryBase:
		return bad("RetryMax", "must not be below RetryBase")
	case c.LeaseDuration < time.Second:
		return bad("LeaseDuration", "must be at least 1s")
	case c.DeliveryTimeout <= 0:
		return bad("DeliveryTimeout", "must be positive")
	case c.DeliveryTimeout >= c.LeaseDuration:
		return bad("DeliveryTimeout", fmt.Sprintf("%s must be below LeaseDuration (%s)", c.DeliveryTimeout, c.LeaseDuration))
	case c.CloseTimeout < 0:
		return bad("CloseTimeout", "must not be negative")
	case c.CloseTimeout > c.DeliveryTimeout:
		return bad("CloseTimeout", fmt.Sprintf("%s must not be above DeliveryTimeout (%s)", c.CloseTimeout, c.DeliveryTimeout))
	case c.Concurrency < 1:
		return bad("Concurrency", "must be at least 1")
	case c.UnavailableBackoff < 0:
		return bad("UnavailableBackoff", "must not be negative")
	case c.UnavailableBackoffMax < c.UnavailableBackoff:
		return bad("UnavailableBackoffMax", "must not be below UnavailableBackoff")
	case c.UnavailableDeadLetterAfter < 0:
		return bad("UnavailableDeadLetterAfter", "must not be negative")
	case c.MarkInterval < time.Millisecond:
		return bad("MarkInterval", "must be at least 1ms")
	case c.MaxDeliveryStarts < 1:
		return bad("MaxDeliveryStarts", "must be at least 1")
	case !utf8.ValidString(c.RelayName) || strings.ContainsRune(c.RelayName, 0):
		return bad("RelayName", "must be valid UTF-8 without NUL (leased_by is text)")
	case len(c.RelayName) > maxRelayName:
		return bad("RelayName", fmt.Sprintf("longer than %d bytes", maxRelayName))
	case c.WakeProbeInterval < 0:
		return bad("WakeProbeInterval", "must not be negative")
	case c.DisableWakeProbe && c.WakeProbeInterval != 0:
		return bad("WakeProbeInterval", "set with DisableWakeProbe: choose one")
	case c.WakeProbeInterval != 0 && c.WakeProbeInterval < time.Millisecond:
		return bad("WakeProbeInterval", "must be at least 1ms")
	case c.WakeProbeInterval != 0 && c.Schema.Dialect != DialectPostgreSQL:
		return bad("WakeProbeInterval", "the wake probe is PostgreSQL-only")
	}
	if len(c.DestinationLimits) > 0 && c.Destination == nil {
		return bad("DestinationLimits", "set without Destination, which names the destinations they apply to")
	}
	for name, l := range c.DestinationLimits {
		field := fmt.Sprintf("DestinationLimits[%q]", name)
		switch {
		case name == "":
			return bad(field, "the empty name is no destination (Destination returns it for none)")
		case l.Rate < 0 || math.IsNaN(l.Rate) || math.IsInf(l.Rate, 0):
			return bad(field+".Rate", "must be a finite number of events per second, at least 0")
		case l.Burst < 0:
			return bad(field+".Burst", "must not be negative")
		case l.Burst > 0 && l.Rate == 0:
			return bad(field+".Burst", "set without Rate")
		case l.MaxInFlight < 0:
			return bad(field+".MaxInFlight", "must not be negative")
		}
	}
	for i, p := range c.ExcludeTopics {
		if _, err := parseTopicPattern(fmt.Sprintf("SubscriberConfig.ExcludeTopics[%d]", i), p); err != nil {
			return err
		}
	}
	return c.Schema.Validate()
}

// DestinationLimit is one destination's flow control (SubscriberConfig.DestinationLimits); the
// zero value limits nothing.
type DestinationLimit struct {
	// Rate is the most events per second emitted to the destination (0: unlimited), with
	// Burst more at once after a quiet time (0: Rate/10, at least 1).
	Rate  float64
	Burst int
	// MaxInFlight is the most of its events out at once over the Subscriber's subscriptions
	// (0: unlimited; Concurrency still bounds each subscription).
	MaxInFlight int
}
