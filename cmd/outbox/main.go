// Command outbox runs and operates a watermill-outbox table from the shell.
//
//	outbox demo                                  # the whole outbox, end to end, on an embedded SQLite file
//	outbox migrate --db URL                      # create or upgrade the outbox table
//	outbox relay   --db URL --to URL             # deliver events to Kafka, RabbitMQ, Redis or a webhook
//	outbox status  --db URL                      # backlog: pending, oldest pending age, dead letters
//	outbox dead list|retry|purge --db URL …      # inspect and act on dead-lettered events
//	outbox cleanup --db URL --published-older-than 168h --yes
//	outbox replay  --db URL --since 2h [--until …] [--topic …] [--key …] --yes  # send published events again
//	outbox console --db URL [--token T]         # the operator console (HTML): backlog, blocked keys, dead letters
//	outbox inbox migrate|status|cleanup --db URL …  # the consumer inbox table (package inbox)
//	outbox doctor  --db URL [--to URL] [--json]  # check the settings the outbox depends on, with fixes
//	outbox version                               # module version, VCS commit and Go version (also --version)
//
// dead purge, cleanup and replay count what they would act on first: without --yes they change
// nothing and exit 2 naming the count; --dry-run prints the count and exits 0.
//
// Database URLs: postgres://… or postgresql://… (PostgreSQL, through a pgx pool);
// mysql://user:password@host:3306/dbname or mariadb://… (MariaDB 10.6+ or MySQL 8, through
// go-sql-driver/mysql; the query parameters go to the driver); sqlite://PATH, sqlite:PATH,
// file:PATH or a path ending in .db, .sqlite or .sqlite3 (SQLite, pure Go). inbox and capture
// work on PostgreSQL and SQLite only.
//
// Every flag of migrate, relay, status, dead, cleanup, replay (but --yes), console and doctor can
// also be given as an environment variable named OUTBOX_ and the flag's name in upper case with '-'
// as '_' (OUTBOX_DB, OUTBOX_TO, OUTBOX_BATCH_SIZE …); a flag on the command line wins over the
// environment.
//
// Errors are printed as one line on stderr, naming the fix, and the exit status is non-zero:
// 1 for a failure, 2 for a usage error. An unknown command is a usage error printed as cobra
// prints it (with its "Did you mean this?" suggestions, on several lines).
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

	"github.com/watermill-outbox/outbox/internal/dialect/dburl"
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
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return 0
	}
	var uce *unknownCommandError
	if errors.As(err, &uce) {
		// As cobra prints it: the message with its suggestions, then where to find usage.
		fmt.Fprintln(stderr, "outbox: "+err.Error())
		fmt.Fprintf(stderr, "Run '%s --help' for usage.\n", cmd.CommandPath())
		return 2
	}
	fmt.Fprintln(stderr, "outbox: "+oneLine(err.Error()))
	var ue *usageError
	if errors.As(err, &ue) {
		return 2
	}
	return 1
}

// oneLine folds a multi-line message into one line.
func oneLine(s string) string { return dburl.OneLine(s) }

