package engine

import (
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
)

// An acked item's flush state: not written yet (the batch's mark writes it), written as
// published by a flush, or refused by a flush's fence (another relay holds the lease now).
const (
	flushNone = iota
	flushWritten
	flushRefused
)

// flusher writes the acks of the batch that is out every MarkInterval, so a relay that is
// killed mid-batch repeats only the deliveries acked since the last write.
//
// Only an ack whose key's earlier events of the batch are all acked is written (unordered
// events always), so the table never shows a key's event published before an earlier one; and
// a continuation's acks (subscription.contKeys) only once the marks of the batch it continues
// are written and confirmed its key, for the same reason (see subscription.confirm).
type flusher struct {
	sub   *subscription
	token string
	items []*item // the emitted batch, in sequence order
	prev  *marks  // the marks of the batch whose runs it continues (nil: none)
	stopc chan struct{}
	wg    sync.WaitGroup
	// mu serialises flushes with lease renewals: a renewal expects every row of the batch
	// not yet written as published or set aside (len(items) − written − setAside) to be still
	// leased by the token.
	mu      sync.Mutex
	written int
	// setAside counts the batch's events released before emission (see isolate): no
	// longer expected leased either.
	setAside int
}

// newFlusher returns the flusher of the batch claimed under token, not started: its count of
// written acks serves the lease renewal from the claim on.
func (sub *subscription) newFlusher(token string) *flusher {
	return &flusher{sub: sub, token: token, stopc: make(chan struct{})}
}

// start starts flushing the acks of items, the batch's emitted events; prev is the marks of
// the batch whose runs it continues (nil: none). Call stop before reading the items' states.
func (f *flusher) start(items []*item, prev *marks) {
	f.items, f.prev = items, prev
	f.wg.Add(1)
	go f.run()
}

func (f *flusher) run() {
	defer f.wg.Done()
	if !f.sub.s.caps.FlushAcks {
		// SQLite has one writer: each flush would take the database's write lock beside the
		// writers' transactions (under Watermill's universal suite, 20 parallel publishers then
		// waited past the 10 s busy timeout). Its acks are written at the batch's end.
		<-f.stopc
		return
	}
	t := time.NewTicker(f.sub.s.cfg.MarkInterval)
	defer t.Stop()
	for {
		select {
		case <-f.stopc:
			return
		case <-t.C:
			f.flush()
		}
	}
}

// stop ends the flusher and waits for a flush in progress.
func (f *flusher) stop() {
	close(f.stopc)
	f.wg.Wait()
}

// prevConfirmed reports whether the marks of the batch this one continues are written and
// wrote key's acks.
func (f *flusher) prevConfirmed(key string) bool {
	if f.prev == nil {
		return true
	}
	select {
	case <-f.prev.done:
		return !f.prev.unconfirmed[key]
	default:
		return false
	}
}

// flush writes the acks that may be written now, in one statement.
func (f *flusher) flush() {
	var (
		pick    []*item
		blocked map[string]bool
	)
	for _, it := range f.items {
		k := it.ev.OrderingKey
		if k != "" && blocked[k] {
			continue
		}
		if it.flushed != flushNone {
			continue
		}
		if !it.acked.Load() || (it.cont && !f.prevConfirmed(k)) {
			if k != "" {
				if blocked == nil {
					blocked = map[string]bool{}
				}
				blocked[k] = true
			}
			continue
		}
		pick = append(pick, it)
	}
	if len(pick) == 0 {
		return
	}
	seqs := make([]int64, len(pick))
	byseq := make(map[int64]*item, len(pick))
	for i, it := range pick {
		seqs[i] = it.ev.Sequence
		byseq[it.ev.Sequence] = it
	}
	f.mu.Lock()
	results, err := f.sub.writeMarks(f.token, markSets{acked: seqs, eager: pick[0].eager})
	if err == nil {
		f.written += len(results)
	}
	f.mu.Unlock()
	if err != nil {
		// Left to the batch's mark, which tries them again.
		f.sub.s.logger.Info("outbox: writing acks of a batch in flight failed; the batch's mark writes them", watermill.LogFields{"token": f.token, "error": err.Error()})
		return
	}
	done := make(map[int64]bool, len(results))
	for _, r := range results {
		done[r.Seq] = true
	}
	for _, it := range pick {
		if done[it.ev.Sequence] {
			it.flushed = flushWritten
		} else {
			it.flushed = flushRefused
		}
	}
	f.sub.leaseLost(f.token, len(pick)-len(results))
	f.sub.reportMarks(results, byseq, true)
}
