package engine

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/watermill-outbox/outbox/internal/dialect"
)

// event is what the engine reads of a claimed event; user is the root package's view of it
// (Host.Event), which Host.Message receives.
type event struct {
	Sequence                 int64
	Topic, OrderingKey       string
	CreatedAt                time.Time
	Attempts, DeliveryStarts int
	user                     any
}

// item is one claimed event on its way out. Its claim fields are written by the poll
// goroutine before emitting; its answer fields (msg … notAttempted) by the goroutine that
// awaits its answer, and read by the poll goroutine once the batch is over.
type item struct {
	ev event
	id string // the event id

	rank int64 // position in its key's run, 1 for the head; 0 for unordered
	cont bool  // leased as a continuation of the previous batch's run of its key
	// follow: the key was claimed below the keyed floor (a retry, or an event an operator took
	// back from the dead letters) or continued as such, so its later events lie below the floor
	// too: its run, acked whole, is continued like a full one (see continueRuns), since no walk
	// finds those events any more (PostgreSQL floors).
	follow bool
	// eager: claimed with eager locking, and so are its batch's marks (see eagerClaim).
	eager  bool
	msg    *message.Message
	ans    Answerer
	cancel context.CancelFunc // cancels msg's context once it is answered
	state  int
	err    error
	perm   bool // a failure the destination called permanent: dead-lettered now
	// notAttempted: released because the destination never judged it (ErrNotAttempted)
	notAttempted bool
	// acked is set by the goroutine that sees the Ack, for the flusher (state is read only
	// once the batch is over); flushed is the flusher's (flushNone, flushWritten,
	// flushRefused), read by mark after the flusher stopped.
	acked   atomic.Bool
	flushed int
	// dest is the destination Config.Destination named for its message ("" without one);
	// holdFor how long a held item waits (stateHeld); limited the flow-control state whose
	// in-flight slot it holds while out. Written by the goroutine that emits the batch.
	dest       string
	holdFor    time.Duration
	holdReason string // HeldOutage, HeldRate or HeldInFlight
	limited    *limited
}

const (
	stateClaimed   = iota // not emitted
	stateAcked            // delivered
	stateFailed           // counts an attempt
	stateReleased         // lease given back, no attempt
	stateAbandoned        // emitted, no answer within CloseTimeout of a stop: released, no attempt
	// stateUnavailable: the destination was unavailable (ErrUnavailable); released with
	// last_error noted, no attempt
	stateUnavailable
	// stateSetAside: released before emission with its start taken back, already written
	// (see isolate); the batch's mark skips it
	stateSetAside
	// stateHeld: not emitted, or refused, while its destination is in an outage or over its
	// rate (see destinations.go): released with its start uncounted, due again after holdFor
	stateHeld
)

// failed records a Nack's error: a failure, a permanent failure, an unavailable destination or
// a delivery not attempted (released), as classify says.
func (it *item) failed(err error, classify func(error) Class) {
	if err == nil {
		err = ErrNacked
	}
	it.err = err
	class := classify(err)
	switch class {
	case ClassNotAttempted:
		it.state, it.notAttempted = stateReleased, true
	case ClassUnavailable:
		it.state = stateUnavailable
	case ClassPermanent:
		it.state, it.perm = stateFailed, true
	default:
		it.state = stateFailed
	}
}

// itemsOf returns the items of a claim's leased events.
func (sub *subscription) itemsOf(evs []dialect.Claimed) []*item {
	items := make([]*item, 0, len(evs))
	for i := range evs {
		c := &evs[i]
		user, id := sub.s.host.Event(c)
		ev := event{Sequence: c.Sequence, Topic: c.Topic, CreatedAt: c.CreatedAt, Attempts: c.Attempts,
			DeliveryStarts: c.DeliveryStarts, user: user}
		if c.OrderingKey != nil {
			ev.OrderingKey = *c.OrderingKey
		}
		items = append(items, &item{ev: ev, id: id, rank: c.Rank})
	}
	return items
}

// rankRuns ranks the events of a claim that leases only gap-free runs without reporting ranks
// (SQLite: one writer, no SKIP LOCKED gaps): 1 for a key's head, then 2, 3 … Items are in
// sequence order.
func rankRuns(items []*item) {
	ranks := map[string]int64{}
	for _, it := range items {
		if it.rank >= 0 {
			continue
		}
		it.rank = 0
		if k := it.ev.OrderingKey; k != "" {
			ranks[k]++
			it.rank = ranks[k]
		}
	}
}
