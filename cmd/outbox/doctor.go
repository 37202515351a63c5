package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/doctor"
)

// doctorApplicationName is the application_name of the doctor's PostgreSQL sessions.
const doctorApplicationName = "outbox doctor"

// maxPendingQueues bounds the RabbitMQ queues the doctor derives from pending topics.
const maxPendingQueues = 50

func newDoctorCmd() *cobra.Command {
	var (
		f            dbFlags
		to           string
		asJSON       bool
		wake         string
		slot         string
		oldWarn      time.Duration
		oldFail      time.Duration
		probeTimeout time.Duration
		exchange     string
		queues       []string
		destTopic    string
		allow        []string
	)
	cmd := &cobra.Command{
		Use:   "doctor --db URL [--to URL] [--json]",
		Short: "Check the database, pooler, wakeup and destination settings the outbox depends on",
		Long: `doctor runs a checklist against the database (and, with --to, the destination) and prints each
item with its verdict — ok, warn, fail or skipped (with the reason) — and, when it is not ok,
the fix. It only reads: it writes no event and changes no setting.

PostgreSQL: server version (13+), the table with every column and index Migrate creates, a
transaction-mode pooler and the pgx exec mode, the relay's wake probe (the table's sequence
has CACHE 1), a LISTEN/NOTIFY signal sent and received (wakeup/pgnotify), wal_level and the
replication slot (--slot), sessions idle in a transaction and the oldest snapshot (xmin),
autovacuum and dead row versions of the table, JIT for the role. SQLite and MariaDB/MySQL: the
checks that apply; the others are skipped with the reason.

Destinations (--to): Kafka brokers answer and grant an idempotent producer; RabbitMQ accepts
publisher confirms, the --amqp-exchange exists and the queues exist (--amqp-queue, --dest-topic,
or the topics with pending events when publishing through the default exchange); Redis (and
asynq's Redis) has maxmemory-policy noeviction; a webhook URL passes the address guard
(--allow-prefix) and accepts connections.

Exit status: 0 when nothing failed (warnings included), 1 when a check failed, 2 for a usage
error. --json prints a JSON array of {name, verdict, detail, fix}.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			cfg := doctor.Config{OldTxWarn: oldWarn, OldTxFail: oldFail, ProbeTimeout: probeTimeout, Wakeup: doctor.Wakeup(wake), Slot: slot}
			switch {
			case wake != string(doctor.WakeProbe) && wake != string(doctor.WakeListen):
				return badFlag("wakeup", fmt.Sprintf(" %q: want %q (the relay's sequence probe, what `outbox relay` uses) or %q (wakeup/pgnotify)", wake, doctor.WakeProbe, doctor.WakeListen))
			case oldWarn <= 0:
				return badFlag("old-tx-warn", " must be positive")
			case oldFail < oldWarn:
				return badFlag("old-tx-fail", " must not be below --old-tx-warn")
			case probeTimeout <= 0:
				return badFlag("probe-timeout", " must be positive")
			}
			var dest *destURL
			if to != "" {
				d, err := parseDestURL(to)
				if err != nil {
					return err
				}
				dest = &d
			}
			prefixes, err := parsePrefixes(allow)
			if err != nil {
				return err
			}
			u, err := parseDBURL(f.db)
			if err != nil {
				return err
			}
			d, err := openDB(ctx, u, f.table, openOptions{applicationName: doctorApplicationName})
			if err != nil {
				return err
			}
			defer d.Close()
			cfg.Schema = d.schema
			cfg.MigrateHint = d.migrateHint()
			checks, err := doctor.Database(ctx, d.Handle(), cfg)
			if err != nil {
				return err
			}
			if dest != nil {
				checks = append(checks, destChecks(ctx, d, *dest, checks, exchange, queues, destTopic, prefixes)...)
			}
			if err := printChecks(cmd.OutOrStdout(), d, dest, checks, asJSON); err != nil {
				return err
			}
			var names []string
			for _, c := range checks {
				if c.Verdict == doctor.Fail {
					names = append(names, c.Name)
				}
			}
			if len(names) > 0 {
				return &failedError{fmt.Sprintf("doctor: %s failed: %s", plural(int64(len(names)), "check", "checks"), strings.Join(names, ", "))}
			}
			return nil
		},
	}
	f.register(cmd)
	fl := cmd.Flags()
	fl.StringVar(&to, "to", "", "destination URL to check as the relay would use it: "+destForms)
	fl.BoolVar(&asJSON, "json", false, "print a JSON array of {name, verdict, detail, fix}")
	fl.StringVar(&wake, "wakeup", string(doctor.WakeProbe), "PostgreSQL: what wakes the relays: probe (the sequence probe of `outbox relay`; LISTEN/NOTIFY not arriving is a warning) or listen (wakeup/pgnotify; it is a failure)")
	fl.StringVar(&slot, "slot", "", "PostgreSQL: logical replication slot to check; empty = none (the check is skipped)")
	fl.DurationVar(&oldWarn, "old-tx-warn", doctor.DefaultOldTxWarn, "warn about a session idle in a transaction, or a snapshot (xmin) open, this long")
	fl.DurationVar(&oldFail, "old-tx-fail", doctor.DefaultOldTxFail, "fail on a session idle in a transaction, or a snapshot (xmin) open, this long")
	fl.DurationVar(&probeTimeout, "probe-timeout", doctor.DefaultProbeTimeout, "PostgreSQL: how long to wait for the LISTEN/NOTIFY signal")
	fl.StringVar(&exchange, "amqp-exchange", "", "RabbitMQ: the exchange the relay publishes through (checked to exist); empty = the default exchange")
	fl.StringSliceVar(&queues, "amqp-queue", nil, "RabbitMQ: a queue that must exist; repeatable or comma-separated")
	fl.StringVar(&destTopic, "dest-topic", "", "the relay's fixed destination topic (through RabbitMQ's default exchange: a queue that must exist)")
	fl.StringSliceVar(&allow, "allow-prefix", nil, "webhook: a private or loopback range the relay is allowed to reach (as relay --allow-prefix); repeatable")
	return withEnv(cmd)
}

// destChecks runs the checks of dest. For RabbitMQ through the default exchange, the queues
// are --amqp-queue, --dest-topic, or else the topics with pending events (each routing key
// must name a queue).
func destChecks(ctx context.Context, d *database, dest destURL, dbChecks []doctor.Check, exchange string, queues []string, destTopic string, allow []netip.Prefix) []doctor.Check {
	switch dest.kind {
	case destKafka:
		return []doctor.Check{doctor.Kafka(ctx, dest.brokers)}
	case destAMQP:
		qs := append([]string(nil), queues...)
		if exchange == "" {
			switch {
			case destTopic != "":
				qs = append(qs, destTopic)
			case len(queues) == 0 && schemaOK(dbChecks):
				qs = append(qs, pendingTopics(ctx, d)...)
			}
		}
		return doctor.RabbitMQ(ctx, dest.raw, exchange, dedupe(qs))
	case destRedis:
		return []doctor.Check{doctor.Redis(ctx, dest.redis, "stream")}
	case destAsynq:
		return []doctor.Check{doctor.Redis(ctx, dest.redis, "asynq task")}
	case destHTTP:
		return []doctor.Check{doctor.Webhook(ctx, dest.raw, allow)}
	}
	return nil
}

// schemaOK reports whether the schema check passed (the table can be read).
func schemaOK(checks []doctor.Check) bool {
	for _, c := range checks {
		if c.Name == "schema" {
			return c.Verdict == doctor.OK
		}
	}
	return false
}

// pendingTopics returns up to maxPendingQueues topics with pending events (none when they
// cannot be read: the RabbitMQ check then says it has no queue to check).
func pendingTopics(ctx context.Context, d *database) []string {
	sub, err := outbox.NewSubscriber(d.Handle(), outbox.SubscriberConfig{Schema: d.schema}, nil)
	if err != nil {
		return nil
	}
	defer sub.Close()
	topics, err := sub.BacklogByTopic(ctx)
	if err != nil {
		return nil
	}
	var out []string
	for _, t := range topics {
		if t.Pending > 0 && len(out) < maxPendingQueues {
			out = append(out, t.Topic)
		}
	}
	return out
}

// dedupe returns s without repeats, in order.
func dedupe(s []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, v := range s {
		if !seen[v] {
			seen[v] = true
			out = append(out, v)
		}
	}
	return out
}

// printChecks prints the checks as a table (or JSON) with a summary line.
func printChecks(w io.Writer, d *database, dest *destURL, checks []doctor.Check, asJSON bool) error {
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(checks)
	}
	target := fmt.Sprintf("%s, table %q", d.where(), d.tableName())
	if dest != nil {
		target += ", destination " + dest.shown
	}
	fmt.Fprintln(w, "outbox doctor: "+target)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	counts := map[doctor.Verdict]int{}
	for _, c := range checks {
		counts[c.Verdict]++
		v := string(c.Verdict)
		if c.Verdict == doctor.Warn || c.Verdict == doctor.Fail {
			v = strings.ToUpper(v)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", v, c.Name, c.Detail)
		if c.Fix != "" {
			fmt.Fprintf(tw, "\t\tfix: %s\n", c.Fix)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "%d ok, %d warn, %d fail, %d skipped\n", counts[doctor.OK], counts[doctor.Warn], counts[doctor.Fail], counts[doctor.Skipped])
	return err
}
