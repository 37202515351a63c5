package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"text/tabwriter"
	"time"

	"golang.org/x/term"
)

// watchStatus prints the status table every interval until ctx ends (then returns nil), for
// operators without Prometheus: per topic pending, oldest pending age, dead-lettered,
// unavailable and the pending count's change per second since the previous refresh (negative
// while the relays drain faster than writers add). On a terminal each refresh replaces the
// previous screen; otherwise refreshes are appended, each starting with a time line. A failed
// refresh prints one line, the time and the error, and the watch goes on; an error wrapped in
// stopWatch ends it and is returned.
func watchStatus(ctx context.Context, w io.Writer, interval time.Duration, read func(context.Context) ([]topicBacklog, error)) error {
	clear := false
	if f, ok := w.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		clear = true
	}
	prev := map[string]int64{}
	var prevAt time.Time
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		topics, err := read(ctx)
		now := time.Now()
		if ctx.Err() != nil {
			return nil
		}
		var sw *stopWatch
		if errors.As(err, &sw) {
			return sw.err
		}
		if clear {
			fmt.Fprint(w, "\x1b[H\x1b[2J")
		}
		if err != nil {
			fmt.Fprintf(w, "%s  reading the backlog failed (retrying every %s, Ctrl-C to stop): %s\n", now.UTC().Format("15:04:05"), interval, oneLine(err.Error()))
		} else {
			fmt.Fprintf(w, "%s  every %s, Ctrl-C to stop\n", now.UTC().Format("15:04:05"), interval)
			printWatch(w, topics, prev, now.Sub(prevAt), !prevAt.IsZero())
			prev = map[string]int64{}
			for _, tb := range topics {
				prev[tb.Topic] = tb.Pending
			}
			prevAt = now
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// stopWatch is an error of watchStatus's read that ends the watch.
type stopWatch struct{ err error }

func (e *stopWatch) Error() string { return e.err.Error() }
func (e *stopWatch) Unwrap() error { return e.err }

func printWatch(w io.Writer, topics []topicBacklog, prev map[string]int64, since time.Duration, havePrev bool) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "TOPIC\tPENDING\tHELD\tOLDEST PENDING\tDEAD-LETTERED\tUNAVAILABLE\tPENDING Δ/s\t")
	rate := func(topic string, now int64) string {
		if !havePrev || since <= 0 {
			return "-"
		}
		return fmt.Sprintf("%+.1f", float64(now-prev[topic])/since.Seconds())
	}
	seen := map[string]bool{}
	for _, t := range topics {
		seen[t.Topic] = true
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%d\t%d\t%s\t\n", t.Topic, t.Pending, t.Held, formatAge(t.OldestPendingAge), t.DeadLettered, t.Unavailable, rate(t.Topic, t.Pending))
	}
	for topic, n := range prev { // drained since the last refresh
		if !seen[topic] && n > 0 {
			fmt.Fprintf(tw, "%s\t0\t0\t-\t0\t0\t%s\t\n", topic, rate(topic, 0))
		}
	}
	total := totalOf(topics)
	var prevTotal int64
	for _, n := range prev {
		prevTotal += n
	}
	totalRate := "-"
	if havePrev && since > 0 {
		totalRate = fmt.Sprintf("%+.1f", float64(total.Pending-prevTotal)/since.Seconds())
	}
	fmt.Fprintf(tw, "TOTAL\t%d\t%d\t%s\t%d\t%d\t%s\t\n", total.Pending, total.Held, formatAge(total.OldestPendingAge), total.DeadLettered, total.Unavailable, totalRate)
	_ = tw.Flush()
}
