package engine

import (
	"testing"
	"time"
)

// TestPollWaitBacksOffWhileKeysAreHeld: after polls whose claims found only keys held by
// another relay, the wait doubles from PollInterval up to 100 ms; a PollInterval of 100 ms or
// more is never changed, and an ordinary empty poll waits PollInterval.
func TestPollWaitBacksOffWhileKeysAreHeld(t *testing.T) {
	ms := time.Millisecond
	cases := []struct {
		interval time.Duration
		held     int
		want     time.Duration
	}{
		{10 * ms, 0, 10 * ms},
		{10 * ms, 1, 20 * ms},
		{10 * ms, 2, 40 * ms},
		{10 * ms, 3, 80 * ms},
		{10 * ms, 4, 100 * ms},
		{10 * ms, 1000, 100 * ms},
		{60 * ms, 1, 100 * ms},
		{100 * ms, 5, 100 * ms},
		{5 * time.Second, 3, 5 * time.Second},
	}
	for _, c := range cases {
		if got := pollWait(c.interval, c.held); got != c.want {
			t.Errorf("PollWait(%v, %d) = %v, want %v", c.interval, c.held, got, c.want)
		}
	}
}
