package engine

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// newMessage builds the Watermill message of an event.
func (sub *subscription) newMessage(ctx context.Context, it *item) *message.Message {
	it.msg, it.ans, it.cancel = sub.s.host.Message(ctx, it.ev.user, it.id)
	return it.msg
}

// await waits for msg's answer and records it in it; mctx ending (CloseTimeout after a stop,
// or a lost lease) leaves it unanswered (stateAbandoned). The DeliveryTimeout ends with timeout
// (a batch's, shared) or expire (one message's timer); the other is nil.
func (sub *subscription) await(mctx context.Context, it *item, timeout <-chan struct{}, expire <-chan time.Time) {
	defer it.cancel()
	select {
	case <-it.msg.Acked():
		it.state = stateAcked
		it.acked.Store(true)
	case <-it.msg.Nacked():
		it.failed(it.ans.NackError(), sub.s.host.Classify)
	case <-timeout:
		sub.timedOut(it)
	case <-expire:
		sub.timedOut(it)
	case <-mctx.Done():
		// An answer given before the stop counts, whichever the select saw first.
		select {
		case <-it.msg.Acked():
			it.state = stateAcked
			it.acked.Store(true)
		case <-it.msg.Nacked():
			it.failed(it.ans.NackError(), sub.s.host.Classify)
		default:
			it.state = stateAbandoned
		}
	}
	stopped := mctx.Err() != nil // CloseTimeout after a stop, or a lost lease
	if it.state == stateFailed && !it.perm && (sub.ctx.Err() != nil || stopped) &&
		(errors.Is(it.err, context.Canceled) || stopped && errors.Is(it.err, ErrNacked)) {
		// The relay is stopping and the delivery failed because its context was canceled by
		// that stop (a handler that returned ctx.Err() under a Router without RecordError is
		// a bare Nack): the destination did not judge the event, so no attempt is counted
		// (it is released and delivered again).
		it.state, it.err = stateReleased, nil
	}
}

// timedOut records that it's DeliveryTimeout passed unanswered.
func (sub *subscription) timedOut(it *item) {
	it.state, it.err = stateFailed, ErrDeliveryTimeout
	if sub.ctx.Err() != nil {
		// The DeliveryTimeout passed while the relay waits for its stop (CloseTimeout):
		// the stop, not the destination, ends the delivery; no attempt is counted.
		it.state, it.err = stateAbandoned, nil
	}
}

// lane is one ordering key's run (or one unordered event): delivered one after another.
type lane struct {
	items []*item
	pos   int
}

// deliverEach emits items one message at a time: each lane's next item only after the previous
// was acked, up to Concurrency messages out at once. It returns false if it stopped early.
func (sub *subscription) deliverEach(ctx, mctx context.Context, items []*item, out chan<- *message.Message) bool {
	var lanes []*lane
	byKey := map[string]*lane{}
	laneOf := make(map[*item]*lane, len(items))
	for _, it := range items {
		k := it.ev.OrderingKey
		l := byKey[k]
		if l == nil || k == "" {
			l = &lane{}
			lanes = append(lanes, l)
			if k != "" {
				byKey[k] = l
			}
		}
		l.items = append(l.items, it)
		laneOf[it] = l
	}
	ready := make([]*lane, len(lanes))
	copy(ready, lanes)
	results := make(chan *item, len(items))
	inflight, stopped := 0, false
	var downTopics map[string]bool
	g := &gate{sub: sub, view: sub.view}
	dest := sub.s.cfg.Destination
	release := func(l *lane) {
		for _, rest := range l.items[l.pos+1:] {
			rest.state = stateReleased
		}
	}
	for {
		for !stopped && inflight < sub.s.cfg.Concurrency && len(ready) > 0 {
			l := ready[0]
			ready = ready[1:]
			if ctx.Err() != nil {
				// Stopped (closing, or the lease was lost): a select with a reader waiting
				// would pick the send half of the time.
				stopped = true
				continue
			}
			it := l.items[l.pos]
			if downTopics[it.ev.Topic] {
				continue // released below, with the rest of its lane
			}
			msg := sub.newMessage(mctx, it)
			if dest != nil {
				if it.dest = dest(it.ev.Topic, msg); it.dest != "" {
					if ok, waiting := g.admit(it, l, time.Now()); !ok {
						it.cancel()
						if !waiting {
							release(l)
						}
						continue
					}
				}
			}
			select {
			case out <- msg:
			case <-ctx.Done():
				if it.limited != nil {
					g.answered(it)
				}
				it.cancel()
				stopped = true
				continue
			}
			inflight++
			// A timer, not a context.WithTimeout: one allocation less per message.
			timer := time.NewTimer(sub.s.cfg.DeliveryTimeout)
			go func() {
				sub.await(mctx, it, nil, timer.C)
				timer.Stop()
				results <- it
			}()
		}
		if inflight == 0 {
			if !stopped {
				for _, l := range g.stranded() {
					l.items[l.pos].hold(sub.s.cfg.UnavailableBackoff, HeldInFlight, fmt.Sprintf("held: destination %q at its MaxInFlight", l.items[l.pos].dest))
					release(l)
				}
			}
			break
		}
		it := <-results
		inflight--
		if r := g.answered(it); r != nil {
			ready = append(ready, r)
		}
		l := laneOf[it]
		switch it.state {
		case stateAcked:
			l.pos++
			if l.pos < len(l.items) {
				ready = append(ready, l)
			}
		case stateFailed, stateUnavailable:
			release(l)
			if it.state == stateUnavailable && it.dest == "" {
				// The rest of the batch's events of this topic stay unsent: released
				// without an attempt, like the refused one.
				if downTopics == nil {
					downTopics = map[string]bool{}
				}
				downTopics[it.ev.Topic] = true
			}
		}
	}
	for _, it := range items {
		if it.state == stateClaimed {
			it.state = stateReleased
		}
	}
	return !stopped
}

// deliverBatch emits the whole batch at once and waits for every answer.
func (sub *subscription) deliverBatch(ctx, mctx context.Context, items []*item, send func(context.Context, []*message.Message) bool) bool {
	msgs := make([]*message.Message, len(items))
	for i, it := range items {
		msgs[i] = sub.newMessage(mctx, it)
	}
	release := func() bool {
		for _, it := range items {
			it.state = stateReleased
		}
		return false
	}
	if ctx.Err() != nil {
		return release()
	}
	if !send(ctx, msgs) {
		return release()
	}
	tctx, cancel := context.WithTimeout(context.Background(), sub.s.cfg.DeliveryTimeout)
	defer cancel()
	var wg sync.WaitGroup
	for _, it := range items {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sub.await(mctx, it, tctx.Done(), nil)
		}()
	}
	wg.Wait()
	failedKey := map[string]bool{}
	for _, it := range items {
		k := it.ev.OrderingKey
		if k == "" {
			continue
		}
		if it.state == stateAbandoned {
			// Unanswered at the stop: it is released and delivered again, so nothing of its
			// key after it may be recorded as published.
			failedKey[k] = true
			continue
		}
		if failedKey[k] {
			// Even when the destination acked it: marking it published would put it before
			// the failed event it follows. It is delivered again after that one (at least
			// once, in order).
			it.state, it.err = stateReleased, nil
			continue
		}
		if it.state == stateFailed || it.state == stateUnavailable || it.state == stateReleased {
			// Released: not attempted (ErrNotAttempted, or cut short by a stop).
			failedKey[k] = true
		}
	}
	return ctx.Err() == nil
}
