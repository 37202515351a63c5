package engine

import (
	"context"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
)

// renewWhileOut renews the batch's lease three times per LeaseDuration until the returned
// function is called (from its claim to the end of its delivery). When a renewal finds the lease no longer held (it expired and another
// relay took the events over), it calls lost, which stops emitting the rest of the batch.
func (sub *subscription) renewWhileOut(token string, items []*item, lost func(), fl *flusher) (stop func()) {
	s := sub.s
	seqs := make([]int64, len(items))
	for i, it := range items {
		seqs[i] = it.ev.Sequence
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(s.cfg.LeaseDuration / 3)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				ctx, cancel := context.WithTimeout(context.Background(), s.cfg.LeaseDuration/3)
				// Rows whose acks the flusher wrote are no longer leased: expect the rest.
				fl.mu.Lock()
				n, err := sub.relay.Renew(ctx, s.db, token, seqs)
				want := int64(len(seqs) - fl.written - fl.setAside)
				fl.mu.Unlock()
				cancel()
				switch {
				case err != nil:
					s.logger.Error("outbox: lease renewal failed", err, watermill.LogFields{"token": token})
				case n < want:
					sub.lostReported.Store(token, true)
					lost()
					s.logger.Error("outbox: lease lost; the rest of the batch is left to the relay that took it over", nil,
						watermill.LogFields{"token": token, "held": n, "claimed": len(seqs)})
					if h := s.hooks.OnLeaseLost; h != nil {
						h(LeaseLostInfo{Token: token, Events: int(want - n)})
					}
					return
				}
			}
		}
	}()
	return func() { close(done); wg.Wait() }
}
