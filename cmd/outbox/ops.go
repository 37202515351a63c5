package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/watermill-outbox/outbox"
)

// dbFlags are the --db and --table flags every database command takes.
type dbFlags struct {
	db, table string
}

func (f *dbFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.db, "db", "", "database URL: "+dbFlagForms+" (required)")
	markRequired(cmd, "db", "URL", dbFlagForms)
	cmd.Flags().StringVar(&f.table, "table", outbox.DefaultTable, "outbox table name, optionally schema-qualified (PostgreSQL) or database-qualified (MariaDB/MySQL)")
}

// open parses --db and connects. Unless create is set, the outbox table must exist.
func (f *dbFlags) open(ctx context.Context, create bool) (*database, error) {
	u, err := parseDBURL(f.db)
	if err != nil {
		return nil, err
	}
	d, err := openDB(ctx, u, f.table, openOptions{create: create})
	if err != nil {
		return nil, err
	}
	if !create {
		if err := d.requireTable(ctx); err != nil {
			d.Close()
			return nil, err
		}
	}
	return d, nil
}

// withSubscriber opens the database (the outbox table must exist), runs fn with an outbox
// Subscriber for the operations (it runs no relay), then closes the Subscriber and the database.
func (f *dbFlags) withSubscriber(ctx context.Context, fn func(d *database, sub *outbox.Subscriber) error) error {
	d, err := f.open(ctx, false)
	if err != nil {
		return err
	}
	defer d.Close()
	sub, err := outbox.NewSubscriber(d.Handle(), outbox.SubscriberConfig{Schema: d.schema}, nil)
	if err != nil {
		return err
	}
	defer sub.Close()
	return fn(d, sub)
}

