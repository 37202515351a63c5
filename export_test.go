package outbox

import "time"

// SetSweepInterval sets how often the subscriptions of Subscribers created afterwards sweep
// below their floors and returns a function that restores it (tests only).
func SetSweepInterval(d time.Duration) (restore func()) {
	old := sweepInterval
	sweepInterval = d
	return func() { sweepInterval = old }
}