func newRootCmd(stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:   "outbox",
		Short: "Run and operate a transactional outbox for Watermill",
		Long: `outbox runs and operates a watermill-outbox table.

Start with "outbox demo": it needs no server and shows the whole outbox at work.

Database URLs (--db): postgres://… or postgresql://… for PostgreSQL;
mysql://user:password@host:3306/dbname or mariadb://… for MariaDB 10.6+ and MySQL 8 (query
parameters such as ?tls=true go to the driver); sqlite://PATH, sqlite:PATH, file:PATH or a path
ending in .db, .sqlite or .sqlite3 for SQLite. inbox and capture work on PostgreSQL and SQLite
only.

Every flag of migrate, relay, status, dead, cleanup, replay, console and doctor can also be set through an environment
variable: OUTBOX_ followed by the flag name in upper case with '-' as '_' (OUTBOX_DB, OUTBOX_TO,
OUTBOX_BATCH_SIZE …). A flag given on the command line wins over the environment.`,
		SilenceErrors: true,
		SilenceUsage:  true,
	}
	root.CompletionOptions.HiddenDefaultCmd = true
	root.Version = readBuildInfo().String()
	root.SetVersionTemplate("{{.Version}}\n")
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		// "outbox stauts --db x": a group parses the flags of the command it did not find; the
		// mistyped name, read before the flag, is the error to report.
		if c.HasAvailableSubCommands() && c.Flags().NArg() > 0 {
			return unknownCommand(c, c.Flags().Arg(0))
		}
		var ive *pflag.InvalidValueError
		if errors.As(err, &ive) {
			f := ive.GetFlag()
			err = fmt.Errorf("--%s %q is not %s: give e.g. %s", f.Name, ive.GetValue(), valueForm(f), flagExample(f))
		}
		return &usageError{fmt.Errorf("%w (see %s --help)", err, c.CommandPath())}
	})
	unknownSubcommand(root)
	root.AddCommand(
		newDemoCmd(),
		newMigrateCmd(),
		newRelayCmd(),
		newStatusCmd(),
		newDeadCmd(),
		newCleanupCmd(),
		newReplayCmd(),
		newConsoleCmd(),
		newBenchCmd(),
		newInboxCmd(),
		newCaptureCmd(),
		newDoctorCmd(),
		newVersionCmd(),
	)
	return root
}

// unknownSubcommand makes cmd, a command that only groups subcommands (the root, dead), reject
// an unknown subcommand with cobra's own message and suggestions, as a usage error that run
// prints the way cobra does (cobra itself checks subcommand names on the root only, as an
// untyped error, and prints a group's help with exit status 0 for anything else). With no
// argument cmd prints its help.
func unknownSubcommand(cmd *cobra.Command) *cobra.Command {
	cmd.Args = cobra.ArbitraryArgs
	cmd.RunE = func(c *cobra.Command, args []string) error {
		if len(args) == 0 {
			return c.Help()
		}
		return unknownCommand(c, args[0])
	}
	// Runnable now, the group would list "outbox dead [flags]" as a usage of its own.
	cmd.SetUsageTemplate(strings.Replace(cmd.UsageTemplate(), "{{if .Runnable}}", "{{if and .Runnable (not .HasAvailableSubCommands)}}", 1))
	return cmd
}

// unknownCommand is the error for name, not a subcommand of group: cobra's text, with the
// subcommands whose names are close to name as cobra suggests them.
func unknownCommand(group *cobra.Command, name string) error {
	var sb strings.Builder
	if group.SuggestionsMinimumDistance <= 0 {
		group.SuggestionsMinimumDistance = 2 // cobra's default, set by its own check only
	}
	if s := group.SuggestionsFor(name); len(s) > 0 {
		sb.WriteString("\n\nDid you mean this?\n")
		for _, n := range s {
			fmt.Fprintf(&sb, "\t%s\n", n)
		}
	}
	return &unknownCommandError{fmt.Sprintf("unknown command %q for %q%s", name, group.CommandPath(), sb.String())}
}

// unknownCommandError is a subcommand that does not exist under a group (unknownSubcommand);
// it is printed like cobra's unknown-command error of the root, with exit status 2.
type unknownCommandError struct{ msg string }

func (e *unknownCommandError) Error() string { return e.msg }

// noArgs is the Args check of every command that takes flags only: an argument is a usage
// error (cobra.NoArgs would call it an unknown command, with exit status 1).
func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return &usageError{fmt.Errorf("unexpected argument %q: %s takes flags only, e.g. --db URL (see %s --help)", args[0], cmd.CommandPath(), cmd.CommandPath())}
	}
	return nil
}

// valueForm says what a value of flag f looks like, for a value that failed to parse.
func valueForm(f *pflag.Flag) string {
	switch t := f.Value.Type(); t {
	case "int", "int8", "int16", "int32", "int64", "uint", "uint8", "uint16", "uint32", "uint64":
		return "a whole number"
	case "float32", "float64":
		return "a number"
	case "duration":
		return "a Go duration (a number and a unit: 500ms, 90s, 15m, 168h)"
	case "bool":
		return "true or false"
	case "stringSlice":
		return "a comma-separated list"
	default:
		return "a valid " + t
	}
}

