package outbox

import "time"

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
