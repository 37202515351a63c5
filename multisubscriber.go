package outbox

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
)

// MetadataTable is the metadata key a MultiSubscriber sets on every message it emits: the
// outbox table (as named in MultiSubscriberConfig.Tables) the event was read from, so a
// handler knows the tenant of a schema-per-tenant layout. It is reserved like the other
// outbox-* keys: a Publisher never stores it as a header.
const MetadataTable = "outbox-table"

// MultiSubscriberConfig configures a MultiSubscriber: one relay over several outbox tables of
// one dialect (a schema per tenant). The zero value is invalid: Tables must name at least one
// table.
type MultiSubscriberConfig struct {
	// Tables are the outbox tables, each as SchemaConfig.Table ("tenant_a.watermill_outbox"),
	// at least one, each once. Every table has the shape Subscriber.Schema describes (dialect,
	// payload type, extra columns, idempotency scope); Subscriber.Schema.Table must be empty.
	// The list is fixed when the MultiSubscriber is built: a table created later is relayed
	// by a MultiSubscriber built after it (the CLI resolves its --table pattern at start).
	Tables []string
	// Subscriber configures each table's relay exactly as SubscriberConfig documents: every
	// limit (BatchSize, Concurrency, PollInterval …) applies per table, so the events out at
	// once are at most len(Tables)·Concurrency, and an idle table costs one claim per
	// PollInterval. Ordering keys are per table: the same key in two tables is two keys.
	Subscriber SubscriberConfig
	// HooksFor, when set, returns the Hooks of one table's relay instead of
	// Subscriber.Hooks: the way to label measurements by table (see package metrics). It is
	// called once per table by NewMultiSubscriber.
	HooksFor func(table string) Hooks
	// WakeupFor, when set, returns the Wakeup of one table's relay instead of
	// Subscriber.Wakeup, so a signal wakes only that table's relay (with a shared Wakeup,
	// each signal makes every table's relay claim once). Called once per table; nil results
	// mean polling only.
	WakeupFor func(table string) Wakeup
}

// Validate returns a *ConfigError naming the first invalid field, or nil.
func (c MultiSubscriberConfig) Validate() error {
	if len(c.Tables) == 0 {
		return &ConfigError{Field: "MultiSubscriberConfig.Tables", Reason: "at least one table"}
	}
	if c.Subscriber.Schema.Table != "" {
		return &ConfigError{Field: "MultiSubscriberConfig.Subscriber.Schema.Table", Reason: "must be empty: the tables are MultiSubscriberConfig.Tables"}
	}
	seen := map[string]int{}
	for i, t := range c.Tables {
		cfg := c.Subscriber
		cfg.Schema.Table = t
		if err := cfg.Validate(); err != nil {
			return &ConfigError{Field: fmt.Sprintf("MultiSubscriberConfig.Tables[%d]", i), Reason: fmt.Sprintf("table %q", t), Err: err}
		}
		s, _ := cfg.Schema.compile()
		if j, dup := seen[s.table]; dup {
			return &ConfigError{Field: fmt.Sprintf("MultiSubscriberConfig.Tables[%d]", i), Reason: fmt.Sprintf("table %q is also Tables[%d]", t, j)}
		}
		seen[s.table] = i
	}
	return nil
}

// MultiSubscriber is a Watermill message.Subscriber over several outbox tables of one
// dialect: one Subscriber per table, sharing the database handle, whose messages are merged
// fairly into one channel per subscription. The merge takes one message at a time, from a
// table picked uniformly at random among those whose relay has one ready, so a table with a
// large backlog gets no more turns than any other ready table: an event of a quiet table waits
// for about one message of each other ready table before it is emitted (on average), never for
// the backlog. Only the message handed to the consumer next is held by the merge, so waiting
// for a turn does not use up a message's DeliveryTimeout. Leases, retries,
// dead letters, fencing and order per ordering key are each table's Subscriber's.
//
// A MultiSubscriber is safe for concurrent use. Close stops every subscription.
type MultiSubscriber struct {
	tables []string
	subs   []*Subscriber
	logger watermill.LoggerAdapter

	closing   chan struct{}
	closeMu   sync.RWMutex // held for reading while a subscription starts, for writing by Close
	closed    bool
	closeOnce sync.Once
	wg        sync.WaitGroup
}

