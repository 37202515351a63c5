package memory

import (
	"cmp"
	"context"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/watermill-outbox/outbox/internal/dialect"
)

// relay is one subscription over the memory table.
type relay struct {
	d   *DB
	cfg dialect.RelayConfig
	sel dialect.TopicSelection
}

// NewRelay implements dialect.Dialect.
func (d *DB) NewRelay(_ *dialect.Table, cfg dialect.RelayConfig, sel dialect.TopicSelection) dialect.Relay {
	return &relay{d: d, cfg: cfg, sel: sel}
}

// matchTopic reports whether topic matches tp.
func matchTopic(tp dialect.Topic, topic string) bool {
	switch {
	case tp.All:
		return true
	case tp.Prefix:
		return strings.HasPrefix(topic, tp.Value)
	}
	return topic == tp.Value
}

// selects reports whether the subscription selects topic.
func (r *relay) selects(topic string) bool {
	if !matchTopic(r.sel.Include, topic) {
		return false
	}
	for _, e := range r.sel.Excludes {
		if matchTopic(e, topic) {
			return false
		}
	}
	return true
}

// Claim implements dialect.Relay with the PostgreSQL claim's rules. Keyed events: each key's
// run starts at its head (its first unpublished event, dead-lettered ones included) when the
// head is claimable — pending, due, not leased, of the claim's topics — and goes on through
// the key's next events while each is claimable, up to MaxRunPerKey; a continued key's run
// (p.Cont) starts after the continued run when the key's first unpublished event lies after
// it or is still leased under p.ContToken with more than a third of LeaseDuration left. Runs
// are taken in the order of their first sequence up to p.Limit keyed events, unordered
// claimable events in sequence order up to BatchSize, and the union is cut at BatchSize in
// sequence order. A probe (p.Probe) leases at most one event of its topics. Ranks are 1..n
// along each run with Capabilities.SkipLocked (0 unordered), -1 without. Walked is the number
// of keys among the p.Oldest oldest claimable keyed events (heads or not); Cursor and Scanned
// are nil (every key is looked at by every claim).
func (r *relay) Claim(ctx context.Context, ex dialect.Executor, p *dialect.ClaimParams) (*dialect.ClaimResult, error) {
	d := r.d
	if err := d.begin(ctx, ex, OpClaim); err != nil {
		return nil, err
	}
	now := time.Now()
	batch, limit := r.cfg.BatchSize, p.Limit
	if limit <= 0 || limit > batch {
		limit = batch
	}
	topicOK := func(topic string) bool {
		if !r.selects(topic) {
			return false
		}
		if p.Probe != nil {
			return slices.Contains(p.Probe, topic)
		}
		return !slices.Contains(p.Paused, topic)
	}
	if p.Probe != nil {
		batch, limit = 1, 1
	}
	claimable := func(x *Row) bool {
		return x.pending() && (x.NextAttemptAt.IsZero() || !x.NextAttemptAt.After(now)) &&
			(x.LeaseUntil.IsZero() || x.LeaseUntil.Before(now)) && topicOK(x.Topic)
	}
	// Each key's unpublished events in sequence order.
	byKey := map[string][]*Row{}
	var keys []string
	var unordered []*Row
	walked := map[string]bool{}
	oldest := 0
	for _, x := range d.rows {
		if !x.PublishedAt.IsZero() {
			continue
		}
		k := x.Key()
		if x.OrderingKey == nil {
			if claimable(x) {
				unordered = append(unordered, x)
			}
			continue
		}
		if byKey[k] == nil {
			keys = append(keys, k)
		}
		byKey[k] = append(byKey[k], x)
		if oldest < p.Oldest && claimable(x) {
			oldest++
			walked[k] = true
		}
	}
	type run struct{ rows []*Row }
	var runs []run
	cont := map[string]bool{}
	margin := r.cfg.LeaseDuration / 3
	for _, c := range p.Cont {
		cont[c.Key] = true
		evs := byKey[c.Key]
		i := slices.IndexFunc(evs, func(x *Row) bool { return x.Sequence >= c.From })
		if i < 0 {
			continue
		}
		h := evs[i]
		if !(h.Sequence > c.After || (h.LeasedBy == p.ContToken && h.LeaseUntil.After(now.Add(margin)))) {
			continue
		}
		j := slices.IndexFunc(evs, func(x *Row) bool { return x.Sequence > c.After })
		if j >= 0 {
			if rn := takeRun(evs[j:], claimable, r.cfg.MaxRunPerKey); len(rn) > 0 {
				runs = append(runs, run{rn})
			}
		}
	}
	for _, k := range keys {
		if cont[k] {
			continue
		}
		if rn := takeRun(byKey[k], claimable, r.cfg.MaxRunPerKey); len(rn) > 0 {
			runs = append(runs, run{rn})
		}
	}
	slices.SortFunc(runs, func(a, b run) int { return cmp.Compare(a.rows[0].Sequence, b.rows[0].Sequence) })
	if len(p.First) > 0 {
		// Taken-back keys (ClaimParams.First) go first, in their order, while their head is at
		// or below the last event taken back.
		place := map[string]int{}
		for i, f := range p.First {
			if _, ok := place[f.Key]; !ok && !cont[f.Key] {
				place[f.Key] = i
			}
		}
		rank := func(rn run) int {
			f, ok := place[rn.rows[0].Key()]
			if !ok || rn.rows[0].OrderingKey == nil || rn.rows[0].Sequence > p.First[f].Last {
				return len(p.First)
			}
			return f
		}
		slices.SortStableFunc(runs, func(a, b run) int { return cmp.Compare(rank(a), rank(b)) })
	}
	type pick struct {
		x    *Row
		rank int64
	}
	var picked []pick
	n := 0
	for _, rn := range runs {
		for i, x := range rn.rows {
			if n >= limit {
				break
			}
			picked = append(picked, pick{x, int64(i + 1)})
			n++
		}
	}
	for i, x := range unordered {
		if i >= batch {
			break
		}
		picked = append(picked, pick{x, 0})
	}
	slices.SortFunc(picked, func(a, b pick) int { return cmp.Compare(a.x.Sequence, b.x.Sequence) })
	if len(picked) > batch {
		picked = picked[:batch]
	}
	res := &dialect.ClaimResult{Walked: int64(len(walked)), Events: make([]dialect.Claimed, 0, len(picked))}
	for _, pk := range picked {
		x := pk.x
		x.LeaseUntil, x.LeasedBy = now.Add(r.cfg.LeaseDuration), p.Token
		x.DeliveryStarts++
		rank := pk.rank
		if !d.caps.SkipLocked {
			rank = -1
		}
		res.Events = append(res.Events, dialect.Claimed{Sequence: x.Sequence, ID: x.ID, Topic: x.Topic, Payload: x.Payload,
			Headers: x.Headers, OrderingKey: x.OrderingKey, CreatedAt: x.CreatedAt, Attempts: x.Attempts, LastError: x.LastError,
			Rank: rank, DeliveryStarts: x.DeliveryStarts})
	}
	if err := d.end(ex, OpClaim, nil); err != nil {
		return nil, err
	}
	// As a server that ran the statement to its end while the client gave up on the answer:
	// the leases stand, the relay sees an error.
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return res, nil
}

