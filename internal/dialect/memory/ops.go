package memory

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/watermill-outbox/outbox/internal/dialect"
)

// dead reports whether x is a dead letter f selects at now.
func dead(x *Row, f dialect.DeadFilter, now time.Time) bool {
	if x.DeadLetteredAt.IsZero() || !x.PublishedAt.IsZero() {
		return false
	}
	if f.OlderThan > 0 && !x.DeadLetteredAt.Before(now.Add(-f.OlderThan)) {
		return false
	}
	if slices.Contains(f.IDs, x.ID) {
		return true
	}
	return slices.ContainsFunc(f.Topics, func(tp dialect.Topic) bool { return matchTopic(tp, x.Topic) })
}

// eachDead calls fn with each dead letter f selects and returns how many. The caller holds d.mu.
func (d *DB) eachDead(f dialect.DeadFilter, fn func(*Row)) int64 {
	now := time.Now()
	var n int64
	for _, x := range d.rows {
		if dead(x, f, now) {
			fn(x)
			n++
		}
	}
	return n
}

// RetryDead implements dialect.Dialect: the selected dead letters become pending again with
// no attempts and no lease.
func (d *DB) RetryDead(ctx context.Context, ex dialect.Executor, _ *dialect.Table, f dialect.DeadFilter) (int64, error) {
	if err := d.begin(ctx, ex, ""); err != nil {
		return 0, err
	}
	n := d.eachDead(f, func(x *Row) {
		x.DeadLetteredAt, x.Attempts, x.NextAttemptAt, x.LeaseUntil, x.LeasedBy = time.Time{}, 0, time.Time{}, time.Time{}, ""
	})
	return n, d.end(ex, "", nil)
}

// PurgeDead implements dialect.Dialect.
func (d *DB) PurgeDead(ctx context.Context, ex dialect.Executor, _ *dialect.Table, f dialect.DeadFilter) (int64, error) {
	if err := d.begin(ctx, ex, ""); err != nil {
		return 0, err
	}
	now := time.Now()
	n := d.remove(func(x *Row) bool { return dead(x, f, now) })
	return n, d.end(ex, "", nil)
}

// CountDead implements dialect.Dialect.
func (d *DB) CountDead(ctx context.Context, ex dialect.Executor, _ *dialect.Table, f dialect.DeadFilter) (int64, error) {
	if err := d.begin(ctx, ex, ""); err != nil {
		return 0, err
	}
	n := d.eachDead(f, func(*Row) {})
	return n, d.end(ex, "", nil)
}

// ListDead implements dialect.Dialect: by dead_lettered_at, then sequence.
func (d *DB) ListDead(ctx context.Context, ex dialect.Executor, _ *dialect.Table, f dialect.DeadFilter, limit int) ([]dialect.DeadRow, error) {
	if err := d.begin(ctx, ex, ""); err != nil {
		return nil, err
	}
	var out []dialect.DeadRow
	d.eachDead(f, func(x *Row) {
		out = append(out, dialect.DeadRow{Sequence: x.Sequence, ID: x.ID, Topic: x.Topic, Payload: x.Payload, Headers: x.Headers,
			OrderingKey: x.OrderingKey, IdempotencyKey: x.IdempotencyKey, CreatedAt: x.CreatedAt, Attempts: x.Attempts,
			LastError: x.LastError, DeadLetteredAt: x.DeadLetteredAt})
	})
	slices.SortStableFunc(out, func(a, b dialect.DeadRow) int { return a.DeadLetteredAt.Compare(b.DeadLetteredAt) })
	if len(out) > limit {
		out = out[:limit]
	}
	return out, d.end(ex, "", nil)
}

