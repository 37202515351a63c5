package outbox

import (
	"context"
	"fmt"
	"github.com/watermill-outbox/outbox/internal/dialect"
	"hash/fnv"
	"regexp"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
)

// DefaultTable is the outbox table name used when SchemaConfig.Table is empty.
const DefaultTable = "watermill_outbox"

// PayloadType is the PostgreSQL type of the payload column.
type PayloadType int

const (
	// PayloadJSON (the zero value, default) stores payloads as JSON text (PostgreSQL type
	// json): exactly the bytes written (key order, whitespace, number spelling and duplicate
	// keys kept), still checked before any SQL (ValidatePayload, the same rules as
	// PayloadJSONB, so a JSON payload can always be converted to jsonb) and parsed once more
	// by PostgreSQL's json input. On SQLite it is a TEXT column checked with json_valid, on
	// MariaDB/MySQL a LONGTEXT column checked with JSON_VALID (both store the bytes as
	// written). A table created as JSONB (the default before JSON) keeps its column type:
	// Migrate never changes it, and the publisher's json value is converted to the column's
	// jsonb on insert (normalised as before); see README "Payloads".
	PayloadJSON PayloadType = iota
	// PayloadBytea stores payloads as BYTEA, verbatim (protobuf, Avro, anything): no JSON checks.
	PayloadBytea
	// PayloadJSONB stores payloads as JSONB: every payload must be a JSON value that
	// PostgreSQL accepts (checked before any SQL, see ValidatePayload), and PostgreSQL
	// normalises it (keys sorted and deduplicated, whitespace dropped, 1e3 becomes 1000), so
	// the bytes delivered are jsonb's rendering, not the bytes written. On SQLite and
	// MariaDB/MySQL it is the same column as PayloadJSON.
	PayloadJSONB
)

// isJSON reports whether payloads are JSON (PayloadJSONB or PayloadJSON).
func (t PayloadType) isJSON() bool { return t == PayloadJSONB || t == PayloadJSON }

// Column is a user-defined column of the outbox table (a tenant id, a subject id, a webhook
// result). Name is an unquoted identifier (letters, digits, underscore; it is quoted in SQL);
// Type is the PostgreSQL type as written in DDL, for example "UUID", "TEXT NULL" or
// "BIGINT NOT NULL DEFAULT 0". Type is trusted DDL text written by the programmer, never by end
// users.
type Column struct {
	Name string
	Type string
}

// SchemaConfig names the outbox table and its shape. The zero value is the default table
// "watermill_outbox" in the connection's search_path with a JSON payload and no extra columns.
// The same SchemaConfig must be given to Migrate, NewPublisher and NewSubscriber.
type SchemaConfig struct {
	// Table is the table name, optionally schema-qualified ("billing.outbox"). Each part is
	// quoted as an identifier, so any characters but '.' and NUL are safe. Default DefaultTable.
	// Every writer of one table must spell it the same way ("outbox" everywhere, or
	// "public.outbox" everywhere, capture triggers included): the per-ordering-key lock that
	// keeps a key's events in commit order is derived from the name as written, so two
	// spellings take different locks and their events of one key can commit out of order.
	Table string
	// PayloadType chooses JSON (default), JSONB or BYTEA for the payload column. It applies
	// to a table Migrate creates; an existing table keeps its column type.
	PayloadType PayloadType
	// ExtraColumns are user columns created by Migrate and filled on write through
	// SetExtraColumns / EventInput.ExtraColumns. Names must not collide with the outbox's own
	// columns. Type is DDL of the table's dialect.
	ExtraColumns []Column
	// Dialect is the database the table lives in: DialectPostgreSQL (default), DialectSQLite
	// or DialectMySQL. A handle of another dialect is a *ConfigError.
	Dialect Dialect
	// FillFactor is the table's fillfactor storage parameter (PostgreSQL docs, CREATE TABLE,
	// "Storage Parameters"): the percentage, 10..100, of each heap page that inserts fill.
	// Default DefaultFillFactor (50). The free half lets a claim's lease write (lease_until,
	// leased_by: no index covers them) be a heap-only tuple (HOT) update on the row's own
	// page, so it adds no index entries; with full pages every leased row added one entry to
	// each index that holds it (four for a pending keyed row, three for an unordered one).
	// Measured on a 2-core box (BenchmarkDrain, 100,000 events): unordered +20 %, 10 hot
	// keys +35 %. The costs: pending rows take about twice the pages (published rows' space
	// is reused after VACUUM), and the write path measured 0.93× of fillfactor 100
	// (BenchmarkWritePath, 8 writers, durable commits). The default applies to a table
	// Migrate creates; a value set here is also set on an existing table (when it differs),
	// whose pages already written keep their fill until rewritten. PostgreSQL only: a
	// non-zero FillFactor with another dialect is a *ConfigError.
	FillFactor int
	// IdempotencyScope names extra columns (declared in ExtraColumns, typically a tenant id)
	// that form the unique key together with the idempotency key: Migrate builds
	// UNIQUE (scope columns…, idempotency_key) WHERE idempotency_key IS NOT NULL, so two
	// tenants may use the same key, and a repeat returns the caller's own tenant's event. An
	// event with an idempotency key must then set every scope column to a non-NULL value
	// (*ValidationError before any SQL). Empty (default): keys are unique per table, and a key
	// held by an event whose extra columns differ from the writer's is an
	// *IdempotencyConflictError. Changing it on an existing table is an explicit migration
	// (IdempotencyScopeMigrationSQL); Migrate refuses a mismatch with
	// ErrIdempotencyScopeMismatch. A name not in ExtraColumns is a *ConfigError.
	IdempotencyScope []string
}

