package main

import (
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/capture"
	"github.com/watermill-outbox/outbox/internal/dialect/dburl"
)

// captureFlags are the flags of outbox capture install|sql|uninstall: the database, the outbox
// table, and one declaration applied to every --table. They are not read from the
// environment: OUTBOX_TABLE names the outbox table for the other commands, not a captured one.
type captureFlags struct {
	db, outboxTable                string
	tables, fields, exclude        []string
	payload, topic, okey, truncate string
	unordered, skipReplica         bool
	// optionalTables: no --table means every captured table (verify).
	optionalTables bool
}

func (f *captureFlags) register(cmd *cobra.Command, declaration bool) {
	cmd.Flags().StringVar(&f.db, "db", "", "database URL: postgres://user:password@host:5432/dbname, sqlite://PATH or a path ending in .db (required)")
	cmd.Flags().StringVar(&f.outboxTable, "outbox-table", outbox.DefaultTable, "outbox table name, optionally schema-qualified on PostgreSQL")
	markRequired(cmd, "db", "URL", "postgres://user:password@host:5432/dbname, sqlite://PATH or a path ending in .db")
	if f.optionalTables {
		cmd.Flags().StringSliceVar(&f.tables, "table", nil, "captured table, optionally schema-qualified (repeat or comma-separate; default: every captured table)")
	} else {
		cmd.Flags().StringSliceVar(&f.tables, "table", nil, "captured table, optionally schema-qualified (repeat or comma-separate; required)")
		markRequired(cmd, "table", "orders", "")
	}
	if !declaration {
		return
	}
	cmd.Flags().StringVar(&f.payload, "payload", "after", "row images in the envelope: after, keys or before-and-after")
	cmd.Flags().StringSliceVar(&f.fields, "fields", nil, "columns the events carry (default all)")
	cmd.Flags().StringSliceVar(&f.exclude, "exclude", nil, "columns the events leave out")
	cmd.Flags().StringVar(&f.topic, "topic", capture.DefaultTopic, "topic template of {schema}, {table}, {operation}")
	cmd.Flags().StringVar(&f.okey, "ordering-key", capture.DefaultOrderingKey, "ordering key template of {schema}, {table}, {pk}")
	cmd.Flags().BoolVar(&f.unordered, "unordered", false, "write events without an ordering key")
	cmd.Flags().StringVar(&f.truncate, "truncate", "refuse", "what TRUNCATE does (PostgreSQL): refuse, capture or ignore")
	cmd.Flags().BoolVar(&f.skipReplica, "skip-replica-sessions", false, "let sessions with session_replication_role = replica skip the triggers (PostgreSQL; default: they fire there too, so restores and replication apply are captured)")
}

// declarations returns one capture.Table per --table.
func (f *captureFlags) declarations() ([]capture.Table, error) {
	if len(f.tables) == 0 && !f.optionalTables {
		return nil, &usageError{fmt.Errorf("--table is required")}
	}
	payload, err := capture.ParsePayload(f.payload)
	if err != nil {
		return nil, &usageError{fmt.Errorf("--payload: %w", err)}
	}
	truncate, ok := map[string]capture.Truncate{"": capture.TruncateRefuse, "refuse": capture.TruncateRefuse, "capture": capture.TruncateCapture, "ignore": capture.TruncateIgnore}[strings.ToLower(f.truncate)]
	if !ok {
		return nil, &usageError{fmt.Errorf("--truncate %q: want refuse, capture or ignore", f.truncate)}
	}
	okey := f.okey
	if f.unordered || okey == capture.DefaultOrderingKey {
		okey = ""
	}
	var out []capture.Table
	for _, name := range f.tables {
		out = append(out, capture.Table{Name: name, Payload: payload, Fields: f.fields, Exclude: f.exclude, Topic: f.topic,
			OrderingKey: okey, Unordered: f.unordered, Truncate: truncate, SkipReplicaSessions: f.skipReplica})
	}
	return out, nil
}

// run opens the database (the outbox table must exist) and calls fn.
func (f *captureFlags) run(cmd *cobra.Command, fn func(d *database, tables []capture.Table) error) error {
	tables, err := f.declarations()
	if err != nil {
		return err
	}
	u, err := parseDBURL(f.db)
	if err != nil {
		return err
	}
	if err := refuseUnsupported(u, "outbox capture", capture.Supports(u.Dialect()), "package capture has no "+dburl.Title(u)+" trigger generator"); err != nil {
		return err
	}
	df := dbFlags{db: f.db, table: f.outboxTable}
	d, err := df.open(cmd.Context(), false)
	if err != nil {
		return err
	}
	defer d.Close()
	return fn(d, tables)
}

func newCaptureCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "capture install|sql|uninstall|verify|wal",
		Short: "Capture every row change of tables as outbox events (generated triggers)",
		Long: `capture installs database triggers that write an outbox event for every INSERT, UPDATE and
DELETE of the given tables, in the writing transaction (raw SQL, COPY and cascades included).
On PostgreSQL the partitions of a partitioned table are captured with it (those created or
attached later too), and the triggers also fire in sessions with session_replication_role =
replica unless --skip-replica-sessions. "capture verify" reports any captured table or
partition whose triggers are missing or not enabled.
See the capture package documentation for the envelope and the JSON form of values.
PostgreSQL and SQLite only: a MariaDB/MySQL --db is refused.`,
	}
	cmd.AddCommand(newCaptureInstallCmd(), newCaptureSQLCmd(), newCaptureUninstallCmd(), newCaptureVerifyCmd(), newCaptureWALCmd())
	return cmd
}

// captureSubCmd builds one capture subcommand: its flags (the declaration flags when decl),
// and fn run on the open database with one declaration per --table (--table is optional when
// optionalTables).
func captureSubCmd(use, short string, decl, optionalTables bool, fn func(cmd *cobra.Command, f *captureFlags, d *database, tables []capture.Table) error) *cobra.Command {
	f := captureFlags{optionalTables: optionalTables}
	cmd := &cobra.Command{
		Use:   use,
		Short: short,
		Args:  cobra.NoArgs,
		// capture reads no environment: its required flags are checked here (withEnv does it
		// for the other commands).
		PreRunE: func(cmd *cobra.Command, _ []string) error { return checkRequired(cmd, false) },
		RunE: func(cmd *cobra.Command, _ []string) error {
			return f.run(cmd, func(d *database, tables []capture.Table) error { return fn(cmd, &f, d, tables) })
		},
	}
	f.register(cmd, decl)
	return cmd
}

func newCaptureInstallCmd() *cobra.Command {
	return captureSubCmd("install --db URL --table NAME [--payload after] [--exclude COL] …",
		"Create or regenerate the capture triggers (idempotent; re-run after ALTER TABLE)", true, false,
		func(cmd *cobra.Command, f *captureFlags, d *database, tables []capture.Table) error {
			if err := capture.Install(cmd.Context(), d.Handle(), d.schema, tables...); err != nil {
				return d.queryError("installing capture triggers", err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "capture triggers installed on %s in %s\n", strings.Join(f.tables, ", "), d.where())
			return nil
		})
}

func newCaptureSQLCmd() *cobra.Command {
	return captureSubCmd("sql --db URL --table NAME [--payload after] …",
		"Print the DDL install would run (for migration tools or psql); changes nothing", true, false,
		func(cmd *cobra.Command, _ *captureFlags, d *database, tables []capture.Table) error {
			script, err := capture.SQL(cmd.Context(), d.Handle(), d.schema, tables...)
			if err != nil {
				return d.queryError("generating capture triggers", err)
			}
			_, err = fmt.Fprint(cmd.OutOrStdout(), script)
			return err
		})
}

func newCaptureUninstallCmd() *cobra.Command {
	return captureSubCmd("uninstall --db URL --table NAME", "Drop the capture triggers of tables (idempotent)", false, false,
		func(cmd *cobra.Command, f *captureFlags, d *database, tables []capture.Table) error {
			if err := capture.Uninstall(cmd.Context(), d.Handle(), d.schema, tables...); err != nil {
				return d.queryError("dropping capture triggers", err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "capture triggers dropped from %s in %s\n", strings.Join(f.tables, ", "), d.where())
			return nil
		})
}

func newCaptureVerifyCmd() *cobra.Command {
	return captureSubCmd("verify --db URL [--table NAME]",
		"Check that every captured table and partition has its capture triggers, enabled (exit 1 listing those that do not)", false, true,
		func(cmd *cobra.Command, f *captureFlags, d *database, tables []capture.Table) error {
			what := "every captured table"
			if len(f.tables) > 0 {
				what = strings.Join(f.tables, ", ")
			}
			err := capture.Verify(cmd.Context(), d.Handle(), d.schema, tables...)
			var ve *capture.VerifyError
			if errors.As(err, &ve) {
				for _, p := range ve.Problems {
					fmt.Fprintln(cmd.OutOrStdout(), p.String())
				}
				return &failedError{fmt.Sprintf("%d capture trigger(s) missing or not enabled in %s: writes there produce no event; re-run `outbox capture install`", len(ve.Problems), d.where())}
			}
			if err != nil {
				return d.queryError("verifying capture triggers", err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "capture triggers verified on %s in %s\n", what, d.where())
			return nil
		})
}
