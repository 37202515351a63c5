package wal

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/forwarder"
)

// lane is the changes of one ordering key in a batch, in commit order (unkeyed changes are
// spread over Concurrency lanes).
type lane struct {
	key     string
	changes []*change
}

// deliverLoop delivers the queued transactions in batches of up to BatchSize changes and
// confirms each batch's end once all of it is delivered or parked.
func (s *Source) deliverLoop(ctx context.Context, queue <-chan *txn) error {
	for {
		var batch []*txn
		select {
		case <-ctx.Done():
			return nil
		case t := <-queue:
			batch = append(batch, t)
		}
		n := len(batch[0].changes)
	drain:
		for n < s.cfg.BatchSize {
			select {
			case t := <-queue:
				batch = append(batch, t)
				n += len(t.changes)
			default:
				break drain
			}
		}
		deliver := s.deliver
		if s.ob != nil {
			deliver = s.deliverRows
		}
		if err := deliver(ctx, batch); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		maxStore(&s.confirmed, batch[len(batch)-1].end)
		s.mu.Lock()
		s.pending = s.pending[len(batch):]
		s.mu.Unlock()
		s.inflight.Add(-int64(len(batch)))
	}
}

// deliver delivers one batch: lanes run on up to Concurrency goroutines, each lane in order.
func (s *Source) deliver(ctx context.Context, batch []*txn) error {
	byKey := map[string]*lane{}
	var lanes []*lane
	unkeyed := 0
	for _, t := range batch {
		for _, c := range t.changes {
			k := c.key
			id := "k" + k
			if k == "" {
				id = "u" + strconv.Itoa(unkeyed%s.cfg.Concurrency)
				unkeyed++
			}
			l := byKey[id]
			if l == nil {
				l = &lane{key: k}
				byKey[id] = l
				lanes = append(lanes, l)
			}
			l.changes = append(l.changes, c)
		}
	}
	held, err := s.heldKeys(ctx, lanes)
	if err != nil {
		return err
	}
	parkAll := s.overBound.Load()
	if bp, ok := s.cfg.Destination.(forwarder.BatchPublisher); ok && !parkAll {
		s.publishBatch(ctx, bp, lanes, held)
	}
	var mu sync.Mutex
	var first error
	s.runLanes(ctx, lanes, func(l *lane) {
		var err error
		if len(l.changes) == 0 {
			return
		}
		if parkAll || (l.key != "" && held[l.key]) {
			err = s.parkChanges(ctx, l.key, l.changes)
		} else {
			err = s.deliverLane(ctx, l)
		}
		if err != nil {
			mu.Lock()
			first = cmpErr(first, err)
			mu.Unlock()
		}
	})
	if first == nil && ctx.Err() != nil {
		first = ctx.Err()
	}
	return first
}

// runLanes calls fn for each lane on up to Concurrency goroutines (a lane's changes are fn's to
// deliver in order) and returns when every lane handed out is done; no lane is handed out
// after ctx ends.
func (s *Source) runLanes(ctx context.Context, lanes []*lane, fn func(*lane)) {
	work := make(chan *lane)
	var wg sync.WaitGroup
	for range min(s.cfg.Concurrency, len(lanes)) {
		wg.Go(func() {
			for l := range work {
				fn(l)
			}
		})
	}
	for _, l := range lanes {
		select {
		case work <- l:
		case <-ctx.Done():
		}
	}
	close(work)
	wg.Wait()
}

func cmpErr(first, err error) error {
	if first != nil {
		return first
	}
	return err
}

// deliverLane publishes a lane's changes in order; the first change that fails MaxAttempts
// times is parked with every later change of the lane.
func (s *Source) deliverLane(ctx context.Context, l *lane) error {
	for i, c := range l.changes {
		if s.publish(ctx, c) != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return s.parkChanges(ctx, l.key, l.changes[i:])
		}
	}
	return nil
}

// publish tries c up to MaxAttempts times with backoff; nil once delivered, else the last
// attempt's error (or ctx's).
func (s *Source) publish(ctx context.Context, c *change) error {
	wait := s.cfg.RetryBackoff
	for attempt := 1; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, s.cfg.DeliveryTimeout)
		msg := newMessage(actx, c, attempt)
		err := s.cfg.Destination.Publish(c.topic, msg)
		cancel()
		if err == nil {
			s.delivered.Add(1)
			return nil
		}
		if attempt >= s.cfg.MaxAttempts || ctx.Err() != nil || s.overBound.Load() {
			what := "wal: delivery failed; parking the change in the outbox table"
			if c.row != nil {
				what = "wal: delivery failed; leaving the event to the relay polling the outbox table"
			}
			s.cfg.Logger.Error(what, err, watermill.LogFields{"event_id": msg.UUID, "topic": c.topic, "ordering_key": c.key, "attempts": attempt})
			return err
		}
		s.retries.Add(1)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
		wait = min(wait*2, s.cfg.MaxBackoff)
	}
}

