package outbox

import (
	"time"

	"github.com/watermill-outbox/outbox/internal/dialect"
)

// SetSweepInterval sets how often subscriptions sweep below their floors and returns a function
// that restores it (tests only; not safe beside running Subscribers).
func SetSweepInterval(d time.Duration) (restore func()) {
	old := sweepInterval
	sweepInterval = d
	return func() { sweepInterval = old }
}

// PollWait is pollWait (tests only).
func PollWait(pollInterval time.Duration, held int) time.Duration {
	return pollWait(pollInterval, held)
}

// ProbeTracker is probeTracker (tests only): Observe feeds it one probe reading.
type ProbeTracker struct{ t probeTracker }

// NewProbeTracker returns a tracker that watches transactions for at most expire.
func NewProbeTracker(expire time.Duration) *ProbeTracker {
	return &ProbeTracker{t: probeTracker{expire: expire}}
}

// WantSnapshot is probeTracker.wantSnapshot.
func (p *ProbeTracker) WantSnapshot() bool { return p.t.wantSnapshot() }

// Quiet is probeTracker.quiet.
func (p *ProbeTracker) Quiet(now time.Time, d time.Duration) bool { return p.t.quiet(now, d) }

// Observe is probeTracker.observe for a reading of the counter, the snapshot's xmax and list,
// and the backends' transactions (nil: not listed).
func (p *ProbeTracker) Observe(counter int64, xmax uint32, inProgress, running []uint32, now time.Time) bool {
	return p.t.observe(dialect.ProbeState{Counter: counter, Xmax: xmax, InProgress: inProgress, Running: running}, now)
}

// ProbeWait returns the wake probe's wait for interval after polls woken by it: each entry of
// leased says whether that poll leased events.
func ProbeWait(interval time.Duration, leased ...bool) time.Duration {
	w := &wakeProbe{interval: interval}
	for _, l := range leased {
		if l {
			w.workedWake()
		} else {
			w.emptyWake()
		}
	}
	return w.wait()
}
