package outbox

import (
	"context"
	"fmt"
)

// DefaultOverviewLimit is the limit the console's overview passes to BacklogOverview: how many
// events of each kind it reads at most.
const DefaultOverviewLimit = 2000

// MaxOverviewLimit is the largest limit BacklogOverview takes.
const MaxOverviewLimit = 1000000

// BacklogOverview is BacklogByTopic read with a bound on its work (see
// Subscriber.BacklogOverview). When a kind is capped its counts are lower bounds: the
// backlog holds at least that many, likely more.
type BacklogOverview struct {
	// Topics is the backlog of each topic among the events read, sorted by topic.
	Topics []TopicBacklog
	// Total sums Topics; OldestPendingAge is the oldest of theirs.
	Total Backlog
	// Limit is how many events of each kind were read at most.
	Limit int
	// PendingCapped reports that Limit unordered or Limit keyed pending events were read:
	// Pending, Unavailable and Held count only the oldest Limit of each, and a topic whose
	// pending events are all newer is missing (unless it has dead letters read).
	PendingCapped bool
	// DeadCapped reports that Limit dead letters were read: DeadLettered counts only the
	// Limit earliest dead-lettered.
	DeadCapped bool
	// HeldCapped reports that Limit keys with a failed or dead-lettered event were examined
	// for a failed head: Held may miss events held behind the heads of further keys. (Only
	// the keys of the keyed events read are examined: a key none of whose pending events was
	// read holds none of them.)
	HeldCapped bool
}

// Capped reports whether any count is a lower bound.
func (o BacklogOverview) Capped() bool { return o.PendingCapped || o.DeadCapped || o.HeldCapped }

// BacklogOverview returns the backlog per topic as BacklogByTopic does, reading at most limit
// (1..MaxOverviewLimit) events of each kind: the oldest limit unordered and the oldest limit
// keyed pending events, the limit earliest dead letters, and the failed heads of at most limit
// keys. Its cost is therefore bounded by limit, whatever the backlog and the history; the
// counts of a capped kind are lower bounds (see BacklogOverview). The oldest pending age is
// exact: the oldest events are always read. Errors: a *ConfigError for a limit out of range,
// or the database error. Safe for concurrent use, also after Close.
func (s *Subscriber) BacklogOverview(ctx context.Context, limit int) (BacklogOverview, error) {
	if limit < 1 || limit > MaxOverviewLimit {
		return BacklogOverview{}, &ConfigError{Field: "limit", Reason: fmt.Sprintf("%d outside 1..%d", limit, MaxOverviewLimit)}
	}
	out := BacklogOverview{Limit: limit}
	o, err := s.operator("BacklogOverview")
	if err != nil {
		if out.Topics, err = s.BacklogByTopic(ctx); err != nil {
			return BacklogOverview{}, err
		}
	} else {
		r, err := o.BacklogOverview(ctx, s.db, s.s.t, limit)
		if err != nil {
			return BacklogOverview{}, fmt.Errorf("outbox: backlog overview of %s: %w", s.s.table, err)
		}
		for _, b := range r.Topics {
			out.Topics = append(out.Topics, TopicBacklog{Topic: b.Topic, Backlog: backlogOf(b)})
		}
		l := int64(limit)
		out.PendingCapped, out.DeadCapped, out.HeldCapped = r.Unordered >= l || r.Keyed >= l, r.Dead >= l, r.Heads >= l
	}
	for _, t := range out.Topics {
		out.Total.Pending += t.Pending
		out.Total.DeadLettered += t.DeadLettered
		out.Total.Unavailable += t.Unavailable
		out.Total.Held += t.Held
		out.Total.OldestPendingAge = max(out.Total.OldestPendingAge, t.OldestPendingAge)
	}
	return out, nil
}
