// Package claimlog records a relay's claims for tests and benchmarks: a watermill logger that
// reads the subscriber's Trace line "outbox: claimed" (fields events, token, duration).
package claimlog

import (
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
)

// Log is a watermill.LoggerAdapter that keeps every claim's size and adds up the claims'
// durations; other log lines are dropped. Safe for concurrent use (several relays may share
// one). The zero value is ready to use.
type Log struct {
	watermill.NopLogger
	// Print, when set, receives one line per claim: time, token, events, duration.
	Print io.Writer

	mu    sync.Mutex
	sizes []int
	total time.Duration
}

// Trace records an "outbox: claimed" line.
func (l *Log) Trace(msg string, f watermill.LogFields) {
	if msg != "outbox: claimed" {
		return
	}
	n, _ := f["events"].(int)
	d, _ := f["duration"].(time.Duration)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sizes = append(l.sizes, n)
	l.total += d
	if l.Print != nil {
		fmt.Fprintf(l.Print, "claim %s %v events=%d %s\n", time.Now().Format("15:04:05.000"), f["token"], n, d)
	}
}

// With returns l: the fields are not needed to count claims.
func (l *Log) With(watermill.LogFields) watermill.LoggerAdapter { return l }

// Sizes returns the number of events of every claim so far, in the order they were logged.
func (l *Log) Sizes() []int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]int(nil), l.sizes...)
}

// Summary returns the number of claims, the mean events per claim and the mean duration per
// claim in milliseconds (0 when there was no claim).
func (l *Log) Summary() (claims int, eventsPerClaim, msPerClaim float64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.sizes) == 0 {
		return 0, 0, 0
	}
	events := 0
	for _, n := range l.sizes {
		events += n
	}
	c := float64(len(l.sizes))
	return len(l.sizes), float64(events) / c, float64(l.total) / float64(time.Millisecond) / c
}
