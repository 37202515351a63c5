package main

import (
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/capture"
	"github.com/watermill-outbox/outbox/capture/wal"
)

// walFlags are the slot flags of outbox capture wal setup|status|drop.
type walFlags struct {
	slot, publication string
	printSQL          bool
}

func (w *walFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&w.slot, "slot", wal.DefaultSlot, "logical replication slot (pgoutput)")
	cmd.Flags().StringVar(&w.publication, "publication", wal.DefaultPublication, "publication of the captured tables")
}

func (w *walFlags) config(tables []capture.Table) wal.Config {
	return wal.Config{Tables: tables, Slot: w.slot, Publication: w.publication}
}

// walPool returns the PostgreSQL pool of d, or a usage error for another database.
func walPool(d *database) (*pgxpool.Pool, error) {
	pool, ok := d.Handle().(*pgxpool.Pool)
	if !ok {
		return nil, &usageError{errors.New("outbox capture wal: the WAL source reads PostgreSQL's logical replication; use a postgres:// --db")}
	}
	return pool, nil
}

func newCaptureWALCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "wal setup|setup-outbox|status|drop",
		Short: "Manage the logical replication slot and publication of the WAL source (PostgreSQL)",
		Long: `wal manages what package capture/wal reads: a publication of the captured tables (with
REPLICA IDENTITY FULL on each) and a logical replication slot (pgoutput). The slot retains WAL
until the source confirms it: "status" shows the lag and the retained WAL, "drop" releases it.
"setup-outbox" makes the publication of the outbox table's own inserts and its slot, for
wal.OutboxRelay (status and drop take --slot outbox_wal_table --publication outbox_wal_table).
The server needs wal_level = logical; the role needs the REPLICATION attribute (rds_replication
on Amazon RDS) and must own the tables.`,
	}
	cmd.AddCommand(newCaptureWALSetupCmd(), newCaptureWALSetupOutboxCmd(), newCaptureWALStatusCmd(), newCaptureWALDropCmd())
	return cmd
}