func newMigrateCmd() *cobra.Command {
	var f dbFlags
	cmd := &cobra.Command{
		Use:   "migrate --db URL [--table NAME]",
		Short: "Create or upgrade the outbox table and its indexes (idempotent)",
		Long: `migrate creates the outbox table and its indexes, or adds what an older version lacks.
It is idempotent and safe to run from several processes at once. For SQLite it creates the
database file when it does not exist. On MariaDB/MySQL it also creates the key-lock table
<table>_keys, which writers use to commit each ordering key's events in order; drop both
tables together.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			d, err := f.open(ctx, true)
			if err != nil {
				return err
			}
			defer d.Close()
			if schema, err := d.missingSchema(ctx); err != nil {
				return d.queryError("checking the schema of --table", err)
			} else if schema != "" {
				return d.schemaMissingError(schema)
			}
			if err := outbox.Migrate(ctx, d.Handle(), d.schema); err != nil {
				if d.SchemaGone(err) { // dropped meanwhile
					if i := strings.IndexByte(d.tableName(), '.'); i > 0 {
						return d.schemaMissingError(d.tableName()[:i])
					}
				}
				return d.queryError(fmt.Sprintf("migrating outbox table %q", d.tableName()), err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "outbox table %q is ready in %s\n", d.tableName(), d.where())
			return nil
		},
	}
	f.register(cmd)
	return withEnv(cmd)
}

func newStatusCmd() *cobra.Command {
	var (
		f      dbFlags
		asJSON bool
		watch  time.Duration
	)
	cmd := &cobra.Command{
		Use:   "status --db URL [--json | --watch INTERVAL]",
		Short: "Show the backlog: pending events, oldest pending age, dead letters, per topic",
		Long: `status shows the outbox backlog: how many events wait for delivery (pending), how old the
oldest of them is, and how many were dead-lettered — in total and per topic (topics with nothing
pending and no dead letters are left out).`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			if watch < 0 || watch > 0 && asJSON {
				return &usageError{fmt.Errorf("--watch takes a positive interval and does not go with --json")}
			}
			if watch > 0 {
				wctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
				defer stop()
				r := &watchReader{f: &f}
				defer r.close()
				return watchStatus(wctx, cmd.OutOrStdout(), watch, r.read)
			}
			return f.withSubscriber(ctx, func(d *database, sub *outbox.Subscriber) error {
				topics, err := backlogByTopic(ctx, d, sub)
				if err != nil {
					return d.queryError("reading the backlog per topic", err)
				}
				return printStatus(cmd.OutOrStdout(), totalOf(topics), topics, asJSON)
			})
		},
	}
	f.register(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON instead of a table")
	cmd.Flags().DurationVar(&watch, "watch", 0, "refresh the table every INTERVAL (e.g. 2s) until Ctrl-C, with each topic's pending change per second; 0 = print once")
	return withEnv(cmd)
}

// watchReader reads the backlog for status --watch. It opens the database at its first read,
// and again at the next read after an open that could not connect: a database down when the
// watch starts is shown, and waited for, like one that goes down during it. Any other failed
// open (a bad --db, a missing table) ends the watch (stopWatch).
type watchReader struct {
	f   *dbFlags
	d   *database
	sub *outbox.Subscriber
}

func (r *watchReader) read(ctx context.Context) ([]topicBacklog, error) {
	if r.d == nil {
		d, err := r.f.open(ctx, false)
		var cf *connectFailure
		switch {
		case errors.As(err, &cf):
			return nil, err
		case err != nil:
			return nil, &stopWatch{err}
		}
		sub, err := outbox.NewSubscriber(d.Handle(), outbox.SubscriberConfig{Schema: d.schema}, nil)
		if err != nil {
			d.Close()
			return nil, &stopWatch{err}
		}
		r.d, r.sub = d, sub
	}
	topics, err := backlogByTopic(ctx, r.d, r.sub)
	if err != nil {
		return nil, r.d.queryError("reading the backlog", err)
	}
	return topics, nil
}

func (r *watchReader) close() {
	if r.d != nil {
		_ = r.sub.Close()
		r.d.Close()
	}
}

// statusJSON is status --json's output.
type statusJSON struct {
	Pending                 int64       `json:"pending"`
	OldestPendingAgeSeconds float64     `json:"oldest_pending_age_seconds"`
	DeadLettered            int64       `json:"dead_lettered"`
	Unavailable             int64       `json:"unavailable"`
	Held                    int64       `json:"held"`
	Topics                  []topicJSON `json:"topics"`
}

type topicJSON struct {
	Topic                   string  `json:"topic"`
	Pending                 int64   `json:"pending"`
	OldestPendingAgeSeconds float64 `json:"oldest_pending_age_seconds"`
	DeadLettered            int64   `json:"dead_lettered"`
	Unavailable             int64   `json:"unavailable"`
	Held                    int64   `json:"held"`
}

// totalOf is the TOTAL row of status, computed from the per-topic rows (read in one query) so
// that it agrees with them: the sums of the counts and the oldest of the topics' ages. Topics
// left out of the rows have nothing pending and no dead letters, so they add nothing.
func totalOf(topics []topicBacklog) outbox.Backlog {
	var b outbox.Backlog
	for _, t := range topics {
		b.Pending += t.Pending
		b.DeadLettered += t.DeadLettered
		b.Unavailable += t.Unavailable
		b.Held += t.Held
		b.OldestPendingAge = max(b.OldestPendingAge, t.OldestPendingAge)
	}
	return b
}

func printStatus(w io.Writer, total outbox.Backlog, topics []topicBacklog, asJSON bool) error {
	if asJSON {
		out := statusJSON{Pending: total.Pending, OldestPendingAgeSeconds: total.OldestPendingAge.Seconds(), DeadLettered: total.DeadLettered, Unavailable: total.Unavailable, Held: total.Held, Topics: []topicJSON{}}
		for _, t := range topics {
			out.Topics = append(out.Topics, topicJSON{Topic: t.Topic, Pending: t.Pending, OldestPendingAgeSeconds: t.OldestPendingAge.Seconds(), DeadLettered: t.DeadLettered, Unavailable: t.Unavailable, Held: t.Held})
		}
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "TOPIC\tPENDING\tOLDEST PENDING\tDEAD-LETTERED")
	for _, t := range topics {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%d\n", t.Topic, t.Pending, formatAge(t.OldestPendingAge), t.DeadLettered)
	}
	fmt.Fprintf(tw, "TOTAL\t%d\t%s\t%d\n", total.Pending, formatAge(total.OldestPendingAge), total.DeadLettered)
	if err := tw.Flush(); err != nil {
		return err
	}
	if total.Held > 0 {
		if _, err := fmt.Fprintf(w, "held: %d pending events wait behind a failed or dead-lettered first event of their ordering key (see outbox dead list)\n", total.Held); err != nil {
			return err
		}
	}
	if total.Unavailable > 0 {
		var names []string
		for _, t := range topics {
			if t.Unavailable > 0 {
				names = append(names, t.Topic)
			}
		}
		_, err := fmt.Fprintf(w, "destination unavailable: %d pending events of %s are held because their destination was down at the last delivery (no attempt counted; the relay probes it and resumes on its own)\n",
			total.Unavailable, strings.Join(names, ", "))
		return err
	}
	return nil
}

// formatAge prints an age rounded to what a reader needs; "-" for none.
func formatAge(d time.Duration) string {
	switch {
	case d <= 0:
		return "-"
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}

// deadFlags are the filter flags of the dead subcommands.
type deadFlags struct {
	dbFlags
	fs        *pflag.FlagSet // the command's flags
	topics    []string
	ids       []string
	olderThan time.Duration
}

func (f *deadFlags) register(cmd *cobra.Command) {
	f.dbFlags.register(cmd)
	f.fs = cmd.Flags()
	cmd.Flags().StringSliceVar(&f.topics, "topic", nil, "select dead letters whose topic matches PATTERN: exact, a prefix ending in '*' (\"orders.*\"), or '*' for all; repeatable or comma-separated")
	aliasFlag(cmd, "topic", "topics")
	cmd.Flags().StringSliceVar(&f.ids, "id", nil, "select the dead letter with this event id (UUID); repeatable or comma-separated")
	cmd.Flags().DurationVar(&f.olderThan, "older-than", 0, "only dead letters dead-lettered more than this long ago, a Go duration (\"24h\"); 0 = any age")
	for _, name := range []string{"topic", "topics", "id"} {
		_ = cmd.Flags().SetAnnotation(name, selectAnnotation, []string{"true"})
	}
}

// filter builds the dead-letter filter; with all set and no --topic/--id it selects every topic.
func (f *deadFlags) filter(all bool) (deadFilter, error) {
	var flt deadFilter
	if err := checkList(f.fs, f.topics, topicPatternForm, "topic", "topics"); err != nil {
		return flt, err
	}
	if err := checkList(f.fs, f.ids, "an event id (UUID) as `outbox dead list` shows it", "id"); err != nil {
		return flt, err
	}
	for _, t := range f.topics {
		if _, err := outbox.ParseTopicPattern(t); err != nil {
			return flt, badFlag("topic", fmt.Sprintf(" %q is not a topic pattern: use an exact topic, a prefix ending in '*' (\"orders.*\") or '*' for all", t))
		}
		flt.Topics = append(flt.Topics, t)
	}
	for _, s := range f.ids {
		id, err := uuid.Parse(strings.TrimSpace(s))
		if err != nil {
			return flt, badFlag("id", fmt.Sprintf(" %q is not a UUID: give event ids as shown by `outbox dead list`", s))
		}
		flt.IDs = append(flt.IDs, id)
	}
	if f.olderThan < 0 {
		return flt, badFlag("older-than", fmt.Sprintf(" %s is negative: give a duration such as 24h, or 0 for any age", f.olderThan))
	}
	flt.OlderThan = f.olderThan
	if len(flt.Topics) == 0 && len(flt.IDs) == 0 {
		if !all {
			return flt, &usageError{fmt.Errorf("select dead letters with --topic PATTERN (--topic '*' for every topic) or --id UUID")}
		}
		flt.Topics = []string{"*"}
	}
	return flt, nil
}

func newDeadCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "dead",
		Short: "List, retry or purge dead-lettered events",
		Long: `dead acts on dead-lettered events: those whose deliveries failed --max-attempts times.
The filters select by topic pattern and/or event id (either selects), and --older-than narrows
to events dead-lettered more than that long ago.`,
	}
	cmd.AddCommand(newDeadListCmd(), newDeadRetryCmd(), newDeadPurgeCmd())
	return unknownSubcommand(cmd)
}

func newDeadListCmd() *cobra.Command {
	var (
		f      deadFlags
		limit  int
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "list --db URL [--topic PATTERN]… [--id UUID]… [--older-than DURATION] [--limit N] [--json]",
		Short: "List dead-lettered events (all topics unless filtered)",
		Long: `list shows dead-lettered events, oldest dead letter first: event id, topic, ordering key,
attempts, when it was dead-lettered and the last delivery error (its last 100 characters).
With no filter it lists every topic; --topic and --id select (either selects) and --older-than
narrows. It shows at most --limit events and says on stderr when there are more. --json prints
one array that also holds each event's sequence, created_at, headers, payload (when it is
JSON) and whole last error. It changes nothing: act on what it shows with "outbox dead retry"
or "outbox dead purge".`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			flt, err := f.filter(true)
			if err != nil {
				return err
			}
			if limit < 1 || limit > outbox.MaxBatchSize {
				return badFlag("limit", fmt.Sprintf(" %d: give 1..%d", limit, outbox.MaxBatchSize))
			}
			ctx := cmd.Context()
			return f.withSubscriber(ctx, func(d *database, sub *outbox.Subscriber) error {
				dls, err := listDead(ctx, d, sub, flt, limit+1)
				if err != nil {
					return d.queryError("listing dead letters", err)
				}
				more := len(dls) > limit
				if more {
					dls = dls[:limit]
				}
				return printDead(cmd.OutOrStdout(), cmd.ErrOrStderr(), dls, more, limit, asJSON)
			})
		},
	}
	f.register(cmd)
	cmd.Flags().IntVar(&limit, "limit", 100, fmt.Sprintf("list at most this many, oldest dead letter first, 1..%d", outbox.MaxBatchSize))
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON (one array) instead of a table")
	return withEnv(cmd)
}

// deadJSON is one entry of dead list --json.
type deadJSON struct {
	ID             string            `json:"id"`
	Sequence       int64             `json:"sequence"`
	Topic          string            `json:"topic"`
	OrderingKey    string            `json:"ordering_key,omitempty"`
	Attempts       int               `json:"attempts"`
	LastError      string            `json:"last_error,omitempty"`
	CreatedAt      time.Time         `json:"created_at"`
	DeadLetteredAt time.Time         `json:"dead_lettered_at"`
	Headers        map[string]string `json:"headers,omitempty"`
	Payload        json.RawMessage   `json:"payload,omitempty"`
}

func printDead(w, errw io.Writer, dls []deadLetter, more bool, limit int, asJSON bool) error {
	if asJSON {
		out := []deadJSON{}
		for _, dl := range dls {
			e := deadJSON{ID: dl.ID.String(), Sequence: dl.Sequence, Topic: dl.Topic, OrderingKey: dl.OrderingKey, Attempts: dl.Attempts,
				LastError: dl.LastError, CreatedAt: dl.CreatedAt.UTC(), DeadLetteredAt: dl.DeadLetteredAt.UTC(), Headers: dl.Headers}
			if json.Valid(dl.Payload) {
				e.Payload = dl.Payload
			}
			out = append(out, e)
		}
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		if err := enc.Encode(out); err != nil {
			return err
		}
	} else if len(dls) == 0 {
		fmt.Fprintln(w, "no dead letters")
	} else {
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tTOPIC\tORDERING KEY\tATTEMPTS\tDEAD-LETTERED AT\tLAST ERROR")
		for _, dl := range dls {
			key := dl.OrderingKey
			if key == "" {
				key = "-"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\n", dl.ID, dl.Topic, key, dl.Attempts,
				dl.DeadLetteredAt.UTC().Format(time.RFC3339), clipFront(oneLine(dl.LastError), 100))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if more {
		what := fmt.Sprintf("the oldest %d dead letters", limit)
		if limit == 1 {
			what = "the oldest dead letter"
		}
		fmt.Fprintf(errw, "outbox: showing %s; there are more (raise --limit or narrow --topic/--older-than)\n", what)
	}
	return nil
}

// clipFront shortens s to its last n runes behind an ellipsis: the cause of a wrapped error is
// at its end (--json prints it whole).
func clipFront(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return "…" + string(r[len(r)-n+1:])
}

// confirmFlags are --yes and --dry-run of a command that deletes: it counts what it would
// delete first, deletes only with --yes, and with --dry-run only prints the count.
type confirmFlags struct{ yes, dryRun bool }

func (c *confirmFlags) register(cmd *cobra.Command) {
	cmd.Flags().BoolVar(&c.yes, "yes", false, "delete: without it the command only counts what it would delete and fails, naming the count (command line only, no environment variable)")
	_ = cmd.Flags().SetAnnotation("yes", noEnvAnnotation, []string{"true"})
	cmd.Flags().BoolVar(&c.dryRun, "dry-run", false, "only count what would be deleted, print it and exit 0")
}

// check refuses --yes with --dry-run.
func (c *confirmFlags) check() error {
	if c.yes && c.dryRun {
		return &usageError{errors.New("--yes and --dry-run do not go together: --dry-run only counts, --yes deletes")}
	}
	return nil
}

// counted reports whether the command may delete now that it has counted: with --dry-run it
// prints each of would ("purge 3 dead-lettered events") on w and returns false; without --yes
// it returns a usage error naming them; with --yes it returns true.
func (c *confirmFlags) counted(w io.Writer, cmd string, would []string) (bool, error) {
	if c.dryRun {
		for _, s := range would {
			if _, err := fmt.Fprintf(w, "would %s (dry run: nothing deleted)\n", s); err != nil {
				return false, err
			}
		}
		return false, nil
	}
	if !c.yes {
		return false, &usageError{fmt.Errorf("%s would %s; nothing was deleted: pass --yes to delete, or --dry-run to only count", cmd, strings.Join(would, " and "))}
	}
	return true, nil
}

// deadAction is a dead subcommand that acts on the selected dead letters (at least one filter
// is required) and reports how many it acted on.
type deadAction struct {
	name        string // subcommand name, e.g. "retry"
	short, long string // help texts
	doing       string // what a failed act was doing, for queryError
	done        string // the past tense that leads the report, e.g. "retried"
	act         func(ctx context.Context, d *database, sub *outbox.Subscriber, f deadFilter) (int64, error)
	// count, when set, makes the action destructive: it counts first and acts only with
	// --yes (confirmFlags).
	count func(ctx context.Context, d *database, sub *outbox.Subscriber, f deadFilter) (int64, error)
}

func (a deadAction) command() *cobra.Command {
	var (
		f deadFlags
		c confirmFlags
	)
	use := a.name + " --db URL (--topic PATTERN | --id UUID)… [--older-than DURATION]"
	if a.count != nil {
		use += " (--yes | --dry-run)"
	}
	cmd := &cobra.Command{
		Use:   use,
		Short: a.short,
		Long:  a.long,
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			flt, err := f.filter(false)
			if err != nil {
				return err
			}
			if err := c.check(); err != nil {
				return err
			}
			ctx := cmd.Context()
			return f.withSubscriber(ctx, func(d *database, sub *outbox.Subscriber) error {
				if a.count != nil {
					n, err := a.count(ctx, d, sub, flt)
					if err != nil {
						return d.queryError("counting dead letters", err)
					}
					if ok, err := c.counted(cmd.OutOrStdout(), strings.TrimPrefix(cmd.CommandPath(), "outbox "), []string{a.name + " " + plural(n, "dead-lettered event", "dead-lettered events")}); !ok {
						return err
					}
				}
				n, err := a.act(ctx, d, sub, flt)
				if err != nil {
					return d.queryError(a.doing, err)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s %s\n", a.done, plural(n, "dead-lettered event", "dead-lettered events"))
				return nil
			})
		},
	}
	f.register(cmd)
	if a.count != nil {
		c.register(cmd)
	}
	return withEnv(cmd)
}

func newDeadRetryCmd() *cobra.Command {
	return deadAction{
		name:  "retry",
		short: "Give the selected dead letters fresh attempts (--topic '*' for all)",
		long: `retry gives the selected dead-lettered events fresh attempts: attempts reset to 0, due now,
last_error kept. The events of their ordering keys that waited behind them follow in order.`,
		doing: "retrying dead letters",
		done:  "retried",
		act:   retryDead,
	}.command()
}

func newDeadPurgeCmd() *cobra.Command {
	return deadAction{
		name:  "purge",
		short: "Delete the selected dead letters for good (--topic '*' for all)",
		long: `purge deletes the selected dead-lettered events. Their ordering keys are then no longer held:
later events of those keys are delivered. This cannot be undone.

It counts the selected dead letters first. Without --yes it deletes nothing and fails (exit
status 2), naming the count; --dry-run prints the count and exits 0; --yes deletes and prints
how many it deleted.`,
		doing: "purging dead letters",
		done:  "purged",
		act:   purgeDead,
		count: countDead,
	}.command()
}

func newCleanupCmd() *cobra.Command {
	var (
		f                         dbFlags
		c                         confirmFlags
		publishedOlder, deadOlder time.Duration
	)
	cmd := &cobra.Command{
		Use:   "cleanup --db URL --published-older-than DURATION [--dead-older-than DURATION] (--yes | --dry-run)",
		Short: "Delete delivered (and optionally dead-lettered) events older than a duration",
		Long: `cleanup deletes events published more than --published-older-than ago and, when
--dead-older-than is given, events dead-lettered more than that long ago, in small batches so no
lock is held long. Deleting an event frees its idempotency key: keep events at least as long as
a producer may retry with the same key. The relay never cleans up by itself.

It counts what it would delete first. Without --yes it deletes nothing and fails (exit status
2), naming the counts; --dry-run prints them and exits 0; --yes deletes and prints how many it
deleted.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if publishedOlder < 0 {
				return badFlag("published-older-than", fmt.Sprintf(" %s is negative: give a duration such as 168h, or 0s for every published event", publishedOlder))
			}
			if deadOlder < 0 {
				return badFlag("dead-older-than", fmt.Sprintf(" %s is negative: give a duration such as 720h, or 0s for every dead letter", deadOlder))
			}
			if err := c.check(); err != nil {
				return err
			}
			ctx := cmd.Context()
			withDead := cmd.Flags().Changed("dead-older-than")
			return f.withSubscriber(ctx, func(d *database, sub *outbox.Subscriber) error {
				n, err := sub.CountPublished(ctx, publishedOlder)
				if err != nil {
					return d.queryError("counting published events", err)
				}
				would := []string{fmt.Sprintf("delete %s older than %s", plural(n, "published event", "published events"), publishedOlder)}
				if withDead {
					n, err := sub.CountDeadLetteredOlder(ctx, deadOlder)
					if err != nil {
						return d.queryError("counting dead-lettered events", err)
					}
					would = append(would, fmt.Sprintf("delete %s older than %s", plural(n, "dead-lettered event", "dead-lettered events"), deadOlder))
				}
				if ok, err := c.counted(cmd.OutOrStdout(), strings.TrimPrefix(cmd.CommandPath(), "outbox "), would); !ok {
					return err
				}
				n, err = sub.CleanupPublished(ctx, publishedOlder)
				if err != nil {
					return d.queryError("deleting published events", err)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "deleted %s older than %s\n", plural(n, "published event", "published events"), publishedOlder)
				if withDead {
					n, err := sub.CleanupDeadLettered(ctx, deadOlder)
					if err != nil {
						return d.queryError("deleting dead-lettered events", err)
					}
					fmt.Fprintf(cmd.OutOrStdout(), "deleted %s older than %s\n", plural(n, "dead-lettered event", "dead-lettered events"), deadOlder)
				}
				return nil
			})
		},
	}
	f.register(cmd)
	cmd.Flags().DurationVar(&publishedOlder, "published-older-than", 0, "delete events published more than this long ago, a Go duration (\"168h\"); required")
	cmd.Flags().DurationVar(&deadOlder, "dead-older-than", 0, "also delete events dead-lettered more than this long ago (\"720h\"); unset = keep dead letters")
	markRequired(cmd, "published-older-than", "168h", "")
	c.register(cmd)
	return withEnv(cmd)
}
