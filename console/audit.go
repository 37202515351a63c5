package console

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/watermill-outbox/outbox"
)

// auditLog is the audit table: one row per action (who, when, what, on which filter, how
// many events it changed, and its error).
type auditLog struct {
	raw   string // as configured
	table string // quoted
	pool  *pgxpool.Pool
	db    *sql.DB
}

// AuditEntry is one recorded action.
type AuditEntry struct {
	ID int64
	// At is when the action ran (database clock).
	At time.Time
	// Actor is who acted: the basic-auth user or "token", '@' and the client's address.
	Actor string
	// Action names it: "retry-head", "skip-head", "purge-head", "retry-dead", "purge-dead".
	Action string
	// Target is what it acted on: the key and head sequence, or the dead-letter filter.
	Target string
	// Affected counts the events it changed.
	Affected int64
	// Error is the action's error, "" when it succeeded.
	Error string
}

// AuditSQL returns the statement that creates the audit table (idempotent), for users' own
// migration tools; table is the table name, optionally schema-qualified, unquoted.
func AuditSQL(table string) string {
	return `CREATE TABLE IF NOT EXISTS ` + quoteTable(table) + ` (
	"id"       BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	"at"       TIMESTAMPTZ NOT NULL DEFAULT now(),
	"actor"    TEXT NOT NULL,
	"action"   TEXT NOT NULL,
	"target"   TEXT NOT NULL,
	"affected" BIGINT NOT NULL,
	"error"    TEXT NULL
)`
}

func quoteTable(table string) string {
	parts := strings.Split(table, ".")
	for i, p := range parts {
		parts[i] = `"` + strings.ReplaceAll(p, `"`, `""`) + `"`
	}
	return strings.Join(parts, ".")
}

func newAuditLog(db any, table string) (*auditLog, error) {
	a := &auditLog{raw: table, table: quoteTable(table)}
	switch h := db.(type) {
	case *pgxpool.Pool:
		a.pool = h
	case *sql.DB:
		a.db = h
	default:
		return nil, &outbox.ConfigError{Field: "console.Config.DB", Reason: fmt.Sprintf("%T: give a *pgxpool.Pool or a *sql.DB", db)}
	}
	return a, nil
}

func (a *auditLog) exec(ctx context.Context, q string, args ...any) error {
	if a.pool != nil {
		_, err := a.pool.Exec(ctx, q, args...)
		return err
	}
	_, err := a.db.ExecContext(ctx, q, args...)
	return err
}

func (a *auditLog) migrate(ctx context.Context) error {
	if err := a.exec(ctx, AuditSQL(a.raw)); err != nil {
		return fmt.Errorf("console: create audit table %s: %w", a.table, err)
	}
	return nil
}

// record writes one entry. It runs with its own context so that a request cancelled after its
// action still records it.
func (a *auditLog) record(ctx context.Context, e AuditEntry) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	var errText any
	if e.Error != "" {
		errText = e.Error
	}
	err := a.exec(ctx, `INSERT INTO `+a.table+` ("actor", "action", "target", "affected", "error") VALUES ($1, $2, $3, $4, $5)`,
		e.Actor, e.Action, e.Target, e.Affected, errText)
	if err != nil {
		return fmt.Errorf("console: record action in %s: %w", a.table, err)
	}
	return nil
}

// list returns the newest limit entries, newest first (primary key order).
func (a *auditLog) list(ctx context.Context, limit int) ([]AuditEntry, error) {
	q := fmt.Sprintf(`SELECT "id", "at", "actor", "action", "target", "affected", COALESCE("error", '') FROM %s ORDER BY "id" DESC LIMIT %d`, a.table, limit)
	var out []AuditEntry
	scan := func(s func(...any) error) error {
		var e AuditEntry
		if err := s(&e.ID, &e.At, &e.Actor, &e.Action, &e.Target, &e.Affected, &e.Error); err != nil {
			return err
		}
		out = append(out, e)
		return nil
	}
	var rows scannedRows
	if a.pool != nil {
		r, err := a.pool.Query(ctx, q)
		if err != nil {
			return nil, err
		}
		defer r.Close()
		rows = r
	} else {
		r, err := a.db.QueryContext(ctx, q)
		if err != nil {
			return nil, err
		}
		defer r.Close()
		rows = r
	}
	for rows.Next() {
		if err := scan(rows.Scan); err != nil {
			return nil, err
		}
	}
	return out, rows.Err()
}

// scannedRows is what the audit reads of pgx.Rows and *sql.Rows alike.
type scannedRows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
}
