package main

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/watermill-outbox/outbox"
)

// replayFlags are the flags of outbox replay.
type replayFlags struct {
	dbFlags
	since, until string
	topics, keys []string
	batch        int
	yes, dryRun  bool
}

// replayTime parses a --since/--until value at now: an RFC 3339 time, or a Go duration meaning
// that long before now.
func replayTime(name, v string, now time.Time) (time.Time, error) {
	v = strings.TrimSpace(v)
	if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
		return t, nil
	}
	if d, err := time.ParseDuration(v); err == nil && d >= 0 {
		return now.Add(-d), nil
	}
	return time.Time{}, badFlag(name, fmt.Sprintf(" %q is neither an RFC 3339 time (2026-12-06T10:00:00Z) nor a duration before now (2h)", v))
}

func newReplayCmd() *cobra.Command {
	var f replayFlags
	cmd := &cobra.Command{
		Use:   "replay --db URL --since TIME [--until TIME] [--topic PATTERN]… [--key KEY]… (--yes | --dry-run)",
		Short: "Send published events again: a copy of each event published in a time window",
		Long: `replay sends published events again. It selects the events published (published_at) at or
after --since and before --until (default: now), optionally only those whose topic matches a
--topic pattern and whose ordering key is a --key, and writes a copy of each as a new event
(new id, same topic, payload, headers, ordering key and extra columns), which running relays
deliver like any new event. The originals are not changed. Each copy carries the headers
outbox-replay-of (the original event's id) and outbox-replay-id (this replay's id): receivers
that dedupe by event id see a new id, and tell a replay by these headers.

Copies are written in the originals' order: the copies of one ordering key are delivered in
their original order, after the key's events already waiting. A destination is not stored with
an event; select what went to one destination by the topics routed to it (--topic).

--since and --until take an RFC 3339 time (2026-12-06T10:00:00Z) or a duration meaning that
long before now (2h). replay counts the selected events first. Without --yes it sends nothing
and fails (exit status 2), naming the count; --dry-run prints the count and exits 0; --yes
replays and prints how many it sent.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if f.yes && f.dryRun {
				return &usageError{errors.New("--yes and --dry-run do not go together: --dry-run only counts, --yes replays")}
			}
			if err := checkList(cmd.Flags(), f.topics, topicPatternForm, "topic", "topics"); err != nil {
				return err
			}
			if err := checkList(cmd.Flags(), f.keys, "an ordering key", "key"); err != nil {
				return err
			}
			now := time.Now()
			flt := outbox.ReplayFilter{Topics: f.topics, Keys: f.keys}
			var err error
			if flt.Since, err = replayTime("since", f.since, now); err != nil {
				return err
			}
			flt.Until = now
			if f.until != "" {
				if flt.Until, err = replayTime("until", f.until, now); err != nil {
					return err
				}
			}
			if !flt.Until.After(flt.Since) {
				return badFlag("until", fmt.Sprintf(" %s is not after --since %s", flt.Until.UTC().Format(time.RFC3339Nano), flt.Since.UTC().Format(time.RFC3339Nano)))
			}
			for _, p := range f.topics {
				if _, err := outbox.ParseTopicPattern(p); err != nil {
					return badFlag("topic", fmt.Sprintf(" %q is not a topic pattern: use an exact topic, a prefix ending in '*' (\"orders.*\") or '*' for all", p))
				}
			}
			if f.batch < 1 || f.batch > outbox.MaxReplayBatch {
				return badFlag("batch-size", fmt.Sprintf(" %d: give 1..%d", f.batch, outbox.MaxReplayBatch))
			}
			opts := outbox.ReplayOptions{BatchSize: f.batch, DryRun: true}
			if err := flt.Validate(); err != nil {
				var ce *outbox.ConfigError
				if errors.As(err, &ce) && strings.HasPrefix(ce.Field, "ReplayFilter.Keys") {
					return badFlag("key", ": "+ce.Reason)
				}
				return &usageError{err}
			}
			window := fmt.Sprintf("published from %s to %s", flt.Since.UTC().Format(time.RFC3339), flt.Until.UTC().Format(time.RFC3339))
			ctx := cmd.Context()
			return f.withSubscriber(ctx, func(d *database, sub *outbox.Subscriber) error {
				res, err := sub.Replay(ctx, flt, opts)
				if err != nil {
					return d.queryError("counting events to replay", err)
				}
				what := plural(res.Selected, "event", "events") + " " + window
				if f.dryRun {
					_, err := fmt.Fprintf(cmd.OutOrStdout(), "would replay %s (dry run: nothing sent)\n", what)
					return err
				}
				if !f.yes {
					return &usageError{fmt.Errorf("replay would replay %s; nothing was sent: pass --yes to replay, or --dry-run to only count", what)}
				}
				opts.DryRun, opts.Expect = false, res.Selected
				if res.Selected == 0 {
					_, err := fmt.Fprintf(cmd.OutOrStdout(), "replayed 0 events %s\n", window)
					return err
				}
				res, err = sub.Replay(ctx, flt, opts)
				if err != nil {
					if res.Replayed > 0 {
						fmt.Fprintf(cmd.ErrOrStderr(), "outbox: replay %s stopped after %s\n", res.ReplayID, plural(res.Replayed, "copy", "copies"))
					}
					return d.queryError("replaying events", err)
				}
				_, err = fmt.Fprintf(cmd.OutOrStdout(), "replayed %s (replay id %s)\n", what, res.ReplayID)
				return err
			})
		},
	}
	f.dbFlags.register(cmd)
	cmd.Flags().StringVar(&f.since, "since", "", "start of the window on published_at (inclusive): an RFC 3339 time or a duration before now (\"2h\") (required)")
	markRequired(cmd, "since", "TIME", "an RFC 3339 time or a duration before now")
	cmd.Flags().StringVar(&f.until, "until", "", "end of the window (exclusive): an RFC 3339 time or a duration before now; default now")
	cmd.Flags().StringSliceVar(&f.topics, "topic", nil, "only events whose topic matches PATTERN: exact, a prefix ending in '*' (\"orders.*\"), or '*'; repeatable or comma-separated")
	aliasFlag(cmd, "topic", "topics")
	cmd.Flags().StringSliceVar(&f.keys, "key", nil, "only events of this ordering key; repeatable or comma-separated")
	cmd.Flags().IntVar(&f.batch, "batch-size", outbox.DefaultReplayBatch, fmt.Sprintf("copies written per transaction, 1..%d", outbox.MaxReplayBatch))
	// Not OUTBOX_BATCH_SIZE: that one sets the relay's claim batch, often above 1000.
	_ = cmd.Flags().SetAnnotation("batch-size", envAnnotation, []string{envPrefix + "REPLAY_BATCH_SIZE"})
	cmd.Flags().BoolVar(&f.yes, "yes", false, "replay: without it the command only counts what it would replay and fails, naming the count (command line only, no environment variable)")
	_ = cmd.Flags().SetAnnotation("yes", noEnvAnnotation, []string{"true"})
	cmd.Flags().BoolVar(&f.dryRun, "dry-run", false, "only count what would be replayed, print it and exit 0")
	for _, name := range []string{"topic", "topics", "key"} {
		_ = cmd.Flags().SetAnnotation(name, selectAnnotation, []string{"true"})
	}
	return withEnv(cmd)
}
