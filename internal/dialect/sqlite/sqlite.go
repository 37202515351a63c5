// Package sqlite is the SQLite dialect of the outbox (SQLite 3.35+ through database/sql with a
// pure-Go driver such as modernc.org/sqlite). SQLite has one writer at a time, which replaces
// SKIP LOCKED: each claim runs in one IMMEDIATE transaction, so relays in several processes
// never lease the same event. Times are INTEGER microseconds since the Unix epoch (UTC) from the
// writer's and the relay's clock.
package sqlite

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/watermill-outbox/outbox/internal/dialect"
)

// Dialect is the SQLite dialect. The zero value is ready; safe for concurrent use.
type Dialect struct{}

var _ dialect.Dialect = Dialect{}

// Name implements dialect.Dialect.
func (Dialect) Name() string { return "sqlite" }

// MissingTable implements dialect.Dialect: SQLite reports a missing table only in its message
// ("no such table: t", result code SQLITE_ERROR).
func (Dialect) MissingTable(err error) bool {
	return err != nil && strings.Contains(err.Error(), "no such table")
}

// Capabilities implements dialect.Dialect: one writer, so no flush beside the marks, no
// continuations and no SKIP LOCKED; the writers' and the relay's clocks.
func (Dialect) Capabilities() dialect.Capabilities {
	// JSON_MAX_DEPTH in https://www.sqlite.org/json1.html: json_valid is false beyond it.
	return dialect.Capabilities{Title: "SQLite", ClaimAhead: true, MaxJSONDepth: 1000, JSONDepthRule: "SQLite's json_valid"}
}

// Quote implements dialect.Dialect.
func (Dialect) Quote(t *dialect.Table) string { return dialect.DoubleQuote(t.Parts...) }

func quote(t *dialect.Table) string { return dialect.DoubleQuote(t.Parts...) }

func index(t *dialect.Table, suffix string) string {
	return dialect.DoubleQuote(t.IndexBase + "_" + suffix)
}

// micros returns t as microseconds since the Unix epoch, the dialect's time value.
func micros(t time.Time) int64 { return t.UnixMicro() }

// param appends v to args and returns its placeholder.
func param(args *[]any, v any) string {
	*args = append(*args, v)
	return "$" + strconv.Itoa(len(*args))
}

// topicCond renders one topic pattern as a condition on col.
func topicCond(col string, tp dialect.Topic, args *[]any) string {
	switch {
	case tp.All:
		return "true"
	case tp.Prefix:
		ph := param(args, tp.Value)
		return fmt.Sprintf("substr(%s, 1, length(%s)) = %s", col, ph, ph)
	default:
		return col + " = " + param(args, tp.Value)
	}
}

