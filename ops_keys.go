package outbox

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/watermill-outbox/outbox/internal/dialect"
)

// SkippedKeyHeader is the header in which SkipKeyHead keeps the ordering key of the event it
// took out of its key's order (the event's ordering_key is then NULL). A DeadLetterFilter with
// Key finds such events too.
const SkippedKeyHeader = dialect.SkippedKeyHeader

// MaxBlockedKeys is the largest limit BlockedKeys takes.
const MaxBlockedKeys = 1000

// MaxHeldCount is where BlockedKey.Held stops counting.
const MaxHeldCount = dialect.HeldCountLimit

// BlockedKey is an ordering key held behind its head: the key's lowest-sequence unpublished
// event failed (it waits for its next attempt) or is dead-lettered, and later pending events of
// the key wait for it.
type BlockedKey struct {
	// Key is the ordering key.
	Key string
	// Head is the key's head: Sequence, ID, Topic, CreatedAt, Attempts and LastError are set
	// (Payload and Headers are not read).
	Head Event
	// NextAttemptAt is when the head is tried again (zero when it is dead-lettered).
	NextAttemptAt time.Time
	// DeadLetteredAt is when the head was dead-lettered (zero when it is retrying).
	DeadLetteredAt time.Time
	// Held counts the key's pending events after the head, up to MaxHeldCount: a key that
	// holds more shows MaxHeldCount (the count stops there, so that listing keys costs
	// O(limit × MaxHeldCount) at worst, whatever the backlog).
	Held int64
	// Now is the database clock when the list was read.
	Now time.Time
}

// Dead reports whether the head is dead-lettered.
func (b BlockedKey) Dead() bool { return !b.DeadLetteredAt.IsZero() }

// KeyHead names a key's head for RetryKeyHead, SkipKeyHead and PurgeKeyHead: the action
// applies only while event Sequence is still Key's failed or dead-lettered head.
type KeyHead struct {
	Key      string
	Sequence int64
}

// operator returns the table's dialect as a dialect.Operator (PostgreSQL, SQLite and
// MariaDB/MySQL all are), or a *NotSupportedError for op.
func (s *Subscriber) operator(op string) (dialect.Operator, error) {
	if o, ok := s.s.d.(dialect.Operator); ok {
		return o, nil
	}
	return nil, &NotSupportedError{Op: op, Database: s.s.caps.Title}
}

// BlockedKeys returns up to limit (1..MaxBlockedKeys) ordering keys that are held behind a
// failed or dead-lettered head and hold later pending events, oldest head first. Its cost
// grows with live work, not with the table's history: on PostgreSQL with the failed and
// dead-lettered keyed events, on SQLite and MariaDB/MySQL with the keys that have unpublished
// events (one read of the key index each); and with the held events of the keys it returns.
// Errors: a *ConfigError for a limit out of range, or the database error. Safe for concurrent
// use, also after Close.
func (s *Subscriber) BlockedKeys(ctx context.Context, limit int) ([]BlockedKey, error) {
	if limit < 1 || limit > MaxBlockedKeys {
		return nil, &ConfigError{Field: "limit", Reason: fmt.Sprintf("%d outside 1..%d", limit, MaxBlockedKeys)}
	}
	o, err := s.operator("BlockedKeys")
	if err != nil {
		return nil, err
	}
	rows, err := o.BlockedKeys(ctx, s.db, s.s.t, limit)
	if err != nil {
		return nil, fmt.Errorf("outbox: blocked keys of %s: %w", s.s.table, err)
	}
	out := make([]BlockedKey, 0, len(rows))
	for _, r := range rows {
		b := BlockedKey{Key: r.Key, NextAttemptAt: r.NextAttemptAt, DeadLetteredAt: r.DeadLetteredAt, Held: r.Held, Now: r.Now,
			Head: Event{Sequence: r.Sequence, Topic: r.Topic, OrderingKey: r.Key, CreatedAt: r.CreatedAt, Attempts: r.Attempts, LastError: deref(r.LastError)}}
		b.Head.ID, _ = uuid.Parse(r.ID)
		out = append(out, b)
	}
	return out, nil
}

// RetryKeyHead makes the key's failed head due now (it keeps its attempts), or gives a
// dead-lettered head fresh attempts as RetryDeadLettered does. Errors: ErrHeadMoved when h is
// no longer the key's failed head or is in flight, a *ConfigError for an empty key, or the
// database error. Safe for concurrent use, also after Close.
func (s *Subscriber) RetryKeyHead(ctx context.Context, h KeyHead) error {
	return s.actOnHead(ctx, "RetryKeyHead", h, dialect.HeadRetry)
}

// SkipKeyHead dead-letters the key's failed head (a dead-lettered head stays one) and takes it
// out of its key's order, so that the key's later events are delivered, in order: the event's
// ordering key is cleared and kept in its header SkippedKeyHeader (RetryDeadLettered then
// delivers it as an unordered event). Errors as RetryKeyHead.
func (s *Subscriber) SkipKeyHead(ctx context.Context, h KeyHead) error {
	return s.actOnHead(ctx, "SkipKeyHead", h, dialect.HeadSkip)
}

// PurgeKeyHead deletes the key's failed or dead-lettered head, so that the key's later events
// are delivered. Errors as RetryKeyHead.
func (s *Subscriber) PurgeKeyHead(ctx context.Context, h KeyHead) error {
	return s.actOnHead(ctx, "PurgeKeyHead", h, dialect.HeadPurge)
}