// NewMultiSubscriber returns a MultiSubscriber over cfg.Tables through db (the handles
// NewSubscriber takes; a pool is shared by every table's relay, so size it for about two
// connections per busy table). A nil logger means watermill.NopLogger. Errors: a *ConfigError
// for an invalid config or handle. It runs no SQL.
func NewMultiSubscriber(db any, cfg MultiSubscriberConfig, logger watermill.LoggerAdapter) (*MultiSubscriber, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	m := &MultiSubscriber{tables: append([]string(nil), cfg.Tables...), logger: logger, closing: make(chan struct{})}
	for _, t := range cfg.Tables {
		c := cfg.Subscriber
		c.Schema.Table = t
		if cfg.HooksFor != nil {
			c.Hooks = cfg.HooksFor(t)
		}
		if cfg.WakeupFor != nil {
			c.Wakeup = cfg.WakeupFor(t)
		}
		s, err := NewSubscriber(db, c, logger)
		if err != nil {
			return nil, err
		}
		m.subs = append(m.subs, s)
	}
	return m, nil
}

// Tables returns the tables relayed, in MultiSubscriberConfig.Tables order.
func (m *MultiSubscriber) Tables() []string { return append([]string(nil), m.tables...) }

// Subscriber returns the Subscriber of table (as named in MultiSubscriberConfig.Tables), for
// its operations (Backlog, RetryDeadLettered, Outages …), or nil for a table not relayed.
func (m *MultiSubscriber) Subscriber(table string) *Subscriber {
	for i, t := range m.tables {
		if t == table {
			return m.subs[i]
		}
	}
	return nil
}

// Subscribe returns the messages of the topics that topic selects (see Subscriber.Subscribe)
// from every table, merged fairly (see MultiSubscriber), each with MetadataTable set. The
// channel is closed when ctx ends or the MultiSubscriber closes. A message the consumer has not
// received when ctx ends is released (no attempt counted) and delivered again. Errors: a *ConfigError for a bad pattern, ErrClosed after Close.
func (m *MultiSubscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	return subscribeAll(ctx, m, topic, (*Subscriber).Subscribe, func(msg *message.Message, table string) {
		msg.Metadata.Set(MetadataTable, table)
	}, dropMessage)
}

// SubscribeBatches is Subscribe for batch destinations: each table's claimed batches whole
// (see Batch; a batch holds one table's events), merged fairly, every message with
// MetadataTable set. Errors as Subscribe.
func (m *MultiSubscriber) SubscribeBatches(ctx context.Context, topic string) (<-chan Batch, error) {
	return subscribeAll(ctx, m, topic, (*Subscriber).SubscribeBatches, func(b Batch, table string) {
		for _, msg := range b.Messages {
			msg.Metadata.Set(MetadataTable, table)
		}
	}, func(b Batch) {
		for _, msg := range b.Messages {
			dropMessage(msg)
		}
	})
}

