// Package doctor checks the configuration an outbox depends on and says how to fix what is
// wrong: the table and its indexes, the database server's version and settings, the pooler in
// front of it, the wakeup path, old transactions that stop cleanup, autovacuum and JIT on
// PostgreSQL, and the settings of the destination that matter for delivery (Kafka acks and
// idempotence, RabbitMQ confirms and queues, Redis eviction, the webhook address guard).
//
// Every check returns a Check with a Verdict (OK, Warn, Fail or Skipped with the reason) and,
// when it is not OK, the fix in a sentence or two. The checks only read: they write no event
// and change no setting (the LISTEN/NOTIFY check notifies a channel of its own).
// `outbox doctor` runs them from the shell.
//
//	checks, err := doctor.Database(ctx, pool, doctor.Config{Schema: schema})
//	checks = append(checks, doctor.Redis(ctx, redisOptions))
//	if doctor.Failed(checks) { … }
package doctor

import (
	"fmt"
	"strings"
	"time"

	"github.com/watermill-outbox/outbox"
)

// Verdict is the outcome of one check.
type Verdict string

const (
	// OK: nothing to do.
	OK Verdict = "ok"
	// Warn: works, but something will cost latency, space or a surprise later; the fix says what.
	Warn Verdict = "warn"
	// Fail: the outbox does not work as configured (or will not keep working); the fix says what.
	Fail Verdict = "fail"
	// Skipped: the check does not apply here; the detail says why.
	Skipped Verdict = "skipped"
)

// Check is the result of one check.
type Check struct {
	// Name identifies the check ("schema", "pooler", "redis-eviction"…); stable across releases.
	Name string `json:"name"`
	// Verdict is the outcome.
	Verdict Verdict `json:"verdict"`
	// Detail says what was found (or, when Skipped, why the check does not apply).
	Detail string `json:"detail"`
	// Fix says what to do, when Verdict is Warn or Fail; empty otherwise.
	Fix string `json:"fix"`
}

// Failed reports whether any check failed.
func Failed(checks []Check) bool {
	for _, c := range checks {
		if c.Verdict == Fail {
			return true
		}
	}
	return false
}

// Wakeup names what wakes the relays between polls, for the LISTEN/NOTIFY check's verdict.
type Wakeup string

const (
	// WakeProbe: the relays probe the table's sequence (PostgreSQL's default, what `outbox
	// relay` uses); LISTEN/NOTIFY not reaching a listener is only a warning.
	WakeProbe Wakeup = "probe"
	// WakeListen: the relays use wakeup/pgnotify (LISTEN/NOTIFY) over this database's
	// connection settings; a NOTIFY that does not reach its LISTEN is a failure.
	WakeListen Wakeup = "listen"
)

// Defaults of Config.
const (
	DefaultOldTxWarn    = time.Minute
	DefaultOldTxFail    = 10 * time.Minute
	DefaultProbeTimeout = 2 * time.Second
	// DeadTuplesWarn is the dead row versions of the outbox table above which (and above its
	// live rows) the dead-tuples check warns: autovacuum is not keeping up, or an old snapshot
	// keeps it from removing them.
	DeadTuplesWarn = 100_000
	// MinPostgresVersion is the oldest supported PostgreSQL (server_version_num).
	MinPostgresVersion = 130000
)

