package inbox

import (
	"context"
	"fmt"
	"hash/fnv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/watermill-outbox/outbox"
)

// DefaultTable is the inbox table name used when SchemaConfig.Table is empty.
const DefaultTable = "watermill_inbox"

// SchemaConfig names the inbox table. The zero value is the table "watermill_inbox" in the
// connection's search_path on PostgreSQL. The same SchemaConfig must be given to Migrate, New
// and the operations (Cleanup, Count, Status).
type SchemaConfig struct {
	// Table is the table name, optionally schema-qualified on PostgreSQL ("billing.inbox").
	// Each part is quoted as an identifier, so any characters but '.' and NUL are safe.
	// Default DefaultTable.
	Table string
	// Dialect is the database the table lives in: outbox.DialectPostgreSQL (default) or
	// outbox.DialectSQLite. It must be the dialect of the outbox table the handler publishes
	// to (one transaction writes both).
	Dialect outbox.Dialect
}

// schema is a validated SchemaConfig with its SQL pieces.
type schema struct {
	cfg       SchemaConfig
	table     string // quoted, possibly qualified
	tableName string // unquoted table part
	d         dialectSQL
	lockSeed  int64 // Migrate's advisory lock
	insertSQL string
}

// Validate checks the configuration and returns an *outbox.ConfigError naming the field, or nil.
func (c SchemaConfig) Validate() error {
	_, err := c.compile()
	return err
}

func (c SchemaConfig) compile() (*schema, error) {
	if c.Table == "" {
		c.Table = DefaultTable
	}
	parts := strings.Split(c.Table, ".")
	if len(parts) > 2 {
		return nil, &outbox.ConfigError{Field: "inbox.SchemaConfig.Table", Reason: fmt.Sprintf("%q: at most schema.table", c.Table)}
	}
	for _, p := range parts {
		// 63 bytes less the longest index suffix ("_processed_idx", 14 bytes).
		if p == "" || strings.ContainsRune(p, 0) || len(p) > 49 {
			return nil, &outbox.ConfigError{Field: "inbox.SchemaConfig.Table", Reason: fmt.Sprintf("%q: each part must be 1..49 bytes without NUL", c.Table)}
		}
	}
	d, ok := dialects[c.Dialect]
	if !ok {
		return nil, &outbox.ConfigError{Field: "inbox.SchemaConfig.Dialect", Reason: fmt.Sprintf("unknown dialect %d", c.Dialect)}
	}
	if len(parts) > 1 && !d.qualified() {
		return nil, &outbox.ConfigError{Field: "inbox.SchemaConfig.Table", Reason: fmt.Sprintf("%q: a %s table name cannot be schema-qualified", c.Table, d.title())}
	}
	s := &schema{cfg: c, table: pgx.Identifier(parts).Sanitize(), tableName: parts[len(parts)-1], d: d}
	h := fnv.New64a()
	h.Write([]byte("inbox:" + s.table))
	s.lockSeed = int64(h.Sum64())
	// ON CONFLICT DO NOTHING never aborts the transaction: a concurrent transaction holding
	// the same key makes this statement wait for it, then insert (it rolled back) or skip
	// (it committed).
	s.insertSQL = fmt.Sprintf(`INSERT INTO %s ("consumer", "message_id", "topic", "processed_at") VALUES ($1, $2, $3, %s) ON CONFLICT ("consumer", "message_id") DO NOTHING`, s.table, d.insertNow())
	return s, nil
}

// statements returns the idempotent DDL, one statement per element.
func (s *schema) statements() []string {
	idx := pgx.Identifier{s.tableName + "_processed_idx"}.Sanitize()
	// An index lives in its table's schema: CREATE INDEX takes the unqualified name.
	return s.d.statements(s.table, idx)
}

// SchemaSQL returns the inbox table's DDL for its dialect as one script of idempotent
// statements ending in ';', for users' own migration tools (golang-migrate, goose, atlas). It
// returns an *outbox.ConfigError for an invalid config.
//
// Columns: consumer (who processed the message: Config.Consumer), message_id (the dedup key,
// msg.UUID by default), topic (the topic the message was received from, when the Watermill
// router tells it; NULL otherwise), processed_at (when the processing transaction ran;
// TIMESTAMPTZ on PostgreSQL, INTEGER microseconds since the Unix epoch on SQLite). The primary
// key (consumer, message_id) is what makes a redelivered message change nothing; the index on
// processed_at serves Cleanup.
func SchemaSQL(cfg SchemaConfig) (string, error) {
	s, err := cfg.compile()
	if err != nil {
		return "", err
	}
	var b strings.Builder
	for _, st := range s.statements() {
		b.WriteString(st)
		b.WriteString(";\n")
	}
	return b.String(), nil
}

// Migrate creates the inbox table and its index. It is idempotent and safe to run from several
// processes at once (on PostgreSQL it serialises on a transaction-scoped advisory lock; on
// SQLite on the write lock). db is a *pgxpool.Pool, *pgx.Conn, pgx.Tx, *sql.DB or *sql.Tx (pgx
// stdlib driver for PostgreSQL; a SQLite driver such as modernc.org/sqlite for
// outbox.DialectSQLite). Errors: an *outbox.ConfigError for an invalid config or handle, else
// the database error wrapped with context.
func Migrate(ctx context.Context, db any, cfg SchemaConfig) error {
	s, ex, err := open(db, cfg)
	if err != nil {
		return err
	}
	if err := s.d.migrate(ctx, ex, s); err != nil {
		return fmt.Errorf("outbox inbox: migrate %s: %w", s.table, err)
	}
	return nil
}
