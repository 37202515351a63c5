// Package dialecttest is the contract suite every dialect.Dialect passes unchanged, in the
// manner of River's riverdrivertest: Run exercises each operation of the Dialect and Relay
// interfaces on a real database through a Harness and asserts the exact rows and values the
// interface documents. A dialect's own package runs it from its tests, once per way of
// connecting (pgx, database/sql, a transaction-mode pooler …).
//
// A new dialect's package adds one test that calls Run with a Harness for its database. Checks
// that depend on a capability (Capabilities.Continuations, Floors, Notify) run
// only for dialects that have it, and say so when skipped; so do the Operator checks, for a
// dialect that does not implement dialect.Operator. Every table is fresh (Harness.Table),
// so the suite may share a database server with other tests.
//
// Time-dependent checks never sleep: leases, due times and ages are moved into the past with
// the harness's own SQL (Harness.At).
package dialecttest

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/watermill-outbox/outbox/internal/dialect"
)

// Harness is what the suite needs of one database and one way of connecting to it.
type Harness struct {
	// Dialect is the dialect under test.
	Dialect dialect.Dialect
	// Ex is the relay's own handle (a pool): claims, marks and operations run on it.
	Ex dialect.Executor
	// Raw runs the suite's own SQL: double-quoted identifiers and $1, $2 … placeholders.
	// It may be Ex when the database takes that SQL.
	Raw dialect.Executor
	// Table returns a fresh table config for t (a unique name, not yet created; the table is
	// dropped when t ends).
	Table func(t *testing.T) *dialect.Table
	// InTx runs fn in a transaction, committed when fn returns nil and rolled back otherwise
	// (nil: dialect.WithTx on Ex).
	InTx func(ctx context.Context, fn func(ex dialect.Executor) error) error
	// At returns an SQL expression (no parameters) of the time columns' value d from now on
	// the dialect's clock (negative d: in the past).
	At func(d time.Duration) string
	// TextType is the DDL type of a nullable text extra column ("text", "VARCHAR(64) NULL").
	TextType string
	// Listen (Capabilities.Notify) listens on channel until t ends and delivers each
	// notification's payload in order.
	Listen func(t *testing.T, channel string) <-chan string
	// Session returns the id of the database session ex runs on (inside a transaction), and
	// Waiting whether that session waits for a lock; nil for a database with one writer
	// (SQLite), whose transactions commit in the order they began.
	Session func(ctx context.Context, ex dialect.Executor) (int64, error)
	Waiting func(ctx context.Context, session int64) (bool, error)
	// CurrentTx returns the id (low 32 bits) of the transaction ex runs, for a dialect that is
	// a dialect.WakeProber.
	CurrentTx func(ctx context.Context, ex dialect.Executor) (uint32, error)
	// Deviations are the suite's checks (by name) this dialect is known to fail, each with
	// the reason: such a check logs its failure instead of failing, and fails once it passes
	// (remove the entry then). Names: "ClaimLimit", "WakeProbe".
	Deviations map[string]string
}

// Pgx is the dialect.Executor of a pgx handle (pgx.Tx, *pgx.Conn, *pgxpool.Pool), for
// harnesses: the outbox's own lives in the root package.
type Pgx struct {
	D interface {
		Exec(ctx context.Context, sql string, arguments ...any) (pgconn.CommandTag, error)
		Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	}
	Tx bool
}

// Query implements dialect.Executor.
func (e Pgx) Query(ctx context.Context, q string, args ...any) (dialect.Rows, error) {
	r, err := e.D.Query(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	return r, nil
}

// Exec implements dialect.Executor.
func (e Pgx) Exec(ctx context.Context, q string, args ...any) (int64, error) {
	tag, err := e.D.Exec(ctx, q, args...)
	return tag.RowsAffected(), err
}

// InTx implements dialect.Executor.
func (e Pgx) InTx() bool { return e.Tx }

// OneShot implements dialect.Executor: pgx's QueryExecModeExec before args.
func (e Pgx) OneShot(args []any) []any { return append([]any{pgx.QueryExecModeExec}, args...) }

// Handle implements dialect.Executor.
func (e Pgx) Handle() any { return e.D }

// Run runs the whole suite on h, one subtest per area.
func Run(t *testing.T, h Harness) {
	s := &suite{h: h}
	t.Run("Schema", s.schema)
	t.Run("ScopeMigration", s.scopeMigration)
	t.Run("Insert", s.insertRows)
	t.Run("InsertIdempotent", s.insertIdempotent)
	t.Run("InsertExtra", s.insertExtra)
	t.Run("InsertScoped", s.insertScoped)
	t.Run("InsertNotify", s.insertNotify)
	t.Run("InsertKeyCommitOrder", s.insertKeyOrder)
	t.Run("InsertIdempotentRace", s.insertIdempotentRace)
	t.Run("ClaimFilters", s.claimFilters)
	t.Run("ClaimFilterLiterals", s.claimFilterLiterals)
	t.Run("ClaimPausedAndProbe", s.claimPaused)
	t.Run("ClaimKeyOrder", s.claimKeyOrder)
	t.Run("ClaimKeyOrderEager", (&suite{h: h, eager: true}).claimKeyOrder)
	t.Run("ClaimRuns", s.claimRuns)
	t.Run("ClaimBatch", s.claimBatch)
	t.Run("ClaimKeyAcrossTopics", s.claimKeyAcrossTopics)
	t.Run("ClaimSkipScan", s.claimSkipScan)
	t.Run("ClaimContinuation", s.claimContinuation)
	t.Run("Floors", s.floors)
	t.Run("PayloadBytes", s.payloadBytes)
	t.Run("PayloadAsWritten", s.payloadAsWritten)
	t.Run("EmptyCalls", s.emptyCalls)
	t.Run("ExpiredLeaseStillHeld", s.expiredLease)
	t.Run("LeaseExpiryAndFencing", s.leaseExpiry)
	t.Run("Renew", s.renew)
	t.Run("MarkFailures", s.markFailures)
	t.Run("MarkUnavailableAbandoned", s.markUnavailable)
	t.Run("MarkHeld", s.markHeld)
	t.Run("TakeBack", s.takeBack)
	t.Run("DeadLetters", s.deadLetters)
	t.Run("Replay", s.replay)
	t.Run("PurgeDeadReleasesKey", s.purgeKeyed)
	t.Run("Cleanup", s.cleanup)
	t.Run("Backlog", s.backlog)
	t.Run("MissingTable", s.missingTable)
	t.Run("OperatorBlockedKeys", s.operatorBlockedKeys)
	t.Run("OperatorActOnHead", s.operatorActOnHead)
	t.Run("OperatorDeadFilters", s.operatorDeadFilters)
	t.Run("OperatorDeliveryStats", s.operatorDeliveryStats)
	t.Run("OperatorLeases", s.operatorLeases)
	t.Run("OperatorOverview", s.operatorOverview)
	t.Run("WakeProbe", s.wakeProbe)
}