// DefaultFillFactor is SchemaConfig.FillFactor's default, in percent.
const DefaultFillFactor = 50

// Built-in column names. RelayOwnedColumns are written only by the relay and the database.
var (
	builtinColumns = []string{"sequence", "id", "topic", "payload", "headers", "ordering_key",
		"idempotency_key", "created_at", "attempts", "last_error", "next_attempt_at",
		"lease_until", "leased_by", "published_at", "dead_lettered_at", "delivery_starts", "last_error_class"}
	// RelayOwnedColumns lists the columns that no writer may fill through extra columns:
	// the database and the relay own them.
	RelayOwnedColumns = []string{"sequence", "created_at", "next_attempt_at", "published_at",
		"dead_lettered_at", "attempts", "last_error", "lease_until", "leased_by", "delivery_starts", "last_error_class"}
)

var columnNameRe = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)

// schema is a validated SchemaConfig with its SQL pieces.
type schema struct {
	cfg   SchemaConfig
	table string // quoted, possibly qualified (the dialect's Quote of t)
	extra map[string]bool
	d     dialect.Dialect // the dialect's SQL
	caps  dialect.Capabilities
	t     *dialect.Table // the table as the dialect sees it
}

// Validate checks the configuration and returns a *ConfigError naming the field, or nil.
func (c SchemaConfig) Validate() error {
	_, err := c.compile()
	return err
}

func (c SchemaConfig) compile() (*schema, error) {
	d, err := c.Dialect.lookup()
	if err != nil {
		return nil, err
	}
	return c.compileWith(d)
}

// compileWith is compile over the dialect d instead of c.Dialect's (the relay simulation's
// in-memory table).
func (c SchemaConfig) compileWith(d dialect.Dialect) (*schema, error) {
	if c.Table == "" {
		c.Table = DefaultTable
	}
	parts := strings.Split(c.Table, ".")
	if len(parts) > 2 {
		return nil, &ConfigError{Field: "SchemaConfig.Table", Reason: fmt.Sprintf("%q: at most schema.table", c.Table)}
	}
	for _, p := range parts {
		if p == "" || strings.ContainsRune(p, 0) || len(p) > 63 {
			return nil, &ConfigError{Field: "SchemaConfig.Table", Reason: fmt.Sprintf("%q: each part must be 1..63 bytes without NUL", c.Table)}
		}
	}
	caps := d.Capabilities()
	if !caps.SchemaQualified && len(parts) > 1 {
		return nil, &ConfigError{Field: "SchemaConfig.Table", Reason: fmt.Sprintf("%q: a %s table name cannot be schema-qualified", c.Table, caps.Title)}
	}
	fillDefault := false
	switch {
	case !caps.FillFactor:
		if c.FillFactor != 0 {
			return nil, &ConfigError{Field: "SchemaConfig.FillFactor", Reason: "a fillfactor is a PostgreSQL storage parameter; " + caps.Title + " has none"}
		}
	case c.FillFactor == 0:
		c.FillFactor, fillDefault = DefaultFillFactor, true
	case c.FillFactor < 10 || c.FillFactor > 100:
		return nil, &ConfigError{Field: "SchemaConfig.FillFactor", Reason: fmt.Sprintf("%d: want a percentage in 10..100", c.FillFactor)}
	}
	if c.PayloadType != PayloadJSON && c.PayloadType != PayloadBytea && c.PayloadType != PayloadJSONB {
		return nil, &ConfigError{Field: "SchemaConfig.PayloadType", Reason: fmt.Sprintf("unknown payload type %d", c.PayloadType)}
	}
	s := &schema{cfg: c, extra: map[string]bool{}, d: d, caps: caps}
	for i, col := range c.ExtraColumns {
		field := fmt.Sprintf("SchemaConfig.ExtraColumns[%d]", i)
		if !columnNameRe.MatchString(col.Name) {
			return nil, &ConfigError{Field: field, Reason: fmt.Sprintf("column name %q: want [A-Za-z_][A-Za-z0-9_]*, at most 63 bytes", col.Name)}
		}
		if isBuiltinColumn(col.Name) {
			return nil, &ConfigError{Field: field, Reason: fmt.Sprintf("column %q is an outbox column", col.Name)}
		}
		if s.extra[col.Name] {
			return nil, &ConfigError{Field: field, Reason: fmt.Sprintf("column %q declared twice", col.Name)}
		}
		if strings.TrimSpace(col.Type) == "" || strings.ContainsAny(col.Type, ";\x00") {
			return nil, &ConfigError{Field: field, Reason: fmt.Sprintf("column %q: type must be non-empty DDL without ';'", col.Name)}
		}
		s.extra[col.Name] = true
	}
	if err := s.compileScope(); err != nil {
		return nil, err
	}
	extra := make([]dialect.Column, len(c.ExtraColumns))
	for i, col := range c.ExtraColumns {
		extra[i] = dialect.Column{Name: col.Name, Type: col.Type}
	}
	// The lock seed hashes the PostgreSQL spelling of the name in every dialect, as it always
	// has: writers of different versions must take the same per-key locks.
	h := fnv.New64a()
	h.Write([]byte(pgx.Identifier(parts).Sanitize()))
	s.t = &dialect.Table{Parts: parts, IndexBase: indexBase(parts[len(parts)-1]), Payload: dialect.Payload(c.PayloadType), Extra: extra,
		Scope: c.IdempotencyScope, FillFactor: c.FillFactor, FillDefault: fillDefault, LockSeed: int64(h.Sum64())}
	s.table = s.d.Quote(s.t)
	return s, nil
}