// Statements implements dialect.Dialect: the table (extra columns included) and the same
// partial indexes as on PostgreSQL.
func (Dialect) Statements(t *dialect.Table) []string {
	payload := `"payload"          TEXT NOT NULL CHECK (json_valid("payload"))`
	if t.Payload == dialect.PayloadBytea {
		payload = `"payload"          BLOB NOT NULL`
	}
	var extra strings.Builder
	for _, col := range t.Extra {
		fmt.Fprintf(&extra, ",\n\t%s %s", dialect.DoubleQuote(col.Name), col.Type)
	}
	stmts := []string{fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
	"sequence"         INTEGER PRIMARY KEY AUTOINCREMENT,
	"id"               TEXT NOT NULL UNIQUE,
	"topic"            TEXT NOT NULL CHECK ("topic" <> ''),
	%s,
	"headers"          TEXT NOT NULL DEFAULT '{}' CHECK (json_valid("headers")),
	"ordering_key"     TEXT NULL CHECK ("ordering_key" <> ''),
	"idempotency_key"  TEXT NULL,
	"created_at"       INTEGER NOT NULL DEFAULT (CAST(unixepoch('subsec') * 1000000 AS INTEGER)),
	"attempts"         INTEGER NOT NULL DEFAULT 0,
	"last_error"       TEXT NULL,
	"next_attempt_at"  INTEGER NULL,
	"lease_until"      INTEGER NULL,
	"leased_by"        TEXT NULL,
	"published_at"     INTEGER NULL,
	"dead_lettered_at" INTEGER NULL,
	"delivery_starts"  INTEGER NOT NULL DEFAULT 0,
	"last_error_class" TEXT NULL%s
)`, quote(t), payload, extra.String())}
	return append(stmts, dialect.IndexStatements(t, quote(t))...)
}

// Migrate implements dialect.Dialect: the table and indexes, and extra columns missing from an
// existing table, in one transaction (SQLite's write lock serialises concurrent Migrates).
func (d Dialect) Migrate(ctx context.Context, ex dialect.Executor, t *dialect.Table) error {
	stmts := d.Statements(t)
	return dialect.WithTx(ctx, ex, nil, func(ex dialect.Executor) error {
		if _, err := ex.Exec(ctx, stmts[0]); err != nil {
			return err
		}
		have := map[string]bool{}
		rs, err := ex.Query(ctx, `SELECT "name" FROM pragma_table_info($1)`, t.Name())
		if err != nil {
			return err
		}
		for rs.Next() {
			var name string
			if err := rs.Scan(&name); err != nil {
				rs.Close()
				return err
			}
			have[strings.ToLower(name)] = true
		}
		rs.Close()
		if err := rs.Err(); err != nil {
			return err
		}
		// A table created before delivery_starts or last_error_class existed gets them
		// (SQLite adds a column with a constant default without rewriting the table).
		relayCols := []dialect.Column{{Name: "delivery_starts", Type: "INTEGER NOT NULL DEFAULT 0"}, {Name: "last_error_class", Type: "TEXT NULL"}}
		for _, col := range append(relayCols, t.Extra...) {
			if have[strings.ToLower(col.Name)] {
				continue
			}
			if _, err := ex.Exec(ctx, fmt.Sprintf(`ALTER TABLE %s ADD COLUMN %s %s`, quote(t), dialect.DoubleQuote(col.Name), col.Type)); err != nil {
				return err
			}
		}
		if err := scopeCheck(ctx, ex, t); err != nil {
			return err
		}
		for _, st := range stmts[1:] {
			if _, err := ex.Exec(ctx, st); err != nil {
				return err
			}
		}
		return nil
	})
}

// scopeCheck returns a *dialect.ScopeMismatch when the table's idempotency index does not
// match the config (see the PostgreSQL dialect's scope check).
func scopeCheck(ctx context.Context, ex dialect.Executor, t *dialect.Table) error {
	cols := func(idx string) ([]string, error) {
		rs, err := ex.Query(ctx, `SELECT "name" FROM pragma_index_info($1) ORDER BY "seqno"`, idx)
		if err != nil {
			return nil, err
		}
		return dialect.ScanList[string](rs)
	}
	global, err := cols(t.IndexBase + "_" + dialect.GlobalKeyIndex)
	if err != nil {
		return err
	}
	have, err := cols(t.IndexBase + "_" + dialect.ScopedKeyIndex)
	if err != nil {
		return err
	}
	want := append(append([]string(nil), t.Scope...), "idempotency_key")
	switch {
	case len(t.Scope) > 0 && len(global) > 0:
		return &dialect.ScopeMismatch{Reason: dialect.ScopeMismatchReason(quote(t), t, true, nil)}
	case len(t.Scope) > 0 && len(have) > 0 && !equal(have, want), len(t.Scope) == 0 && len(have) > 0:
		return &dialect.ScopeMismatch{Reason: dialect.ScopeMismatchReason(quote(t), t, false, have)}
	}
	return nil
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// ScopeMigration implements dialect.Dialect. SQLite has no ALTER INDEX … RENAME: with a scope,
// the index is built again under its name and the temporary one dropped.
func (Dialect) ScopeMigration(t *dialect.Table) ([]string, error) {
	const drop = "DROP INDEX IF EXISTS "
	name := dialect.DoubleQuote(t.IdempotencyIndexName())
	if len(t.Scope) == 0 {
		return []string{dialect.IdempotencyIndexSQL(t, quote(t), name, false), drop + dialect.DoubleQuote(t.IndexBase+"_"+dialect.ScopedKeyIndex)}, nil
	}
	tmp := dialect.DoubleQuote(t.IndexBase + "_idempotency_new")
	return []string{
		dialect.IdempotencyIndexSQL(t, quote(t), tmp, false),
		drop + name,
		drop + dialect.DoubleQuote(t.IndexBase+"_"+dialect.GlobalKeyIndex),
		dialect.IdempotencyIndexSQL(t, quote(t), name, false),
		drop + tmp,
	}, nil
}

// Columns implements dialect.Dialect.
func (Dialect) Columns(ctx context.Context, ex dialect.Executor, t *dialect.Table) (map[string]bool, error) {
	rs, err := ex.Query(ctx, `SELECT lower("name") FROM pragma_table_info($1)`, t.Name())
	if err != nil {
		return nil, err
	}
	return dialect.ScanSet(rs)
}

// TableExists implements dialect.Dialect.
func (Dialect) TableExists(ctx context.Context, ex dialect.Executor, t *dialect.Table) (bool, error) {
	rs, err := ex.Query(ctx, `SELECT count(*) > 0 FROM sqlite_master WHERE "type" = 'table' AND "name" = $1 COLLATE NOCASE`, t.Name())
	if err != nil {
		return false, err
	}
	return dialect.ScanOne[bool](rs)
}