// exampleValue is a value of f's type to show in a message: its default when that says
// something, otherwise a typical one.
func exampleValue(f *pflag.Flag) string {
	switch f.DefValue {
	case "", "0", "0s", "[]", "false":
	default:
		return f.DefValue
	}
	switch f.Value.Type() {
	case "duration":
		return "30s"
	case "bool":
		return "true"
	case "float32", "float64":
		return "0.5"
	case "stringSlice":
		return "a,b"
	}
	return "10"
}

// flagExample is f given with an example value on the command line.
func flagExample(f *pflag.Flag) string {
	if f.Value.Type() == "bool" {
		return "--" + f.Name + "=" + exampleValue(f)
	}
	return "--" + f.Name + " " + exampleValue(f)
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

// flagError is a bad value of one flag, a usage error. Error is "--name" and reason; when the
// value came from the environment (withEnv fills env), it names the variable instead:
// `environment variable OUTBOX_NAME="value" (it sets --name)` and reason.
type flagError struct {
	flag   string // the flag's name, without dashes
	reason string // what follows the flag's name, with its separator: " must be positive", ": …"
	env    string // `OUTBOX_NAME="value"` when the value came from the environment
}

func (e *flagError) Error() string {
	if e.env == "" {
		return "--" + e.flag + e.reason
	}
	return fmt.Sprintf("environment variable %s (it sets --%s)%s", e.env, e.flag, e.reason)
}

// badFlag returns the usage error of a bad value of flag name (see flagError).
func badFlag(name, reason string) error {
	return &usageError{&flagError{flag: name, reason: reason}}
}

// checkList returns a usage error when a list flag (names: its spellings, the documented one
// first) was given, on the command line or through the environment, with no value or a blank
// one: an empty --topics must not mean the same as leaving the flag out (all topics).
func checkList(fs *pflag.FlagSet, list []string, what string, names ...string) error {
	for _, n := range names {
		if !fs.Changed(n) {
			continue
		}
		for _, v := range list {
			if strings.TrimSpace(v) == "" {
				return badFlag(n, fmt.Sprintf(" has a blank entry: give %s, or leave the flag out", what))
			}
		}
		if len(list) == 0 {
			return badFlag(n, fmt.Sprintf(" is empty: give %s, or leave the flag out", what))
		}
	}
	return nil
}

// flagEnv is the environment variable of f under withEnv: envName, or the variable f's
// envAnnotation names.
func flagEnv(f *pflag.Flag) string {
	if len(f.Annotations[envAnnotation]) == 1 {
		return f.Annotations[envAnnotation][0]
	}
	return envName(f.Name)
}

// requiredAnnotation marks a flag a command cannot run without; its values are an example
// value for the message ("URL", "168h") and what the value may look like ("" for nothing to
// say). See markRequired and checkRequired.
const requiredAnnotation = "outbox_required"

// markRequired marks cmd's flag name required, with example as its value in the message and
// forms ("" for none) saying what values it accepts.
func markRequired(cmd *cobra.Command, name, example, forms string) {
	_ = cmd.Flags().SetAnnotation(name, requiredAnnotation, []string{example, forms})
}

// checkRequired returns one usage error naming every required flag (markRequired) of cmd that
// was not given, or given empty; with env, the command reads the environment (withEnv) and the
// message names the variables too. Cobra's own check (MarkFlagRequired) runs before withEnv
// fills the flags from the environment, and names the missing flags without an example.
func checkRequired(cmd *cobra.Command, env bool) error {
	var names, examples, vars, forms []string
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		ann := f.Annotations[requiredAnnotation]
		if len(ann) != 2 || f.Changed && f.Value.String() != "" && f.Value.String() != "[]" {
			return
		}
		names = append(names, "--"+f.Name)
		examples = append(examples, "--"+f.Name+" "+ann[0])
		vars = append(vars, flagEnv(f))
		if ann[1] != "" {
			forms = append(forms, "--"+f.Name+": "+ann[1])
		}
	})
	if len(names) == 0 {
		return nil
	}
	verb := "is"
	if len(names) > 1 {
		verb = "are"
	}
	msg := fmt.Sprintf("%s %s required: pass %s", andList(names), verb, strings.Join(examples, " "))
	if env {
		msg += ", or set " + andList(vars)
	}
	if len(forms) > 0 {
		msg += " (" + strings.Join(forms, "; ") + ")"
	}
	return &usageError{fmt.Errorf("%s (see %s --help)", msg, cmd.CommandPath())}
}

