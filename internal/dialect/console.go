package dialect

import (
	"context"
	"sort"
	"strings"
	"time"
)

// Operator is implemented by the dialects that serve the operator's reads and per-key actions
// (the root package's BlockedKeys, RetryKeyHead, SkipKeyHead, PurgeKeyHead, DeliveryStats,
// RelayLeases and BacklogOverview, and the narrowing fields of DeadFilter): PostgreSQL, SQLite
// and MariaDB/MySQL. The root package answers a typed "not supported" error for a dialect
// without it (the in-memory table of the simulation tests). Every method reads live work only
// (pending and dead-lettered rows, through the dialect's pending, key and dead-letter
// indexes), never the published history, except DeliveryStats, which reads the newest
// published rows of its window through the published_at index.
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
	// fencing token without its claim number): the first limit leased events in sequence
	// order among the LeaseScan oldest pending events of each kind (unordered, keyed), so
	// that it reads at most 2·LeaseScan pending rows whatever the backlog. Capped reports
	// that more than limit leased events were found (the counts cover the first limit).
	Leases(ctx context.Context, ex Executor, t *Table, limit int) (LeasesRow, error)
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

// LeaseScan is how many of the oldest pending events of each kind (keyed, unordered) Leases
// reads at most: relays lease the oldest claimable events, so their leases lie there.
const LeaseScan = 10000

// LeasesRow is Leases' answer: the relay instances by instance name, and whether the leased
// events found exceeded the limit.
type LeasesRow struct {
	Relays []LeaseRow
	Capped bool
}

// Lease is one leased event as GroupLeases reads it: its fencing token and lease end.
type Lease struct {
	Token string
	Until time.Time
}

// GroupLeases groups the first limit of leases (in sequence order) by relay instance (the
// token without its trailing "#<claim number>"), sorted by instance, each stamped now; Capped
// is set when leases holds more than limit.
func GroupLeases(leases []Lease, limit int, now time.Time) LeasesRow {
	var out LeasesRow
	if len(leases) > limit {
		out.Capped, leases = true, leases[:limit]
	}
	at := map[string]int{}
	for _, l := range leases {
		inst := l.Token
		if i := strings.LastIndexByte(inst, '#'); i >= 0 && i+1 < len(inst) && strings.Trim(inst[i+1:], "0123456789") == "" {
			inst = inst[:i]
		}
		j, ok := at[inst]
		if !ok {
			j = len(out.Relays)
			at[inst] = j
			out.Relays = append(out.Relays, LeaseRow{Instance: inst, LeaseUntil: l.Until, OldestLeased: l.Until, Now: now})
		}
		r := &out.Relays[j]
		r.Events++
		if l.Until.After(r.LeaseUntil) {
			r.LeaseUntil = l.Until
		}
		if l.Until.Before(r.OldestLeased) {
			r.OldestLeased = l.Until
		}
	}
	sort.Slice(out.Relays, func(a, b int) bool { return out.Relays[a].Instance < out.Relays[b].Instance })
	return out
}

// ScanOverview reads a BacklogOverview statement's rows: topic, pending, oldest pending,
// dead-lettered, clock, unavailable, held, then the rows read of each kind (unordered, keyed,
// dead, failed heads), the same on every row.
func ScanOverview(rs Rows) (OverviewRow, error) {
	defer rs.Close()
	var out OverviewRow
	for rs.Next() {
		var b BacklogRow
		if err := rs.Scan(&b.Topic, &b.Pending, (*Time)(&b.Oldest), &b.DeadLettered, (*Time)(&b.Now), &b.Unavailable, &b.Held,
			&out.Unordered, &out.Keyed, &out.Dead, &out.Heads); err != nil {
			return OverviewRow{}, err
		}
		out.Topics = append(out.Topics, b)
	}
	return out, rs.Err()
}

// ScanLeases reads the rows of a Leases statement (token, lease end, clock; the first limit+1
// leased events in sequence order) and groups them (GroupLeases).
func ScanLeases(rs Rows, limit int) (LeasesRow, error) {
	defer rs.Close()
	var (
		ls  []Lease
		now time.Time
	)
	for rs.Next() {
		var l Lease
		if err := rs.Scan(&l.Token, (*Time)(&l.Until), (*Time)(&now)); err != nil {
			return LeasesRow{}, err
		}
		ls = append(ls, l)
	}
	if err := rs.Err(); err != nil {
		return LeasesRow{}, err
	}
	return GroupLeases(ls, limit, now), nil
}

// P95 is percentile_cont(0.95) of a group of n values sorted ascending, from the values at
// 0-based index idx, floor(0.95·(n-1)) as the statement computed it, and idx+1 (hi, nil when
// idx is the last): lo + (0.95·(n-1) - idx)·(hi - lo).
func P95(n, idx int64, lo float64, hi *float64) float64 {
	if hi == nil || n <= 1 {
		return lo
	}
	frac := min(max(0.95*float64(n-1)-float64(idx), 0), 1)
	return lo + frac*(*hi-lo)
}

// ScanStats reads the rows of a DeliveryStats statement that groups by minute in SQL (SQLite,
// MariaDB/MySQL): the minute's number since the epoch, the count, the mean and maximum delay
// in microseconds, the 95th percentile's index floor(0.95·(n-1)) with the delays at it and
// right after it (see P95), and the clock. More than maxRows events in all means the window
// held more: Capped, and the oldest minute (partial) is left out.
func ScanStats(rs Rows, maxRows int) (DeliveryStatsRow, error) {
	defer rs.Close()
	var (
		out   DeliveryStatsRow
		total int64
	)
	for rs.Next() {
		var (
			m, at    int64
			mr       MinuteRow
			lo, high float64
			hi       *float64
		)
		if err := rs.Scan(&m, &mr.Delivered, &mr.MeanDelay, &high, &at, &lo, &hi, (*Time)(&out.Now)); err != nil {
			return DeliveryStatsRow{}, err
		}
		mr.Minute = time.UnixMicro(m * 60_000_000).UTC()
		mr.P95 = P95(mr.Delivered, at, lo, hi) / 1e6
		mr.MeanDelay /= 1e6
		mr.Max = high / 1e6
		total += mr.Delivered
		out.Minutes = append(out.Minutes, mr)
	}
	if err := rs.Err(); err != nil {
		return DeliveryStatsRow{}, err
	}
	if total > int64(maxRows) {
		out.Capped = true
		out.Minutes = out.Minutes[1:]
	}
	return out, nil
}

// LeaseRow is the leases of one relay instance.
type LeaseRow struct {
	Instance     string
	Events       int64
	LeaseUntil   time.Time // the latest expiry
	OldestLeased time.Time // the earliest expiry
	Now          time.Time
}