// olderThan returns the test of column ("published_at" or "dead_lettered_at") being set before
// now - age.
func olderThan(column string, age time.Duration) (func(*Row) bool, error) {
	cut := time.Now().Add(-age)
	switch column {
	case "published_at":
		return func(x *Row) bool { return !x.PublishedAt.IsZero() && x.PublishedAt.Before(cut) }, nil
	case "dead_lettered_at":
		return func(x *Row) bool { return !x.DeadLetteredAt.IsZero() && x.DeadLetteredAt.Before(cut) }, nil
	}
	return nil, fmt.Errorf("memory: unknown column %q", column)
}

// Cleanup implements dialect.Dialect: up to batch rows, in sequence order.
func (d *DB) Cleanup(ctx context.Context, ex dialect.Executor, _ *dialect.Table, column string, age time.Duration, batch int) (int64, error) {
	old, err := olderThan(column, age)
	if err != nil {
		return 0, err
	}
	if err := d.begin(ctx, ex, ""); err != nil {
		return 0, err
	}
	var n int64
	n = d.remove(func(x *Row) bool {
		if n < int64(batch) && old(x) {
			n++
			return true
		}
		return false
	})
	return n, d.end(ex, "", nil)
}

// CountOlder implements dialect.Dialect.
func (d *DB) CountOlder(ctx context.Context, ex dialect.Executor, _ *dialect.Table, column string, age time.Duration) (int64, error) {
	old, err := olderThan(column, age)
	if err != nil {
		return 0, err
	}
	if err := d.begin(ctx, ex, ""); err != nil {
		return 0, err
	}
	var n int64
	for _, x := range d.rows {
		if old(x) {
			n++
		}
	}
	return n, d.end(ex, "", nil)
}

// backlog adds x to b (see dialect.BacklogRow); held reports whether x waits behind its key's
// failed or dead-lettered head.
func backlog(b *dialect.BacklogRow, x *Row, held bool) {
	if !x.DeadLetteredAt.IsZero() {
		b.DeadLettered++
		return
	}
	b.Pending++
	if b.Oldest.IsZero() || x.CreatedAt.Before(b.Oldest) {
		b.Oldest = x.CreatedAt
	}
	if held {
		b.Held++
	}
}

// backlogs returns the backlog of each topic with unpublished events, by topic. The caller
// holds d.mu.
func (d *DB) backlogs(now time.Time) []dialect.BacklogRow {
	by := map[string]*dialect.BacklogRow{}
	unavailable := map[string]bool{}
	failedHead := map[string]int64{} // key → its head's sequence, when the head failed
	seen := map[string]bool{}
	var topics []string
	for _, x := range d.rows {
		if !x.PublishedAt.IsZero() {
			continue
		}
		if k := x.Key(); x.OrderingKey != nil && !seen[k] {
			seen[k] = true
			if !x.DeadLetteredAt.IsZero() || x.Attempts > 0 {
				failedHead[k] = x.Sequence
			}
		}
		b := by[x.Topic]
		if b == nil {
			b = &dialect.BacklogRow{Topic: x.Topic, Now: now}
			by[x.Topic] = b
			topics = append(topics, x.Topic)
		}
		h, ok := failedHead[x.Key()]
		backlog(b, x, x.OrderingKey != nil && ok && x.Sequence > h)
		if x.DeadLetteredAt.IsZero() && x.LastErrorClass == dialect.ClassUnavailable {
			unavailable[x.Topic] = true
		}
	}
	slices.Sort(topics)
	out := make([]dialect.BacklogRow, len(topics))
	for i, tp := range topics {
		out[i] = *by[tp]
		if unavailable[tp] {
			out[i].Unavailable = out[i].Pending
		}
	}
	return out
}

// Backlog implements dialect.Dialect.
func (d *DB) Backlog(ctx context.Context, ex dialect.Executor, _ *dialect.Table) (dialect.BacklogRow, error) {
	if err := d.begin(ctx, ex, ""); err != nil {
		return dialect.BacklogRow{}, err
	}
	now := time.Now()
	total := dialect.BacklogRow{Now: now}
	for _, b := range d.backlogs(now) {
		total.Pending += b.Pending
		total.DeadLettered += b.DeadLettered
		total.Unavailable += b.Unavailable
		total.Held += b.Held
		if !b.Oldest.IsZero() && (total.Oldest.IsZero() || b.Oldest.Before(total.Oldest)) {
			total.Oldest = b.Oldest
		}
	}
	return total, d.end(ex, "", nil)
}