// takeRun returns the gap-free claimable start of evs (a key's events from its head, or from
// a continuation's next event), at most max events.
func takeRun(evs []*Row, claimable func(*Row) bool, max int) []*Row {
	n := 0
	for n < len(evs) && n < max && claimable(evs[n]) {
		n++
	}
	return evs[:n]
}

// Renew implements dialect.Relay: the rows of seqs leased under token and not published get a
// lease of LeaseDuration from now, expired or not (as in the SQL dialects: the token alone
// fences); it returns how many.
func (r *relay) Renew(ctx context.Context, ex dialect.Executor, token string, seqs []int64) (int64, error) {
	d := r.d
	if err := d.begin(ctx, ex, OpRenew); err != nil {
		return 0, err
	}
	now := time.Now()
	var n int64
	for _, s := range seqs {
		if x := d.find(s); x != nil && x.LeasedBy == token && x.PublishedAt.IsZero() {
			x.LeaseUntil = now.Add(r.cfg.LeaseDuration)
			n++
		}
	}
	return n, d.end(ex, OpRenew, nil)
}

// Mark implements dialect.Relay with the PostgreSQL mark statement's rules, each row fenced by
// m.Token (leased under it and not published; other rows are neither written nor returned):
// acked → published; released → lease cleared, delivery start uncounted; unavailable → lease
// cleared, last_error noted, no attempt, the start kept when Keep (not attempted); failed →
// attempts + 1 and a retry after min(RetryBase·2^attempts, RetryMax)·jitter, or a dead letter
// at MaxAttempts or when Perm; held → lease cleared, delivery_starts − 1, due HeldFor later,
// class held; abandoned → lease cleared, delivery_starts − 1 (not returned).
func (r *relay) Mark(ctx context.Context, ex dialect.Executor, m *dialect.MarkParams) ([]dialect.MarkResult, error) {
	d := r.d
	if err := d.begin(ctx, ex, OpMark); err != nil {
		return nil, err
	}
	now := time.Now()
	var out []dialect.MarkResult
	held := func(s int64) *Row {
		if x := d.find(s); x != nil && x.LeasedBy == m.Token && x.PublishedAt.IsZero() {
			x.LeaseUntil, x.LeasedBy = time.Time{}, ""
			return x
		}
		return nil
	}
	note := func(x *Row) { out = append(out, dialect.MarkResult{Seq: x.Sequence, Attempts: x.Attempts, Now: now}) }
	for _, s := range m.Acked {
		if x := held(s); x != nil {
			x.PublishedAt, x.DeliveryStarts = now, 0
			note(x)
		}
	}
	for _, s := range m.Released {
		if x := held(s); x != nil {
			x.DeliveryStarts = 0
			note(x)
		}
	}
	for i, s := range m.Unavailable {
		if x := held(s); x != nil {
			e := m.Notes[i]
			x.LastError, x.LastErrorClass = &e, dialect.ClassUnavailable
			if m.Keep[i] {
				x.LastErrorClass = dialect.ClassNotAttempted
			} else {
				x.DeliveryStarts = 0
			}
			note(x)
		}
	}
	for i, s := range m.Failed {
		x := held(s)
		if x == nil {
			continue
		}
		e := m.Errs[i]
		x.LastError, x.LastErrorClass, x.DeliveryStarts = &e, dialect.ClassFailure, 0
		if m.Perm[i] {
			x.LastErrorClass = dialect.ClassPermanent
		}
		res := dialect.MarkResult{Seq: x.Sequence, Now: now}
		if x.Attempts+1 >= r.cfg.MaxAttempts || m.Perm[i] {
			x.DeadLetteredAt, x.NextAttemptAt, res.Dead = now, time.Time{}, true
		} else {
			wait := min(float64(r.cfg.RetryBase.Microseconds())*float64(uint64(1)<<min(x.Attempts, 62)), float64(r.cfg.RetryMax.Microseconds()))
			x.NextAttemptAt = now.Add(time.Duration(wait*m.Jitters[i]) * time.Microsecond)
			next := x.NextAttemptAt
			res.Next = &next
		}
		x.Attempts++
		res.Attempts = x.Attempts
		out = append(out, res)
	}
	for i, s := range m.Held {
		if x := held(s); x != nil {
			e := m.HeldNotes[i]
			x.LastError, x.LastErrorClass = &e, dialect.ClassHeld
			x.DeliveryStarts = max(x.DeliveryStarts-1, 0)
			x.NextAttemptAt = now.Add(time.Duration(m.HeldFor[i]) * time.Microsecond)
			next := x.NextAttemptAt
			out = append(out, dialect.MarkResult{Seq: x.Sequence, Attempts: x.Attempts, Next: &next, Now: now})
		}
	}
	for _, s := range m.Abandoned {
		if x := held(s); x != nil {
			x.DeliveryStarts = max(x.DeliveryStarts-1, 0)
		}
	}
	return out, d.end(ex, OpMark, nil)
}