// subscribeAll subscribes every table's Subscriber and merges their channels into one. One
// goroutine receives from whichever table channels are ready (reflect.Select picks among them
// uniformly at random, so a busy table does not starve the others) and holds that one value
// until the consumer takes it. Holding one value, not one per table, matters: a Subscriber
// starts an event's DeliveryTimeout when its channel hands the event over, so values waiting
// their turn in the merge would use up their timeouts before the consumer saw them (with one
// goroutine per table, a consumer acking each message in 450 ms of 1 s had 10 of 17
// deliveries time out over 3 tables). A value not taken when ctx ends or the MultiSubscriber
// closes is nacked as not attempted (see drop), so its Subscriber releases it at once.
func subscribeAll[T any](ctx context.Context, m *MultiSubscriber, topic string,
	subscribe func(*Subscriber, context.Context, string) (<-chan T, error), tag func(T, string), drop func(T)) (<-chan T, error) {
	m.closeMu.RLock()
	defer m.closeMu.RUnlock()
	if m.closed {
		return nil, ErrClosed
	}
	ctx, cancel := context.WithCancel(ctx)
	ins := make([]<-chan T, len(m.subs))
	for i, s := range m.subs {
		in, err := subscribe(s, ctx, topic)
		if err != nil {
			cancel() // ends the subscriptions already started
			return nil, err
		}
		ins[i] = in
	}
	out := make(chan T)
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		defer close(out)
		defer cancel()
		// cases[0] and [1] end the merge's forwarding; the rest are the tables' channels
		// (removed as they close), table[j] naming cases[j+2]'s table.
		cases := []reflect.SelectCase{
			{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(ctx.Done())},
			{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(m.closing)},
		}
		table := make([]string, 0, len(ins))
		for i, in := range ins {
			cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(in)})
			table = append(table, m.tables[i])
		}
		stopping := false
		for len(cases) > 2 {
			chosen, v, ok := reflect.Select(cases)
			if chosen < 2 {
				// Stop forwarding; keep receiving until every table's channel closes (the
				// Subscribers stop emitting once ctx ends), dropping what still comes.
				stopping = true
				cases[0].Chan, cases[1].Chan = reflect.Value{}, reflect.Value{}
				cancel()
				continue
			}
			if !ok {
				cases = append(cases[:chosen], cases[chosen+1:]...)
				table = append(table[:chosen-2], table[chosen-1:]...)
				continue
			}
			val := v.Interface().(T)
			if stopping {
				drop(val)
				continue
			}
			tag(val, table[chosen-2])
			select {
			case out <- val:
			case <-ctx.Done():
				drop(val)
			case <-m.closing:
				drop(val)
			}
		}
	}()
	m.logger.Info("outbox: relaying several tables", watermill.LogFields{"tables": len(m.tables), "topic": topic})
	return out, nil
}

// dropMessage nacks a merged message the consumer never received as not attempted: its
// Subscriber releases it (no attempt counted) instead of waiting CloseTimeout for an answer.
func dropMessage(msg *message.Message) {
	SetNackError(msg, NotAttempted(errors.New("outbox: the MultiSubscriber stopped before the consumer received it")))
	msg.Nack()
}

// Close stops every table's subscriptions (see Subscriber.Close) and closes the output
// channels. Idempotent; always returns nil.
func (m *MultiSubscriber) Close() error {
	m.closeOnce.Do(func() {
		m.closeMu.Lock()
		m.closed = true
		close(m.closing)
		m.closeMu.Unlock()
	})
	for _, s := range m.subs {
		_ = s.Close()
	}
	m.wg.Wait()
	return nil
}

// Backlog returns the tables' backlogs added up: Pending, DeadLettered, Unavailable and Held are
// sums, OldestPendingAge the largest (one query per table, in turn). Errors: the first
// table's error, wrapped with its name. Safe for concurrent use, also after Close.
func (m *MultiSubscriber) Backlog(ctx context.Context) (Backlog, error) {
	var sum Backlog
	for i, s := range m.subs {
		b, err := s.Backlog(ctx)
		if err != nil {
			return Backlog{}, fmt.Errorf("outbox: backlog of %s: %w", m.tables[i], err)
		}
		sum.Pending += b.Pending
		sum.DeadLettered += b.DeadLettered
		sum.Unavailable += b.Unavailable
		sum.Held += b.Held
		sum.OldestPendingAge = max(sum.OldestPendingAge, b.OldestPendingAge)
	}
	return sum, nil
}