// BacklogByTopic implements dialect.Dialect: one row per topic with unpublished events, by
// topic.
func (d *DB) BacklogByTopic(ctx context.Context, ex dialect.Executor, _ *dialect.Table) ([]dialect.BacklogRow, error) {
	if err := d.begin(ctx, ex, ""); err != nil {
		return nil, err
	}
	out := d.backlogs(time.Now())
	return out, d.end(ex, "", nil)
}

// replayed reports whether x is a published event f selects.
func replayed(x *Row, f dialect.ReplayFilter) bool {
	if x.PublishedAt.IsZero() || x.PublishedAt.Before(f.Since) || !x.PublishedAt.Before(f.Until) || f.MaxSeq > 0 && x.Sequence > f.MaxSeq {
		return false
	}
	if len(f.Topics) > 0 && !slices.ContainsFunc(f.Topics, func(tp dialect.Topic) bool { return matchTopic(tp, x.Topic) }) {
		return false
	}
	return len(f.Keys) == 0 || x.OrderingKey != nil && slices.Contains(f.Keys, *x.OrderingKey)
}

// CountReplay implements dialect.Dialect.
func (d *DB) CountReplay(ctx context.Context, ex dialect.Executor, _ *dialect.Table, f dialect.ReplayFilter) (int64, int64, error) {
	if err := d.begin(ctx, ex, ""); err != nil {
		return 0, 0, err
	}
	var n, top int64
	for _, x := range d.rows {
		if replayed(x, f) {
			n, top = n+1, max(top, x.Sequence)
		}
	}
	return n, top, d.end(ex, "", nil)
}

// ScanReplay implements dialect.Dialect.
func (d *DB) ScanReplay(ctx context.Context, ex dialect.Executor, _ *dialect.Table, f dialect.ReplayFilter, after dialect.ReplayMark, limit int) ([]dialect.ReplayMark, error) {
	if err := d.begin(ctx, ex, ""); err != nil {
		return nil, err
	}
	var out []dialect.ReplayMark
	for _, x := range d.rows {
		if !replayed(x, f) {
			continue
		}
		if after.Sequence != 0 && (x.PublishedAt.Before(after.PublishedAt) || x.PublishedAt.Equal(after.PublishedAt) && x.Sequence <= after.Sequence) {
			continue
		}
		out = append(out, dialect.ReplayMark{PublishedAt: x.PublishedAt, Sequence: x.Sequence})
	}
	slices.SortFunc(out, func(a, b dialect.ReplayMark) int {
		if c := a.PublishedAt.Compare(b.PublishedAt); c != 0 {
			return c
		}
		return int(a.Sequence - b.Sequence)
	})
	if len(out) > limit {
		out = out[:limit]
	}
	return out, d.end(ex, "", nil)
}

// ReadReplay implements dialect.Dialect.
func (d *DB) ReadReplay(ctx context.Context, ex dialect.Executor, _ *dialect.Table, seqs []int64) ([]dialect.ReplayRow, error) {
	if err := d.begin(ctx, ex, ""); err != nil {
		return nil, err
	}
	var out []dialect.ReplayRow
	for _, x := range d.rows {
		if slices.Contains(seqs, x.Sequence) {
			out = append(out, dialect.ReplayRow{Sequence: x.Sequence, ID: x.ID, Topic: x.Topic, Payload: x.Payload, Headers: x.Headers, OrderingKey: x.OrderingKey, Extra: x.Extra})
		}
	}
	slices.SortFunc(out, func(a, b dialect.ReplayRow) int { return int(a.Sequence - b.Sequence) })
	return out, d.end(ex, "", nil)
}
