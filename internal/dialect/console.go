package dialect

import (
	"context"
	"time"
)

// Operator is implemented by the dialects that serve the operator's reads and per-key actions
// (the root package's BlockedKeys, RetryKeyHead, SkipKeyHead, PurgeKeyHead, DeliveryStats and
// RelayLeases, and the narrowing fields of DeadFilter): PostgreSQL. The root package answers a
// typed "not supported" error for the others.
type Operator interface {
	// BlockedKeys returns up to limit ordering keys whose head (lowest-sequence unpublished
	// event) failed (attempts > 0, pending) or is dead-lettered and that hold later pending
	// events, oldest head first, with the held events counted up to HeldCountLimit.
	BlockedKeys(ctx context.Context, ex Executor, t *Table, limit int) ([]BlockedKeyRow, error)
	// ActOnHead applies a to event seq of key when it is still that key's head and still
	// failed or dead-lettered, and returns how many events it changed (0 or 1). Every action
	// also makes the key's next pending event due at once (next_attempt_at = now()) when it
	// leaves the key's way, so that the relays' claims find it.
	ActOnHead(ctx context.Context, ex Executor, t *Table, key string, seq int64, a HeadAction) (int64, error)
	// DeliveryStats returns the events published in the last window, grouped by minute (oldest
	// first), reading at most maxRows of the newest of them; Capped reports that the window
	// held more.
	DeliveryStats(ctx context.Context, ex Executor, t *Table, window time.Duration, maxRows int) (DeliveryStatsRow, error)
	// Leases returns the unexpired leases of pending events grouped by relay instance (the
	// fencing token without its claim number).
	Leases(ctx context.Context, ex Executor, t *Table) ([]LeaseRow, error)
	// BacklogOverview is BacklogByTopic over at most limit events of each kind: the oldest
	// limit unordered and the oldest limit keyed pending events (by sequence), the limit
	// earliest dead letters, and the failed heads among the first limit keys that have a
	// failed or dead-lettered event. The row counts read tell which kinds were capped.
	BacklogOverview(ctx context.Context, ex Executor, t *Table, limit int) (OverviewRow, error)
}

// OverviewRow is BacklogOverview's answer: the per-topic backlog of the events read, and how
// many of each kind were read (a count equal to the limit means the kind was capped).
type OverviewRow struct {
	Topics                        []BacklogRow
	Unordered, Keyed, Dead, Heads int64
}

// HeldCountLimit is how many held events BlockedKeys counts at most per key.
const HeldCountLimit = 10000

// HeadAction is what ActOnHead does to a key's head.
type HeadAction int

const (
	// HeadRetry makes the head due now: a failed head keeps its attempts; a dead-lettered one
	// gets fresh attempts, as RetryDead.
	HeadRetry HeadAction = iota + 1
	// HeadSkip dead-letters the head and takes it out of its key's order (ordering_key NULL,
	// the key kept in the header SkippedKeyHeader), so that the key's later events go on.
	HeadSkip
	// HeadPurge deletes the head.
	HeadPurge
)

// SkippedKeyHeader is the header in which HeadSkip keeps the ordering key of the event it took
// out of its key's order.
const SkippedKeyHeader = "outbox-skipped-ordering-key"

// BlockedKeyRow is one blocked key: its head and how many pending events wait behind it.
type BlockedKeyRow struct {
	Key            string
	Sequence       int64
	ID             string
	Topic          string
	Attempts       int
	LastError      *string
	NextAttemptAt  time.Time // zero when none
	DeadLetteredAt time.Time // zero when not dead-lettered
	CreatedAt      time.Time
	Held           int64
	Now            time.Time
}

// MinuteRow is one minute of DeliveryStats: events published in it and their commit →
// publish delay (published_at - created_at) in seconds: mean, 95th percentile and maximum.
type MinuteRow struct {
	Minute              time.Time
	Delivered           int64
	MeanDelay, P95, Max float64
}

// DeliveryStatsRow is DeliveryStats' answer.
type DeliveryStatsRow struct {
	Minutes []MinuteRow
	Capped  bool
	Now     time.Time
}

// LeaseRow is the leases of one relay instance.
type LeaseRow struct {
	Instance     string
	Events       int64
	LeaseUntil   time.Time // the latest expiry
	OldestLeased time.Time // the earliest expiry
	Now          time.Time
}