func (s *Subscriber) actOnHead(ctx context.Context, op string, h KeyHead, a dialect.HeadAction) error {
	if h.Key == "" {
		return &ConfigError{Field: "KeyHead.Key", Reason: "must not be empty"}
	}
	o, err := s.operator(op)
	if err != nil {
		return err
	}
	n, err := o.ActOnHead(ctx, s.db, s.s.t, h.Key, h.Sequence, a)
	if err != nil {
		return fmt.Errorf("outbox: %s of key %q in %s: %w", op, h.Key, s.s.table, err)
	}
	if n == 0 {
		return ErrHeadMoved
	}
	s.relay.Announce(ctx)
	return nil
}

// MinuteStats is one minute of DeliveryStats.
type MinuteStats struct {
	// Minute is the minute's start (database clock).
	Minute time.Time
	// Delivered counts the events published in the minute.
	Delivered int64
	// MeanDelay, P95Delay and MaxDelay are the commit → delivery delay (published_at -
	// created_at) of those events.
	MeanDelay, P95Delay, MaxDelay time.Duration
}

// DeliveryStats is the delivery rate and delay over a recent window.
type DeliveryStats struct {
	// Minutes holds the minutes with deliveries, oldest first.
	Minutes []MinuteStats
	// Capped is true when the window held more than the rows read: Minutes then covers only
	// the newest minutes (whole ones).
	Capped bool
	// Now is the database clock (zero when no event was published in the window).
	Now time.Time
}

// DefaultStatsRows is how many published events DeliveryStats reads at most.
const DefaultStatsRows = 50000

// DeliveryStats returns the events published in the last window (above zero, at most 24h),
// per minute, with their commit → delivery delay. It reads the newest of them through the
// published_at index, at most DefaultStatsRows: its cost is bounded by that, whatever the
// table's history. Errors: a *ConfigError for a window out of range, or the database error.
func (s *Subscriber) DeliveryStats(ctx context.Context, window time.Duration) (DeliveryStats, error) {
	if window <= 0 || window > 24*time.Hour {
		return DeliveryStats{}, &ConfigError{Field: "window", Reason: fmt.Sprintf("%s outside (0, 24h]", window)}
	}
	o, err := s.operator("DeliveryStats")
	if err != nil {
		return DeliveryStats{}, err
	}
	r, err := o.DeliveryStats(ctx, s.db, s.s.t, window, DefaultStatsRows)
	if err != nil {
		return DeliveryStats{}, fmt.Errorf("outbox: delivery stats of %s: %w", s.s.table, err)
	}
	out := DeliveryStats{Capped: r.Capped, Now: r.Now}
	sec := func(f float64) time.Duration { return time.Duration(f * float64(time.Second)) }
	for _, m := range r.Minutes {
		out.Minutes = append(out.Minutes, MinuteStats{Minute: m.Minute, Delivered: m.Delivered, MeanDelay: sec(m.MeanDelay), P95Delay: sec(m.P95), MaxDelay: sec(m.Max)})
	}
	return out, nil
}

// RelayLease is the unexpired leases held by one relay instance (one Subscriber).
type RelayLease struct {
	// Relay is the relay's name (SubscriberConfig.RelayName); Instance adds the Subscriber's
	// nonce, so two processes of one name are told apart.
	Relay, Instance string
	// Events counts the pending events it holds (among those read, see LeaseReport).
	Events int64
	// Until is the latest expiry of its leases, Earliest the earliest.
	Until, Earliest time.Time
	// Now is the database clock (the relay's clock on SQLite).
	Now time.Time
}

// LeaseReport is RelayLeases' answer.
type LeaseReport struct {
	// Relays holds one entry per relay instance, sorted by Instance.
	Relays []RelayLease
	// Limit is how many leased events were read at most.
	Limit int
	// Capped reports that more than Limit leased events were found: the Events counts then
	// cover the first Limit of them (in sequence order) and are lower bounds, and a relay
	// whose leases all lie beyond them is missing.
	Capped bool
}

// RelayLeases returns the relays that hold unexpired leases on pending events, with how many
// events each holds: the relays at work right now (an idle relay holds none). It reads the
// pending events in sequence order, at most 10,000 of each pending index (keyed, unordered) —
// relays lease the oldest claimable events — and stops at limit (1..MaxOverviewLimit) leased
// events (LeaseReport.Capped tells when there were more), so its cost is bounded whatever the
// backlog; a lease beyond the 10,000 oldest events of its kind (behind a larger backlog of
// blocked or retrying events) is not counted. The console's overview passes its
// OverviewLimit (default DefaultOverviewLimit). Errors: a *ConfigError for a limit out of
// range, or the database error. Safe for concurrent use, also after Close.
func (s *Subscriber) RelayLeases(ctx context.Context, limit int) (LeaseReport, error) {
	if limit < 1 || limit > MaxOverviewLimit {
		return LeaseReport{}, &ConfigError{Field: "limit", Reason: fmt.Sprintf("%d outside 1..%d", limit, MaxOverviewLimit)}
	}
	o, err := s.operator("RelayLeases")
	if err != nil {
		return LeaseReport{}, err
	}
	r, err := o.Leases(ctx, s.db, s.s.t, limit)
	if err != nil {
		return LeaseReport{}, fmt.Errorf("outbox: relay leases of %s: %w", s.s.table, err)
	}
	out := LeaseReport{Relays: make([]RelayLease, 0, len(r.Relays)), Limit: limit, Capped: r.Capped}
	for _, r := range r.Relays {
		l := RelayLease{Relay: r.Instance, Instance: r.Instance, Events: r.Events, Until: r.LeaseUntil, Earliest: r.OldestLeased, Now: r.Now}
		if i := strings.LastIndexByte(r.Instance, '#'); i >= 0 {
			l.Relay = r.Instance[:i]
		}
		out.Relays = append(out.Relays, l)
	}
	return out, nil
}
