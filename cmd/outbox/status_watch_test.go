package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/watermill-outbox/outbox"
)

// TestWatchStatus: each refresh prints a time line and the table; the second shows each
// topic's pending change per second since the first, a drained topic included, and the total.
func TestWatchStatus(t *testing.T) {
	snaps := [][]topicBacklog{
		{{Topic: "a", Backlog: outbox.Backlog{Pending: 100, OldestPendingAge: 2 * time.Second}}, {Topic: "b", Backlog: outbox.Backlog{Pending: 10, DeadLettered: 1}}},
		{{Topic: "a", Backlog: outbox.Backlog{Pending: 40, Held: 7, OldestPendingAge: time.Second}}},
	}
	ctx, cancel := context.WithCancel(context.Background())
	var reads int
	var buf bytes.Buffer
	err := watchStatus(ctx, &buf, 50*time.Millisecond, func(context.Context) ([]topicBacklog, error) {
		if reads == len(snaps)-1 {
			defer cancel()
		}
		reads++
		return snaps[reads-1], nil
	})
	if err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	// Only the first refresh is printed in full when the second read ends the watch: check
	// the first table, then run the second refresh's printing directly.
	if !strings.Contains(out, "every 50ms, Ctrl-C to stop\n") || !strings.Contains(out, "PENDING Δ/s") {
		t.Fatalf("output:\n%s", out)
	}
	var second bytes.Buffer
	printWatch(&second, snaps[1], map[string]int64{"a": 100, "b": 10}, 2*time.Second, true)
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(second.String()), "\n") {
		lines = append(lines, strings.Join(strings.Fields(l), " "))
	}
	want := []string{"TOPIC PENDING HELD OLDEST PENDING DEAD-LETTERED UNAVAILABLE PENDING Δ/s", "a 40 7 1s 0 0 -30.0", "b 0 0 - 0 0 -5.0", "TOTAL 40 7 1s 0 0 -35.0"}
	if strings.Join(lines, "\n") != strings.Join(want, "\n") {
		t.Errorf("second refresh:\n%s\nwant\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}
	first := strings.Join(strings.Fields(out), " ")
	if !strings.Contains(first, "a 100 0 2s 0 0 - b 10 0 - 1 0 - TOTAL 110 0 2s 1 0 -") {
		t.Errorf("first refresh:\n%s", out)
	}
}