// andList joins s as "a", "a and b", "a, b and c".
func andList(s []string) string {
	if len(s) < 2 {
		return strings.Join(s, "")
	}
	return strings.Join(s[:len(s)-1], ", ") + " and " + s[len(s)-1]
}

// envName returns the environment variable of flag name.
func envName(name string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// selectAnnotation marks the flags that select what a command acts on (dead --topic, --id):
// when the command line gives one of them, the environment sets none of them, so that
// `dead purge --id X` never acts on more than X.
const selectAnnotation = "outbox_select"

// envAnnotation names a flag's environment variable when it is not envName's.
const envAnnotation = "outbox_env"

// noEnvAnnotation marks a flag that only the command line sets (--yes): a confirmation left
// in the environment would confirm every later run.
const noEnvAnnotation = "outbox_no_env"

// withEnv makes every flag of cmd settable through its environment variable (envName) when it
// is not given on the command line, and appends "(env NAME)" to each flag's usage. It wraps
// cmd's PreRunE, and its RunE so that a flagError of a flag the environment set names the
// variable.
// Hidden spellings (aliasFlag) have no variable: OUTBOX_TOPICS is relay --topics' alone. A flag
// annotated with envAnnotation uses the variable it names; one annotated with noEnvAnnotation
// has none.
func withEnv(cmd *cobra.Command) *cobra.Command {
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		if f.Name == "help" || f.Annotations[noEnvAnnotation] != nil {
			return
		}
		f.Usage += " (env " + flagEnv(f) + ")"
	})
	// fromEnv maps each flag the environment set to `NAME="value"`, for flagError.
	fromEnv := map[string]string{}
	prev := cmd.PreRunE
	cmd.PreRunE = func(c *cobra.Command, args []string) error {
		clear(fromEnv)
		var errs []error
		// A flag and its hidden alias (aliasFlag) share one Value: the environment fills it only
		// when neither was given, and only once.
		set := map[pflag.Value]bool{}
		selected := false
		c.Flags().VisitAll(func(f *pflag.Flag) {
			if f.Changed {
				set[f.Value] = true
				selected = selected || f.Annotations[selectAnnotation] != nil
			}
		})
		c.Flags().VisitAll(func(f *pflag.Flag) {
			if f.Changed || f.Name == "help" || f.Hidden || set[f.Value] || selected && f.Annotations[selectAnnotation] != nil || f.Annotations[noEnvAnnotation] != nil {
				return
			}
			v, ok := os.LookupEnv(flagEnv(f))
			if !ok {
				return
			}
			if err := f.Value.Set(v); err != nil {
				errs = append(errs, fmt.Errorf("environment variable %s=%q is not %s (it sets --%s): give e.g. %s=%s",
					flagEnv(f), v, valueForm(f), f.Name, flagEnv(f), exampleValue(f)))
				return
			}
			f.Changed = true
			set[f.Value] = true
			fromEnv[f.Name] = fmt.Sprintf("%s=%q", flagEnv(f), v)
		})
		if err := errors.Join(errs...); err != nil {
			return &usageError{err}
		}
		if err := checkRequired(c, true); err != nil {
			return err
		}
		if prev != nil {
			return prev(c, args)
		}
		return nil
	}
	if run := cmd.RunE; run != nil {
		cmd.RunE = func(c *cobra.Command, args []string) error {
			err := run(c, args)
			var fe *flagError
			if errors.As(err, &fe) {
				fe.env = fromEnv[fe.flag]
			}
			return err
		}
	}
	return cmd
}
