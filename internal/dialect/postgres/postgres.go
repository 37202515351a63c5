// Package postgres is the PostgreSQL dialect of the outbox (PostgreSQL 13+, through pgx/v5 or
// database/sql with the pgx stdlib driver): relays share a table through FOR UPDATE SKIP LOCKED,
// and every time comes from the database clock.
package postgres

import (
	"context"
	_ "embed"
	"errors"
	"strconv"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/watermill-outbox/outbox/internal/dialect"
)

// Dialect is the PostgreSQL dialect. The zero value is ready; safe for concurrent use.
type Dialect struct{}

var _ dialect.Dialect = Dialect{}

// Name implements dialect.Dialect.
func (Dialect) Name() string { return "postgresql" }

// MissingTable implements dialect.Dialect: SQLSTATE 42P01, undefined_table.
func (Dialect) MissingTable(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "42P01"
}

// Capabilities implements dialect.Dialect.
func (Dialect) Capabilities() dialect.Capabilities {
	return dialect.Capabilities{Notify: true, FlushAcks: true, Continuations: true, SkipLocked: true,
		DatabaseClock: true, SchemaQualified: true, FillFactor: true, Floors: true, ClaimAhead: true, Title: "PostgreSQL"}
}

// Quote implements dialect.Dialect.
func (Dialect) Quote(t *dialect.Table) string { return dialect.DoubleQuote(t.Parts...) }

func index(t *dialect.Table, suffix string) string {
	return dialect.DoubleQuote(t.IndexBase + "_" + suffix)
}

// params collects a statement's named parameters while its SQL text is built.
type params map[string]any

// add names v (prefix plus a number) and returns its placeholder.
func (p params) add(prefix string, v any) string {
	name := prefix + strconv.Itoa(len(p))
	p[name] = v
	return "@" + name
}

// topicCond renders one topic pattern as a condition on col.
func topicCond(col string, tp dialect.Topic, p params) string {
	switch {
	case tp.All:
		return "true"
	case tp.Prefix:
		return "starts_with(" + col + ", " + p.add("topic", tp.Value) + ")"
	default:
		return col + " = " + p.add("topic", tp.Value)
	}
}

// exec runs a named statement.
func exec(ctx context.Context, ex dialect.Executor, q string, p params, oneShot bool) (int64, error) {
	st := dialect.Compile(q, dialect.Dollar)
	args := st.Args(p)
	if oneShot {
		args = ex.OneShot(args)
	}
	return ex.Exec(ctx, st.SQL, args...)
}

// query runs a named query.
func query(ctx context.Context, ex dialect.Executor, q string, p params, oneShot bool) (dialect.Rows, error) {
	st := dialect.Compile(q, dialect.Dollar)
	args := st.Args(p)
	if oneShot {
		args = ex.OneShot(args)
	}
	return ex.Query(ctx, st.SQL, args...)
}

//go:embed claim.sql
var claimFile string

//go:embed mark.sql
var markFile string

var (
	claimStmts = dialect.ParseSQLFile(claimFile)
	markStmts  = dialect.ParseSQLFile(markFile)
)