// indexBase derives the prefix of the table's index names: the table name when it is short
// enough for every suffix to fit PostgreSQL's 63-byte identifiers, else its first 30 bytes (cut
// on a character boundary) plus a hash of the whole name, so long names that share a prefix
// never share index names.
func indexBase(table string) string {
	const maxBase = 40 // longest suffix is "_idempotency_key_idx" (20 bytes)
	if len(table) <= maxBase {
		return table
	}
	cut := 30
	for cut > 0 && !utf8.RuneStart(table[cut]) {
		cut--
	}
	h := fnv.New32a()
	h.Write([]byte(table))
	return fmt.Sprintf("%s_%08x", table[:cut], h.Sum32())
}

func isBuiltinColumn(name string) bool {
	for _, c := range builtinColumns {
		if strings.EqualFold(c, name) {
			return true
		}
	}
	return false
}

func isRelayOwned(name string) bool {
	for _, c := range RelayOwnedColumns {
		if strings.EqualFold(c, name) {
			return true
		}
	}
	return false
}

// SchemaSQL returns the outbox table's DDL for its dialect (PostgreSQL by default) as one script of statements ending in
// ';', for users' own migration tools (golang-migrate, goose, atlas). Every statement is
// idempotent (IF NOT EXISTS; for SQLite, extra columns are part of CREATE TABLE, and Migrate
// adds those missing from an existing table). It returns a *ConfigError for an invalid config.
//
// Columns: sequence (identity, delivery order), id (UUID, unique event id), topic,
// payload (JSON by default, JSONB or BYTEA), headers (JSON object of string values; JSONB in
// tables created before JSON became the default), ordering_key (NULL =
// unordered), idempotency_key (unique, per table or per SchemaConfig.IdempotencyScope), created_at, attempts, last_error, next_attempt_at,
// lease_until, leased_by, published_at, dead_lettered_at, delivery_starts (deliveries started
// since the event's last recorded outcome, see SubscriberConfig.MaxDeliveryStarts),
// last_error_class (the failure class of last_error: "unavailable", "not_attempted",
// "failure" or "permanent"; NULL before the first failed delivery; Backlog.Unavailable reads
// it). Pending means published_at IS NULL AND dead_lettered_at IS NULL. On PostgreSQL the
// script also adds delivery_starts and last_error_class to a table created before them.
func SchemaSQL(cfg SchemaConfig) (string, error) {
	s, err := cfg.compile()
	if err != nil {
		return "", err
	}
	var b strings.Builder
	for _, st := range s.d.Statements(s.t) {
		b.WriteString(st)
		b.WriteString(";\n")
	}
	return b.String(), nil
}

// Migrate creates or upgrades the outbox table and its indexes. It is idempotent and safe to run
// from several processes at once (it serialises on a transaction-scoped advisory lock; on
// SQLite on the write lock; on MariaDB/MySQL on GET_LOCK). db is a *pgxpool.Pool, *pgx.Conn,
// *sql.DB (pgx stdlib driver) or a transaction of either (then the DDL commits with that
// transaction); for DialectSQLite a *sql.DB or *sql.Tx; for DialectMySQL a *sql.DB or
// *sql.Conn (MySQL commits DDL implicitly, so a transaction is refused). Errors: a *ConfigError for an invalid config or handle, else
// the database error wrapped with context.
func Migrate(ctx context.Context, db any, cfg SchemaConfig) error {
	s, ex, err := open(db, cfg)
	if err != nil {
		return err
	}
	if err := s.d.Migrate(ctx, ex, s.t); err != nil {
		return fmt.Errorf("outbox: migrate %s: %w", s.table, migrateError(err))
	}
	return nil
}

// open validates cfg and adapts db to it for the table-level functions (Migrate, CheckTable).
func open(db any, cfg SchemaConfig) (*schema, execer, error) {
	s, err := cfg.compile()
	if err != nil {
		return nil, nil, err
	}
	if err := checkHandle(db, cfg.Dialect); err != nil {
		return nil, nil, err
	}
	ex, err := newExecer(db)
	if err != nil {
		return nil, nil, err
	}
	return s, ex, nil
}