// Config configures Database. The zero value checks the default table with the default
// thresholds.
type Config struct {
	// Schema is the outbox table's schema, as given to Migrate (its Dialect selects the
	// checks).
	Schema outbox.SchemaConfig
	// OldTxWarn and OldTxFail bound how long a session may sit idle inside a transaction, and
	// how old the oldest snapshot (a backend's xmin, by its transaction's start) may be,
	// before the idle-in-transaction and oldest-xmin checks warn or fail. Defaults
	// DefaultOldTxWarn (1m) and DefaultOldTxFail (10m); OldTxFail must not be below
	// OldTxWarn; negative is a *outbox.ConfigError.
	OldTxWarn, OldTxFail time.Duration
	// Wakeup is what wakes the relays (PostgreSQL): WakeProbe (default) or WakeListen.
	Wakeup Wakeup
	// ProbeTimeout bounds the LISTEN/NOTIFY round trip. Default DefaultProbeTimeout (2s).
	ProbeTimeout time.Duration
	// Slot is the logical replication slot of the WAL path to check (PostgreSQL); empty =
	// none (the check is skipped: the outbox has no WAL path yet).
	Slot string
	// MigrateHint is how the user creates or upgrades the table, for fixes. Default
	// "outbox.Migrate (or `outbox migrate`)".
	MigrateHint string
}

func (c *Config) setDefaults() {
	if c.OldTxWarn == 0 {
		c.OldTxWarn = DefaultOldTxWarn
	}
	if c.OldTxFail == 0 {
		c.OldTxFail = max(DefaultOldTxFail, c.OldTxWarn)
	}
	if c.ProbeTimeout == 0 {
		c.ProbeTimeout = DefaultProbeTimeout
	}
	if c.Wakeup == "" {
		c.Wakeup = WakeProbe
	}
	if c.MigrateHint == "" {
		c.MigrateHint = "outbox.Migrate (or `outbox migrate`)"
	}
}

// Validate returns a *outbox.ConfigError naming the first invalid field, or nil.
func (c Config) Validate() error {
	bad := func(field, reason string) error {
		return &outbox.ConfigError{Field: "doctor.Config." + field, Reason: reason}
	}
	switch {
	case c.OldTxWarn < 0:
		return bad("OldTxWarn", "must not be negative")
	case c.OldTxFail < 0:
		return bad("OldTxFail", "must not be negative")
	case c.OldTxFail != 0 && c.OldTxFail < c.OldTxWarn:
		return bad("OldTxFail", "must not be below OldTxWarn")
	case c.ProbeTimeout < 0:
		return bad("ProbeTimeout", "must not be negative")
	case c.Wakeup != "" && c.Wakeup != WakeProbe && c.Wakeup != WakeListen:
		return bad("Wakeup", fmt.Sprintf("%q: want %q or %q", c.Wakeup, WakeProbe, WakeListen))
	}
	return c.Schema.Validate()
}

// skipped is a Skipped check with its reason.
func skipped(name, why string) Check { return Check{Name: name, Verdict: Skipped, Detail: why} }

// ok is an OK check.
func ok(name, detail string) Check { return Check{Name: name, Verdict: OK, Detail: detail} }

// failed is a Fail check.
func failed(name, detail, fix string) Check {
	return Check{Name: name, Verdict: Fail, Detail: detail, Fix: fix}
}

// warned is a Warn check.
func warned(name, detail, fix string) Check {
	return Check{Name: name, Verdict: Warn, Detail: detail, Fix: fix}
}

// errCheck is the check name could not run because of err.
func errCheck(name, doing string, err error) Check {
	return failed(name, fmt.Sprintf("%s: %s", doing, oneLine(err.Error())), "check the error above; the check needs read access to the server's catalog and statistics views")
}

// oneLine folds s into one line.
func oneLine(s string) string {
	return strings.Join(strings.Fields(strings.ReplaceAll(s, "\n", " ; ")), " ")
}

// byAge is a duration for messages, rounded to what a human reads.
func byAge(d time.Duration) string {
	switch {
	case d >= time.Hour:
		return d.Round(time.Minute).String()
	case d >= time.Minute:
		return d.Round(time.Second).String()
	}
	return d.Round(time.Millisecond).String()
}

// grade returns Fail, Warn or OK for age against the thresholds.
func (c Config) grade(age time.Duration) Verdict {
	switch {
	case age >= c.OldTxFail:
		return Fail
	case age >= c.OldTxWarn:
		return Warn
	}
	return OK
}
