// Command outbox runs and operates a watermill-outbox table from the shell.
//
//	outbox demo                                  # the whole outbox, end to end, on an embedded SQLite file
//	outbox migrate --db URL                      # create or upgrade the outbox table
//	outbox relay   --db URL --to URL             # deliver events to Kafka, RabbitMQ, Redis or a webhook
//	outbox status  --db URL                      # backlog: pending, oldest pending age, dead letters
//	outbox dead list|retry|purge --db URL …      # inspect and act on dead-lettered events
//	outbox cleanup --db URL --published-older-than 168h
//
// Database URLs: postgres://… or postgresql://… (PostgreSQL, through a pgx pool); sqlite://PATH,
// sqlite:PATH, file:PATH or a path ending in .db, .sqlite or .sqlite3 (SQLite, pure Go).
//
// Every flag of migrate, relay, status, dead and cleanup can also be given as an environment
// variable named OUTBOX_ and the flag's name in upper case with '-' as '_' (OUTBOX_DB,
// OUTBOX_TO, OUTBOX_BATCH_SIZE …); a flag on the command line wins over the environment.
//
// Errors are printed as one line on stderr, naming the fix, and the exit status is non-zero:
// 1 for a failure, 2 for a usage error.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// envPrefix starts the name of the environment variable of every flag (see bindEnv).
const envPrefix = "OUTBOX_"

// usageError marks an error in how the command was called (exit status 2).
type usageError struct{ err error }

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

// failedError marks a run that worked but whose result is a failure (the demo's checks); its
// message is printed like any error.
type failedError struct{ msg string }

func (e *failedError) Error() string { return e.msg }

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

// run executes the command line args and returns the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	root := newRootCmd(stdout, stderr)
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return 0
	}
	fmt.Fprintln(stderr, "outbox: "+oneLine(err.Error()))
	var ue *usageError
	if errors.As(err, &ue) {
		return 2
	}
	return 1
}

// oneLine folds a multi-line message into one line.
func oneLine(s string) string {
	s = strings.TrimSpace(s)
	s = strings.ReplaceAll(s, "\r", "")
	return strings.Join(strings.Fields(strings.ReplaceAll(s, "\n", " ; ")), " ")
}

func newRootCmd(stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:   "outbox",
		Short: "Run and operate a transactional outbox for Watermill",
		Long: `outbox runs and operates a watermill-outbox table.

Start with "outbox demo": it needs no server and shows the whole outbox at work.

Database URLs (--db): postgres://… or postgresql://… for PostgreSQL; sqlite://PATH, sqlite:PATH,
file:PATH or a path ending in .db, .sqlite or .sqlite3 for SQLite.

Every flag of migrate, relay, status, dead and cleanup can also be set through an environment
variable: OUTBOX_ followed by the flag name in upper case with '-' as '_' (OUTBOX_DB, OUTBOX_TO,
OUTBOX_BATCH_SIZE …). A flag given on the command line wins over the environment.`,
		SilenceErrors: true,
		SilenceUsage:  true,
	}
	root.CompletionOptions.HiddenDefaultCmd = true
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		return &usageError{fmt.Errorf("%w (see %s --help)", err, c.CommandPath())}
	})
	root.AddCommand(
		newDemoCmd(),
		newMigrateCmd(),
		newRelayCmd(),
		newStatusCmd(),
		newDeadCmd(),
		newCleanupCmd(),
		newCaptureCmd(),
	)
	return root
}

// aliasFlag adds the hidden flag alias to cmd's flag name: the same value under another
// spelling (--topic and --topics), so that either works while --help documents one.
func aliasFlag(cmd *cobra.Command, name, alias string) {
	f := cmd.Flags().Lookup(name)
	cmd.Flags().AddFlag(&pflag.Flag{Name: alias, Usage: "same as --" + name, Value: f.Value, DefValue: f.DefValue})
	_ = cmd.Flags().MarkHidden(alias)
}

// plural is n and noun, with the noun's plural form unless n is 1 ("1 event", "2 events").
func plural(n int64, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}

// envName returns the environment variable of flag name.
func envName(name string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// withEnv makes every flag of cmd settable through its environment variable (envName) when it
// is not given on the command line, and appends "(env NAME)" to each flag's usage. It wraps
// cmd's PreRunE.
func withEnv(cmd *cobra.Command) *cobra.Command {
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		if f.Name == "help" {
			return
		}
		f.Usage += " (env " + envName(f.Name) + ")"
	})
	prev := cmd.PreRunE
	cmd.PreRunE = func(c *cobra.Command, args []string) error {
		var errs []error
		// A flag and its hidden alias (aliasFlag) share one Value: the environment fills it only
		// when neither was given, and only once.
		set := map[pflag.Value]bool{}
		c.Flags().VisitAll(func(f *pflag.Flag) {
			if f.Changed {
				set[f.Value] = true
			}
		})
		c.Flags().VisitAll(func(f *pflag.Flag) {
			if f.Changed || f.Name == "help" || set[f.Value] {
				return
			}
			v, ok := os.LookupEnv(envName(f.Name))
			if !ok {
				return
			}
			if err := f.Value.Set(v); err != nil {
				errs = append(errs, fmt.Errorf("environment variable %s=%q: %w", envName(f.Name), v, err))
				return
			}
			f.Changed = true
			set[f.Value] = true
		})
		if err := errors.Join(errs...); err != nil {
			return &usageError{err}
		}
		if prev != nil {
			return prev(c, args)
		}
		return nil
	}
	return cmd
}