// takenToken is what follows the relay's name in an earlier relay's fencing token.
var takenToken = regexp.MustCompile(`^[0-9a-f]{12}#[0-9]+$`)

// TakeBack implements dialect.Dialect: it clears the unexpired leases of pending events whose
// token starts with name, not with tokenPrefix, followed by 12 hex digits, '#', digits.
func (d *DB) TakeBack(ctx context.Context, ex dialect.Executor, t *dialect.Table, name, tokenPrefix string) (int64, error) {
	n, _, err := d.TakeBackKeys(ctx, ex, t, name, tokenPrefix)
	return n, err
}

// TakeBackKeys implements dialect.KeyTakeBacker: TakeBack, also naming the ordering keys it
// released with the highest sequence released of each, in the order of each key's first
// released event.
func (d *DB) TakeBackKeys(ctx context.Context, ex dialect.Executor, _ *dialect.Table, name, tokenPrefix string) (int64, []dialect.TakenKey, error) {
	if err := d.begin(ctx, ex, OpTakeBack); err != nil {
		return 0, nil, err
	}
	now := time.Now()
	var n int64
	var keys []dialect.TakenKey
	place := map[string]int{}
	for _, x := range d.rows {
		if x.pending() && x.LeaseUntil.After(now) && strings.HasPrefix(x.LeasedBy, name) && !strings.HasPrefix(x.LeasedBy, tokenPrefix) &&
			takenToken.MatchString(x.LeasedBy[len(name):]) {
			x.LeaseUntil, x.LeasedBy = time.Time{}, ""
			n++
			if x.OrderingKey == nil {
				continue
			}
			if i, ok := place[*x.OrderingKey]; ok {
				keys[i].Last = max(keys[i].Last, x.Sequence)
				continue
			}
			place[*x.OrderingKey] = len(keys)
			keys = append(keys, dialect.TakenKey{Key: *x.OrderingKey, Last: x.Sequence})
		}
	}
	return n, keys, d.end(ex, OpTakeBack, nil)
}
