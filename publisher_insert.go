package outbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/google/uuid"
	"github.com/watermill-outbox/outbox/internal/dialect"
)

// insert writes rows. Without events (and without idempotency keys) it returns nil events.
func (p *Publisher) insert(ctx context.Context, rows []row, events bool) ([]Event, error) {
	if ctx == nil {
		ctx = context.Background()
	}
	n := len(rows)
	in := &dialect.InsertParams{Table: p.s.t, Rows: make([]dialect.InsertRow, n), Notify: p.cfg.NotifyChannel, MaxNotifyTopicBytes: MaxNotifyTopicBytes}
	// One event (the common Publish) has no duplicate id and at most one key (the cap is at
	// least 1): no maps.
	var seenID map[uuid.UUID]int
	var distinctKeys, distinctIdem map[string]struct{}
	// On PostgreSQL every distinct idempotency key takes a lock too (the insert locks them in
	// one sorted pass with the ordering keys, so concurrent calls wait instead of failing on
	// the unique index), counted against the same cap.
	lockIdem := p.cfg.Schema.Dialect == DialectPostgreSQL
	if n > 1 {
		seenID, distinctKeys, distinctIdem = make(map[uuid.UUID]int, n), map[string]struct{}{}, map[string]struct{}{}
	}
	idem := false
	for i, r := range rows {
		if j, dup := seenID[r.id]; dup {
			return nil, &ValidationError{Index: i, Field: "uuid", Reason: fmt.Sprintf("same id as event #%d of this call", j)}
		}
		in.Rows[i] = dialect.InsertRow{ID: r.id.String(), Topic: r.topic, Payload: r.payload, Headers: string(r.headers), OrderingKey: r.okey, IdempotencyKey: r.ikey}
		if n > 1 {
			seenID[r.id] = i
		}
		if r.okey != nil && n > 1 {
			distinctKeys[*r.okey] = struct{}{}
			if len(distinctKeys)+len(distinctIdem) > p.cfg.MaxOrderingKeysPerCall {
				return nil, &ValidationError{Index: i, Field: "ordering_key", Reason: fmt.Sprintf("more than %d distinct ordering and idempotency keys in one call (PublisherConfig.MaxOrderingKeysPerCall)", p.cfg.MaxOrderingKeysPerCall)}
			}
		}
		if r.ikey != nil && n > 1 && lockIdem {
			distinctIdem[*r.ikey] = struct{}{}
			if len(distinctKeys)+len(distinctIdem) > p.cfg.MaxOrderingKeysPerCall {
				return nil, &ValidationError{Index: i, Field: "idempotency_key", Reason: fmt.Sprintf("more than %d distinct ordering and idempotency keys in one call (PublisherConfig.MaxOrderingKeysPerCall)", p.cfg.MaxOrderingKeysPerCall)}
			}
		}
		idem = idem || r.ikey != nil
		for c := range r.extra {
			if !slices.Contains(in.ExtraNames, c) {
				in.ExtraNames = append(in.ExtraNames, c)
			}
		}
	}
	if len(in.ExtraNames) > 0 {
		sort.Strings(in.ExtraNames)
		for i, r := range rows {
			if len(r.extra) == 0 {
				continue
			}
			b, err := EncodePayload(r.extra)
			if err != nil {
				return nil, &ValidationError{Index: i, Field: "extra_columns", Reason: err.Error()}
			}
			s := string(b)
			in.Rows[i].Extra = &s
		}
	}
	// Without idempotency keys every row is inserted or the statement fails: a caller that
	// needs no events needs nothing back.
	in.NoReturn = !events && !idem
	start := time.Now()
	stored, err := p.s.d.Insert(ctx, p.ex, in)
	var conflict *dialect.IdempotencyConflict
	switch {
	case errors.As(err, &conflict):
		return nil, &IdempotencyConflictError{Index: conflict.Index, Key: conflict.Key}
	case err != nil && p.s.d.MissingTable(err):
		return nil, &TableNotFoundError{Table: p.s.table, Err: err}
	case err != nil:
		return nil, fmt.Errorf("outbox: insert into %s: %w", p.s.table, err)
	case in.NoReturn:
		p.logWritten(n, start)
		if p.cfg.OnInserted != nil {
			var topics []string
			for _, r := range rows {
				topics = appendNew(topics, r.topic)
			}
			p.cfg.OnInserted(topics)
		}
		return nil, nil
	}
	// One answer per row, in order: inserted, or stored in its scope (Duplicate).
	if len(stored) != n {
		return nil, fmt.Errorf("outbox: insert into %s: %d events returned for %d", p.s.table, len(stored), n)
	}
	out := make([]Event, n)
	for i, st := range stored {
		out[i] = storedEvent(st)
	}
	return p.written(out, start), nil
}

// written logs a finished write and calls OnInserted with the topics of the inserted events.
func (p *Publisher) written(out []Event, start time.Time) []Event {
	p.logWritten(len(out), start)
	if p.cfg.OnInserted != nil {
		var topics []string
		for _, ev := range out {
			if !ev.Duplicate {
				topics = appendNew(topics, ev.Topic)
			}
		}
		if len(topics) > 0 {
			p.cfg.OnInserted(topics)
		}
	}
	return out
}

// logWritten logs a finished write of n events (not built for the NopLogger: a write's fields
// cost an allocation).
func (p *Publisher) logWritten(n int, start time.Time) {
	if _, nop := p.logger.(watermill.NopLogger); !nop {
		p.logger.Trace("outbox: events written", watermill.LogFields{"table": p.s.table, "events": n, "took": time.Since(start)})
	}
}

// appendNew appends topic to topics unless it is there.
func appendNew(topics []string, topic string) []string {
	if slices.Contains(topics, topic) {
		return topics
	}
	return append(topics, topic)
}

// storedEvent is the Event of a stored row (no payload: the writer has it).
func storedEvent(st dialect.Stored) Event {
	ev := Event{Sequence: st.Sequence, Topic: st.Topic, CreatedAt: st.CreatedAt, Duplicate: st.Duplicate}
	ev.ID, _ = uuid.Parse(st.ID)
	ev.OrderingKey, ev.IdempotencyKey = deref(st.OrderingKey), deref(st.IdempotencyKey)
	return ev
}
