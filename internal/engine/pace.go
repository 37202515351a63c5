package engine

import (
	"slices"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/watermill-outbox/outbox/internal/dialect"
)

func (sub *subscription) run() {
	s := sub.s
	defer sub.waitMarks()
	defer sub.releaseNext()
	defer func() {
		// The subscription stops treating its destinations as unavailable: say so
		// (Hooks.OnOutage with Ended), or an observer's gauge stays up for good.
		now := time.Now()
		for _, o := range sub.outages {
			sub.outageHook(o, now)
		}
		sub.outages = nil
		sub.publishOutages()
	}()
	var wake <-chan struct{}
	if s.cfg.Wakeup != nil {
		wake = s.cfg.Wakeup(sub.ctx, sub.sel.Match)
	}
	var probed <-chan struct{}
	if s.probe != nil {
		probed = s.probe.listen(sub.ctx)
	}
	sub.takeBack()
	if sw, ok := sub.relay.(dialect.Sweeper); ok && sub.sweep != nil {
		var wg sync.WaitGroup
		defer wg.Wait()
		wg.Add(1)
		go func() {
			defer wg.Done()
			sub.sweep.run(sub.ctx, sub, sw)
		}()
	}
	var (
		failures   int // polls failed in a row
		failedFrom time.Time
	)
	probeWoken := false // this poll was started by the wake probe
	for sub.ctx.Err() == nil {
		polled := time.Now()
		again, err := sub.poll()
		if probeWoken && err == nil {
			if again {
				s.probe.workedWake()
			} else {
				s.probe.emptyWake()
			}
		}
		probeWoken = false
		if err != nil {
			if sub.ctx.Err() != nil {
				return
			}
			failures++
			if failures == 1 {
				failedFrom = time.Now()
				s.logger.Error("outbox: poll failed; retrying with backoff", err, nil)
			} else {
				s.logger.Debug("outbox: poll failed again", watermill.LogFields{"error": err.Error(), "failures": failures})
			}
		} else if failures > 0 {
			s.logger.Info("outbox: database answers again; polling resumed", watermill.LogFields{
				"failed_polls": failures, "unavailable_for": time.Since(failedFrom).Round(time.Millisecond).String()})
			failures = 0
		}
		if again && err == nil {
			continue
		}
		wait := pollWait(s.cfg.PollInterval, sub.heldPolls)
		if failures > 0 {
			wait = pollRetryWait(failures, s.cfg.PollInterval)
		}
		now := time.Now()
		if due := sub.nextRetryDue(polled); due != 0 {
			if d := time.Unix(0, due).Sub(now); d < wait {
				wait = max(d, 0)
			}
		}
		if at := sub.nextProbeAt(now); !at.IsZero() && at.Sub(now) < wait {
			wait = max(at.Sub(now), 0)
		}
		timer := time.NewTimer(wait)
		select {
		case <-sub.ctx.Done():
		case <-timer.C:
			sub.woken = false
		case <-wake:
			sub.woken = true
		case <-probed:
			sub.woken, probeWoken = true, true
		}
		timer.Stop()
	}
}

// pollWait is the wait after a poll that leased nothing, the held-th in a row whose claim
// found claimable keyed events of keys held elsewhere (0: not such a poll): PollInterval,
// doubled for each such poll up to heldWait (never less than PollInterval): a relay beside
// another that holds a few hot keys would otherwise run empty claims at every PollInterval, at
// the cost of CPU the relay holding the keys needs. Events committed meanwhile still wake it
// (Wakeup), and a key the other relay leaves out (continueRuns) waits at most heldWait.
func pollWait(pollInterval time.Duration, held int) time.Duration {
	if held <= 0 || pollInterval >= heldWait {
		return pollInterval
	}
	return min(pollInterval<<min(held, 8), heldWait)
}

// heldWait bounds the backoff of pollWait.
const heldWait = 100 * time.Millisecond

// pollRetryWait is the wait after the n-th failed poll in a row: 100 ms doubling, at most
// maxPollRetryWait (and PollInterval), so that a relay claims within about half a second
// of the database accepting connections again.
func pollRetryWait(n int, pollInterval time.Duration) time.Duration {
	return min(100*time.Millisecond<<min(n-1, 10), maxPollRetryWait, pollInterval)
}

const maxPollRetryWait = 500 * time.Millisecond

// noteRetry records that an event this relay failed is due again at next (now and next from
// the mark's clock), so that the poll loop polls then. Safe for concurrent use.
func (sub *subscription) noteRetry(now, next time.Time) {
	// Rounded up to the millisecond: a poll a little early would find the event not yet due
	// and drop its due time.
	due := time.Now().Add(next.Sub(now)).Truncate(time.Millisecond).Add(time.Millisecond).UnixNano()
	sub.retryMu.Lock()
	defer sub.retryMu.Unlock()
	i, found := slices.BinarySearch(sub.retryDues, due)
	if found || i == maxRetryDues {
		return
	}
	sub.retryDues = slices.Insert(sub.retryDues, i, due)
	if len(sub.retryDues) > maxRetryDues {
		sub.retryDues = sub.retryDues[:maxRetryDues]
	}
}

// maxRetryDues bounds subscription.retryDues; later dues are left to PollInterval.
const maxRetryDues = 1024

// nextRetryDue drops the retry dues up to polled (the start of the last poll, which claimed
// what was due by then) and returns the next one (0: none).
func (sub *subscription) nextRetryDue(polled time.Time) int64 {
	sub.retryMu.Lock()
	defer sub.retryMu.Unlock()
	i, _ := slices.BinarySearch(sub.retryDues, polled.UnixNano()+1)
	sub.retryDues = sub.retryDues[i:]
	if len(sub.retryDues) == 0 {
		return 0
	}
	return sub.retryDues[0]
}