// newMessage is the Watermill message of c: the event id as UUID and the outbox metadata the
// relay sets (event id, topic, ordering key, attempt; for an outbox row also its headers and
// sequence, as the Subscriber emits them).
func newMessage(ctx context.Context, c *change, attempt int) *message.Message {
	if c.row != nil {
		return c.row.message(ctx, c, attempt)
	}
	msg := message.NewMessage(c.id.String(), message.Payload(c.payload))
	msg.Metadata[outbox.MetadataEventID] = msg.UUID
	msg.Metadata[outbox.MetadataTopic] = c.topic
	if c.key != "" {
		msg.Metadata[outbox.MetadataOrderingKey] = c.key
	}
	msg.Metadata[outbox.MetadataAttempt] = strconv.Itoa(attempt)
	msg.SetContext(ctx)
	return msg
}

// publishBatch gives the lanes that are not held to a batch destination in one PublishBatch
// call (each lane's changes in order) and removes from each lane the prefix the destination
// acknowledged; what remains of a lane (from its first failed change) takes the one-by-one path
// with its retries and parking. It returns the acknowledged changes.
func (s *Source) publishBatch(ctx context.Context, bp forwarder.BatchPublisher, lanes []*lane, held map[string]bool) (acks []*change) {
	bctx, cancel := context.WithTimeout(ctx, s.cfg.DeliveryTimeout)
	defer cancel()
	var out []forwarder.Outgoing
	for _, l := range lanes {
		if l.key != "" && held[l.key] {
			continue
		}
		for _, c := range l.changes {
			out = append(out, forwarder.Outgoing{Topic: c.topic, Message: newMessage(bctx, c, 1)})
		}
	}
	if len(out) == 0 {
		return nil
	}
	results := bp.PublishBatch(bctx, out)
	i := 0
	for _, l := range lanes {
		if l.key != "" && held[l.key] {
			continue
		}
		// acked counts the lane's leading acknowledged changes only.
		acked, failed := 0, false
		for range l.changes {
			if !failed && i < len(results) && results[i] == nil {
				acked++
			} else {
				failed = true
			}
			i++
		}
		s.delivered.Add(uint64(acked))
		if acked < len(l.changes) {
			s.retries.Add(1)
		}
		acks = append(acks, l.changes[:acked]...)
		l.changes = l.changes[acked:]
	}
	return acks
}

// parkChunk bounds the idempotency keys (one per change) of one parking insert, under the
// Publisher's per-call key cap.
const parkChunk = 500

// parkChanges writes changes as outbox rows (the relay delivers, retries and dead-letters
// them), with the change's event id as id and "wal:<id>" as idempotency key so a change
// parked again after a restart is not written twice. It retries until it succeeds or ctx
// ends: the batch is not confirmed without it.
func (s *Source) parkChanges(ctx context.Context, key string, changes []*change) error {
	ins := make([]outbox.EventInput, len(changes))
	for i, c := range changes {
		ins[i] = outbox.EventInput{ID: c.id, Topic: c.topic, Payload: c.payload, OrderingKey: c.key, IdempotencyKey: "wal:" + c.id.String()}
	}
	if key != "" {
		s.mu.Lock()
		s.parkKeys[key] = struct{}{}
		s.mu.Unlock()
	}
	wait := s.cfg.RetryBackoff
	for len(ins) > 0 {
		n := min(len(ins), parkChunk)
		if _, err := s.park.EnqueueMany(ctx, ins[:n]); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			s.cfg.Logger.Error("wal: parking failed; retrying", err, watermill.LogFields{"ordering_key": key, "backoff": wait})
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(wait):
			}
			wait = min(wait*2, s.cfg.MaxBackoff)
			continue
		}
		s.parked.Add(uint64(n))
		ins = ins[n:]
	}
	return nil
}

// heldKeys returns the keys of lanes that still have unpublished rows in the outbox table
// among the keys parked before; keys without any are forgotten.
func (s *Source) heldKeys(ctx context.Context, lanes []*lane) (map[string]bool, error) {
	s.mu.Lock()
	var keys []string
	for _, l := range lanes {
		if _, ok := s.parkKeys[l.key]; ok && l.key != "" {
			keys = append(keys, l.key)
		}
	}
	s.mu.Unlock()
	held := map[string]bool{}
	if len(keys) == 0 {
		return held, nil
	}
	rows, err := s.pool.Query(ctx, fmt.Sprintf(`SELECT DISTINCT "ordering_key" FROM %s WHERE "published_at" IS NULL AND "ordering_key" = ANY($1)`, s.outbox), keys)
	if err != nil {
		return nil, fmt.Errorf("wal: read parked keys: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			return nil, err
		}
		held[k] = true
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("wal: read parked keys: %w", err)
	}
	s.mu.Lock()
	for _, k := range keys {
		if !held[k] {
			delete(s.parkKeys, k)
		}
	}
	s.mu.Unlock()
	return held, nil
}

// loadParked reads the keys that have unpublished rows in the outbox table (parked by an
// earlier run, or published by writers): changes of those keys wait behind them.
func (s *Source) loadParked(ctx context.Context) error {
	rows, err := s.pool.Query(ctx, fmt.Sprintf(`SELECT DISTINCT "ordering_key" FROM %s WHERE "published_at" IS NULL AND "ordering_key" IS NOT NULL`, s.outbox))
	if err != nil {
		return fmt.Errorf("wal: read parked keys: %w", err)
	}
	defer rows.Close()
	keys := map[string]struct{}{}
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			return err
		}
		keys[k] = struct{}{}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("wal: read parked keys: %w", err)
	}
	s.mu.Lock()
	s.parkKeys = keys
	s.mu.Unlock()
	return nil
}
