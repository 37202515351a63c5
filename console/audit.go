package console

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/internal/dialect"
)

// auditLog is the audit table: one row per action (who, when, what, on which filter, how
// many events it changed, and its error), with its statements in the database's SQL.
type auditLog struct {
	raw     string // as configured
	table   string // quoted
	d       outbox.Dialect
	insert  string // $1…$5 or ?: actor, action, target, affected, error
	listSQL string // ends with LIMIT: the limit follows
	pool    *pgxpool.Pool
	db      *sql.DB
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

// AuditSQL returns the PostgreSQL statement that creates the audit table (idempotent), for
// users' own migration tools; table is the table name, optionally schema-qualified, unquoted.
// AuditSQLFor gives it for another database.
func AuditSQL(table string) string { return AuditSQLFor(outbox.DialectPostgreSQL, table) }

// AuditSQLFor returns the statement that creates the audit table (idempotent) in database d;
// table is the table name, optionally qualified by its schema (database on MariaDB/MySQL),
// unquoted. Times are TIMESTAMPTZ on PostgreSQL, DATETIME(6) UTC on MariaDB/MySQL and INTEGER
// microseconds since the epoch on SQLite (as in the outbox table).
func AuditSQLFor(d outbox.Dialect, table string) string {
	switch d {
	case outbox.DialectSQLite:
		return `CREATE TABLE IF NOT EXISTS ` + quoteTable(table, '"') + ` (
	"id"       INTEGER PRIMARY KEY AUTOINCREMENT,
	"at"       INTEGER NOT NULL DEFAULT (CAST(unixepoch('subsec') * 1000000 AS INTEGER)),
	"actor"    TEXT NOT NULL,
	"action"   TEXT NOT NULL,
	"target"   TEXT NOT NULL,
	"affected" INTEGER NOT NULL,
	"error"    TEXT NULL
)`
	case outbox.DialectMySQL:
		return "CREATE TABLE IF NOT EXISTS " + quoteTable(table, '`') + ` (
	` + "`id`       BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY," + `
	` + "`at`       DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6))," + `
	` + "`actor`    TEXT NOT NULL," + `
	` + "`action`   TEXT NOT NULL," + `
	` + "`target`   TEXT NOT NULL," + `
	` + "`affected` BIGINT NOT NULL," + `
	` + "`error`    TEXT NULL" + `
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4`
	}
	return `CREATE TABLE IF NOT EXISTS ` + quoteTable(table, '"') + ` (
	"id"       BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	"at"       TIMESTAMPTZ NOT NULL DEFAULT now(),
	"actor"    TEXT NOT NULL,
	"action"   TEXT NOT NULL,
	"target"   TEXT NOT NULL,
	"affected" BIGINT NOT NULL,
	"error"    TEXT NULL
)`
}

// quoteTable quotes each dot-separated part of table with q (doubled inside).
func quoteTable(table string, q byte) string {
	parts := strings.Split(table, ".")
	for i, p := range parts {
		parts[i] = string(q) + strings.ReplaceAll(p, string(q), string(q)+string(q)) + string(q)
	}
	return strings.Join(parts, ".")
}

func newAuditLog(db any, d outbox.Dialect, table string) (*auditLog, error) {
	a := &auditLog{raw: table, table: quoteTable(table, '"'), d: d}
	switch h := db.(type) {
	case *pgxpool.Pool:
		a.pool = h
	case *sql.DB:
		a.db = h
	default:
		return nil, &outbox.ConfigError{Field: "console.Config.DB", Reason: fmt.Sprintf("%T: give a *pgxpool.Pool or a *sql.DB", db)}
	}
	a.insert = `INSERT INTO ` + a.table + ` ("actor", "action", "target", "affected", "error") VALUES ($1, $2, $3, $4, $5)`
	a.listSQL = `SELECT "id", "at", "actor", "action", "target", "affected", COALESCE("error", '') FROM ` + a.table + ` ORDER BY "id" DESC LIMIT `
	if d == outbox.DialectMySQL {
		a.table = quoteTable(table, '`')
		a.insert = "INSERT INTO " + a.table + " (`actor`, `action`, `target`, `affected`, `error`) VALUES (?, ?, ?, ?, ?)"
		a.listSQL = "SELECT `id`, CAST(`at` AS CHAR), `actor`, `action`, `target`, `affected`, COALESCE(`error`, '') FROM " + a.table + " ORDER BY `id` DESC LIMIT "
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
	if err := a.exec(ctx, AuditSQLFor(a.d, a.raw)); err != nil {
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
	err := a.exec(ctx, a.insert, e.Actor, e.Action, e.Target, e.Affected, errText)
	if err != nil {
		return fmt.Errorf("console: record action in %s: %w", a.table, err)
	}
	return nil
}

// list returns the newest limit entries, newest first (primary key order).
func (a *auditLog) list(ctx context.Context, limit int) ([]AuditEntry, error) {
	q := a.listSQL + strconv.Itoa(limit)
	var out []AuditEntry
	scan := func(s func(...any) error) error {
		var e AuditEntry
		if err := s(&e.ID, (*dialect.Time)(&e.At), &e.Actor, &e.Action, &e.Target, &e.Affected, &e.Error); err != nil {
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