func newCaptureWALSetupCmd() *cobra.Command {
	var w walFlags
	cmd := captureSubCmd("setup --db URL --table NAME [--slot S] [--publication P] [--print-sql]",
		"Create or update the publication and create the slot (idempotent); --print-sql prints the SQL instead", true, false,
		func(cmd *cobra.Command, f *captureFlags, d *database, tables []capture.Table) error {
			cfg := w.config(tables)
			if w.printSQL {
				script, err := wal.SetupSQL(cfg)
				if err != nil {
					return err
				}
				_, err = fmt.Fprint(cmd.OutOrStdout(), script)
				return err
			}
			pool, err := walPool(d)
			if err != nil {
				return err
			}
			if err := wal.Setup(cmd.Context(), pool, cfg); err != nil {
				return d.queryError("setting up the WAL slot", err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "publication %s (%s) and slot %s ready in %s\n", w.publication, strings.Join(f.tables, ", "), w.slot, d.where())
			return nil
		})
	w.register(cmd)
	cmd.Flags().BoolVar(&w.printSQL, "print-sql", false, "print the statements for a migration tool instead of running them")
	return cmd
}

// newCaptureWALSetupOutboxCmd is "outbox capture wal setup-outbox": the publication and slot
// of the outbox-table mode (wal.SetupOutbox).
func newCaptureWALSetupOutboxCmd() *cobra.Command {
	var f dbFlags
	var w walFlags
	cmd := &cobra.Command{
		Use:   "setup-outbox --db URL [--table T] [--slot S] [--publication P] [--print-sql]",
		Short: "Create or update the publication of the outbox table's inserts and create its slot (wal.OutboxRelay; idempotent)",
		Args:  cobra.NoArgs,
		// capture reads no environment: its required flags are checked here.
		PreRunE: func(cmd *cobra.Command, _ []string) error { return checkRequired(cmd, false) },
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg := wal.OutboxConfig{Slot: w.slot, Publication: w.publication, Schema: outbox.SchemaConfig{Table: f.table}}
			if w.printSQL {
				script, err := wal.SetupOutboxSQL(cfg)
				if err != nil {
					return err
				}
				_, err = fmt.Fprint(cmd.OutOrStdout(), script)
				return err
			}
			d, err := f.open(cmd.Context(), false)
			if err != nil {
				return err
			}
			defer d.Close()
			pool, err := walPool(d)
			if err != nil {
				return err
			}
			cfg.Schema = d.schema
			if err := wal.SetupOutbox(cmd.Context(), pool, cfg); err != nil {
				return d.queryError("setting up the outbox WAL slot", err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "publication %s (inserts of %s) and slot %s ready in %s\n", w.publication, f.table, w.slot, d.where())
			return nil
		},
	}
	f.register(cmd)
	cmd.Flags().StringVar(&w.slot, "slot", wal.DefaultOutboxSlot, "logical replication slot (pgoutput)")
	cmd.Flags().StringVar(&w.publication, "publication", wal.DefaultOutboxPublication, "publication of the outbox table's inserts")
	cmd.Flags().BoolVar(&w.printSQL, "print-sql", false, "print the statements for a migration tool instead of running them")
	return cmd
}

func newCaptureWALStatusCmd() *cobra.Command {
	var w walFlags
	var maxRetained int64
	cmd := captureSubCmd("status --db URL [--slot S] [--max-retained-bytes N]",
		"Show the slot's lag and retained WAL (exit 1 when it is missing, lost, or retains more than --max-retained-bytes)", false, true,
		func(cmd *cobra.Command, _ *captureFlags, d *database, _ []capture.Table) error {
			pool, err := walPool(d)
			if err != nil {
				return err
			}
			st, err := wal.Status(cmd.Context(), pool, w.slot)
			if err != nil {
				return d.queryError("reading the slot", err)
			}
			out := cmd.OutOrStdout()
			if !st.Exists {
				return &failedError{fmt.Sprintf("slot %s does not exist in %s: run `outbox capture wal setup`", w.slot, d.where())}
			}
			safe := "unbounded"
			if st.SafeWALSize >= 0 {
				safe = fmt.Sprintf("%d bytes", st.SafeWALSize)
			}
			fmt.Fprintf(out, "slot %s: active %t, wal_status %s\nconfirmed %s, restart %s, current %s\nlag %d bytes, retained %d bytes, safe before invalidation %s\n",
				w.slot, st.Active, st.WALStatus, lsn(st.ConfirmedFlushLSN), lsn(st.RestartLSN), lsn(st.CurrentLSN), st.LagBytes, st.RetainedBytes, safe)
			switch {
			case st.WALStatus == "lost":
				return &failedError{fmt.Sprintf("slot %s is invalidated (wal_status lost): see \"Recovery\" in the capture/wal package documentation", w.slot)}
			case maxRetained > 0 && st.RetainedBytes > maxRetained:
				return &failedError{fmt.Sprintf("slot %s retains %d bytes of WAL, more than --max-retained-bytes %d", w.slot, st.RetainedBytes, maxRetained)}
			}
			return nil
		})
	w.register(cmd)
	cmd.Flags().Int64Var(&maxRetained, "max-retained-bytes", 0, "exit 1 when the slot retains more WAL than this (0: no check)")
	return cmd
}

func newCaptureWALDropCmd() *cobra.Command {
	var w walFlags
	cmd := captureSubCmd("drop --db URL [--slot S] [--publication P]",
		"Drop the slot (releasing its WAL) and the publication; changes not yet delivered are then not streamed", false, true,
		func(cmd *cobra.Command, _ *captureFlags, d *database, _ []capture.Table) error {
			pool, err := walPool(d)
			if err != nil {
				return err
			}
			if err := wal.Drop(cmd.Context(), pool, w.config(nil)); err != nil {
				return d.queryError("dropping the WAL slot", err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "slot %s and publication %s dropped in %s\n", w.slot, w.publication, d.where())
			return nil
		})
	w.register(cmd)
	return cmd
}

func lsn(v uint64) string { return fmt.Sprintf("%X/%X", v>>32, uint32(v)) }
