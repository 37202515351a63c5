package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/console"
)

func newConsoleCmd() *cobra.Command {
	var (
		f            dbFlags
		addr         string
		token        string
		basicAuth    string
		showPayloads bool
		overview     int
	)
	cmd := &cobra.Command{
		Use:   "console --db URL [--addr 127.0.0.1:8080] [--token T | --basic-auth user:pass] [--show-payloads] [--overview-limit N]",
		Short: "Serve the operator console: backlog, blocked keys, dead letters, audit log (HTML)",
		Long: `console serves the operator console over HTTP: the backlog per topic with the last hour's
deliveries and delays, the ordering keys held behind a failed head (retry now, skip, purge), the
dead letters (filter by topic, key, error text and time; retry or purge all that match, after a
confirmation that repeats the count), and an audit log of every action.

It is read-only unless --token or --basic-auth is given: actions then need the token (log in on
/login) or the basic-auth user, and answer 403 Forbidden otherwise. Payloads are not shown
unless --show-payloads. It listens on 127.0.0.1 unless --addr says otherwise. It creates its
audit table (<table>_console_audit) when it is missing. The overview reads at most
--overview-limit events of each kind (pending, dead-lettered, leased …) and shows larger counts
as lower bounds ("2,000+"). Every page works on PostgreSQL, SQLite and MariaDB/MySQL.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if token != "" && basicAuth != "" {
				return &usageError{errors.New("give --token or --basic-auth, not both")}
			}
			if overview < 1 || overview > outbox.MaxOverviewLimit {
				return badFlag("overview-limit", fmt.Sprintf(" must be within 1..%d (got %d)", outbox.MaxOverviewLimit, overview))
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			d, err := f.open(ctx, false)
			if err != nil {
				return err
			}
			defer d.Close()
			logger := newSlogLogger(cmd.ErrOrStderr(), false, false)
			c, err := console.New(console.Config{DB: d.Handle(), Schema: d.schema, Token: token, BasicAuth: basicAuth, ShowPayloads: showPayloads,
				OverviewLimit: overview, Logger: logger})
			if err != nil {
				return &usageError{err}
			}
			defer c.Close()
			if err := c.Migrate(ctx); err != nil {
				return d.queryError("creating the console's audit table", err)
			}
			ln, err := net.Listen("tcp", addr)
			if err != nil {
				return fmt.Errorf("--addr %q: %v: give a free host:port, e.g. 127.0.0.1:8080", addr, err)
			}
			srv := &http.Server{Handler: c, ReadHeaderTimeout: 10 * time.Second}
			mode := "read-only"
			if !c.ReadOnly() {
				mode = "actions enabled"
			}
			fmt.Fprintf(cmd.OutOrStdout(), "outbox console on http://%s/ (%s)\n", ln.Addr(), mode)
			errc := make(chan error, 1)
			go func() { errc <- srv.Serve(ln) }()
			select {
			case err := <-errc:
				return err
			case <-ctx.Done():
			}
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			return srv.Shutdown(sctx)
		},
	}
	f.register(cmd)
	cmd.Flags().StringVar(&addr, "addr", "127.0.0.1:8080", "host:port to listen on (127.0.0.1 keeps it to this machine)")
	cmd.Flags().StringVar(&token, "token", "", "operator token that enables actions (log in with it on /login); empty = read-only")
	cmd.Flags().StringVar(&basicAuth, "basic-auth", "", "user:password for HTTP basic authentication of every page; enables actions")
	cmd.Flags().BoolVar(&showPayloads, "show-payloads", false, "show dead letters' payloads on their detail page")
	cmd.Flags().IntVar(&overview, "overview-limit", outbox.DefaultOverviewLimit, fmt.Sprintf("how many events of each kind the overview reads at most (1..%d); larger counts show as lower bounds", outbox.MaxOverviewLimit))
	return withEnv(cmd)
}
