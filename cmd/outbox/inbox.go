package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/inbox"
	"github.com/watermill-outbox/outbox/internal/dialect/dburl"
)

// inboxFlags are the --db and --table flags of the inbox commands (--table names the inbox
// table, not the outbox's).
type inboxFlags struct {
	db, table string
}

func (f *inboxFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.db, "db", "", "database URL: postgres://user:password@host:5432/dbname, sqlite://PATH or a path ending in .db (required)")
	markRequired(cmd, "db", "URL", "postgres://user:password@host:5432/dbname, sqlite://PATH or a path ending in .db")
	cmd.Flags().StringVar(&f.table, "table", inbox.DefaultTable, "inbox table name, optionally schema-qualified on PostgreSQL")
	// OUTBOX_TABLE names the outbox table of the other commands, never the inbox.
	_ = cmd.Flags().SetAnnotation("table", envAnnotation, []string{envPrefix + "INBOX_TABLE"})
}

// open connects to --db and returns the database and the inbox schema.
func (f *inboxFlags) open(ctx context.Context, create bool) (*database, inbox.SchemaConfig, error) {
	u, err := parseDBURL(f.db)
	if err != nil {
		return nil, inbox.SchemaConfig{}, err
	}
	if err := refuseUnsupported(u, "outbox inbox", inbox.Supports(u.Dialect()), "package inbox has no "+dburl.Title(u)+" dialect"); err != nil {
		return nil, inbox.SchemaConfig{}, err
	}
	cfg := inbox.SchemaConfig{Table: f.table, Dialect: u.Dialect()}
	if err := cfg.Validate(); err != nil {
		return nil, cfg, badFlag("table", fmt.Sprintf(" %q: %v", f.table, err))
	}
	d, err := openDB(ctx, u, outbox.DefaultTable, openOptions{create: create})
	if err != nil {
		return nil, cfg, err
	}
	return d, cfg, nil
}

// inboxError is the one-line message of a failed inbox statement; a missing table names the
// command that creates it.
func (f *inboxFlags) inboxError(d *database, doing string, err error) error {
	if d.url.SQL().MissingTable(err) {
		return fmt.Errorf("inbox table %q not found in %s: create it with `outbox inbox migrate --db %s --table %s` (or inbox.Migrate)", f.table, d.where(), shellQuote(d.url.Shown()), shellQuote(f.table))
	}
	return d.queryError(doing, err)
}

func newInboxCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "inbox migrate|status|cleanup --db URL",
		Short: "Operate the consumer inbox table (package inbox): create it, show it, clean it up",
		Long: `inbox operates the table in which package inbox records the messages each consumer processed
(consumer, message id, topic, processed_at), so that a redelivered message changes nothing.
PostgreSQL and SQLite only: a MariaDB/MySQL --db is refused.`,
	}
	cmd.AddCommand(newInboxMigrateCmd(), newInboxStatusCmd(), newInboxCleanupCmd())
	return cmd
}

func newInboxMigrateCmd() *cobra.Command {
	var f inboxFlags
	cmd := &cobra.Command{
		Use:   "migrate --db URL [--table NAME]",
		Short: "Create the inbox table and its index (idempotent)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			d, cfg, err := f.open(ctx, true)
			if err != nil {
				return err
			}
			defer d.Close()
			if err := inbox.Migrate(ctx, d.Handle(), cfg); err != nil {
				return d.queryError(fmt.Sprintf("migrating inbox table %q", f.table), err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "inbox table %q is ready in %s\n", f.table, d.where())
			return nil
		},
	}
	f.register(cmd)
	return withEnv(cmd)
}

// inboxStatusJSON is inbox status --json's output.
type inboxStatusJSON struct {
	Messages  int64               `json:"messages"`
	Consumers []inboxConsumerJSON `json:"consumers"`
}

type inboxConsumerJSON struct {
	Consumer        string    `json:"consumer"`
	Messages        int64     `json:"messages"`
	OldestProcessed time.Time `json:"oldest_processed_at"`
	NewestProcessed time.Time `json:"newest_processed_at"`
}

func newInboxStatusCmd() *cobra.Command {
	var (
		f      inboxFlags
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "status --db URL [--table NAME] [--json]",
		Short: "Show per consumer how many processed messages the inbox records, and since when",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			d, cfg, err := f.open(ctx, false)
			if err != nil {
				return err
			}
			defer d.Close()
			st, err := inbox.Status(ctx, d.Handle(), cfg)
			if err != nil {
				return f.inboxError(d, "reading the inbox", err)
			}
			return printInboxStatus(cmd.OutOrStdout(), st, asJSON)
		},
	}
	f.register(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON instead of a table")
	return withEnv(cmd)
}

func printInboxStatus(w io.Writer, st []inbox.ConsumerStatus, asJSON bool) error {
	var total int64
	for _, c := range st {
		total += c.Messages
	}
	if asJSON {
		out := inboxStatusJSON{Messages: total, Consumers: []inboxConsumerJSON{}}
		for _, c := range st {
			out.Consumers = append(out.Consumers, inboxConsumerJSON{Consumer: c.Consumer, Messages: c.Messages, OldestProcessed: c.Oldest.UTC(), NewestProcessed: c.Newest.UTC()})
		}
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "CONSUMER\tMESSAGES\tOLDEST\tNEWEST")
	for _, c := range st {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\n", c.Consumer, c.Messages, formatAge(time.Since(c.Oldest))+" ago", formatAge(time.Since(c.Newest))+" ago")
	}
	fmt.Fprintf(tw, "TOTAL\t%d\t\t\n", total)
	return tw.Flush()
}

func newInboxCleanupCmd() *cobra.Command {
	var (
		f         inboxFlags
		olderThan time.Duration
		consumer  string
	)
	cmd := &cobra.Command{
		Use:   "cleanup --db URL --older-than DURATION [--consumer NAME] [--table NAME]",
		Short: "Delete inbox records older than a duration, in small batches",
		Long: `cleanup deletes inbox records processed more than --older-than ago (of --consumer only, when
given), in batches so no lock is held long. A message redelivered after its record is gone is
processed again: keep records longer than any redelivery can come.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if olderThan < 0 {
				return badFlag("older-than", fmt.Sprintf(" %s is negative: give a duration such as 168h, or 0s for every record", olderThan))
			}
			ctx := cmd.Context()
			d, cfg, err := f.open(ctx, false)
			if err != nil {
				return err
			}
			defer d.Close()
			n, err := inbox.Cleanup(ctx, d.Handle(), cfg, consumer, olderThan)
			if err != nil {
				return f.inboxError(d, "deleting inbox records", err)
			}
			of := ""
			if consumer != "" {
				of = fmt.Sprintf(" of consumer %q", consumer)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "deleted %s%s older than %s\n", plural(n, "inbox record", "inbox records"), of, olderThan)
			return nil
		},
	}
	f.register(cmd)
	cmd.Flags().DurationVar(&olderThan, "older-than", 0, "delete records processed more than this long ago, a Go duration (\"168h\"); required")
	markRequired(cmd, "older-than", "168h", "")
	cmd.Flags().StringVar(&consumer, "consumer", "", "only this consumer's records; empty = every consumer")
	return withEnv(cmd)
}
