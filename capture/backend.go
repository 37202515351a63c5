package capture

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/watermill-outbox/outbox"
)

// backend is the capture SQL of one database: the catalog reads, the generated triggers and
// what Install, SQL, Uninstall, Verify and the extensions do there. Implementations are
// stateless (postgres.go, sqlite.go).
type backend interface {
	// title names the database in messages.
	title() string
	// lock is the statement Install runs before it reads the catalog, "" for none.
	lock(tg *target) string
	// outboxExists reports whether the outbox table exists.
	outboxExists(ctx context.Context, c conn, tg *target) (bool, error)
	// catalog reads the declared table's columns, nil when it does not exist.
	catalog(ctx context.Context, c conn, name string, tg *target) (*catalog, error)
	// statements returns the DDL that installs r's triggers.
	statements(r *resolved, tg *target) []string
	// installed runs after Install's DDL, in its transaction.
	installed(ctx context.Context, c conn, p *plan) error
	// script returns the first lines of SQL's script and the statements it adds after p's.
	script(p *plan) (begin string, more []string)
	// uninstall returns the statements that drop the triggers of tables.
	uninstall(ctx context.Context, c conn, tg *target, tables []Table) ([]string, error)
	// verify checks the triggers of tables (every captured table when none is named).
	verify(ctx context.Context, c conn, tg *target, tables []Table) error
	// txSettings reports whether the database has transaction-local settings (SetExtension).
	txSettings() bool
	// withExtension runs fn with ext (encoded b) attached to the events written in tx.
	withExtension(ctx context.Context, tx any, tg *target, ext Extension, b []byte, fn func() error) error
}

// backends are the databases the package generates triggers for.
var backends = map[outbox.Dialect]backend{
	outbox.DialectPostgreSQL: pgBackend{},
	outbox.DialectSQLite:     sqliteBackend{},
}

// Supports reports whether the package generates capture triggers for dialect d (PostgreSQL
// and SQLite).
func Supports(d outbox.Dialect) bool {
	_, ok := backends[d]
	return ok
}

// backendOf returns the backend of schema's dialect, or a *outbox.ConfigError.
func backendOf(schema outbox.SchemaConfig) (backend, error) {
	be, ok := backends[schema.Dialect]
	if !ok {
		return nil, &outbox.ConfigError{Field: "SchemaConfig.Dialect", Reason: fmt.Sprintf("package capture has no %s trigger generator (PostgreSQL and SQLite only)", schema.Dialect), Err: outbox.ErrUnsupportedDB}
	}
	return be, nil
}

// pgBackend is PostgreSQL (postgres.go, partition.go).
type pgBackend struct{}

func (pgBackend) title() string { return "PostgreSQL" }

func (pgBackend) lock(tg *target) string {
	return fmt.Sprintf("SELECT pg_advisory_xact_lock(%d), set_config(%s, 'on', true)", tg.seed, quoteLiteral(pgSyncSetting))
}

func (pgBackend) outboxExists(ctx context.Context, c conn, tg *target) (bool, error) {
	return pgOutboxExists(ctx, c, tg)
}

func (pgBackend) catalog(ctx context.Context, c conn, name string, tg *target) (*catalog, error) {
	return pgCatalog(ctx, c, name, tg)
}

func (pgBackend) statements(r *resolved, tg *target) []string { return r.pgStatements(tg) }

// installed gives the database PartitionsEventTrigger when a declared table is partitioned,
// lets the event trigger act again, and verifies the declared tables.
func (pgBackend) installed(ctx context.Context, c conn, p *plan) error {
	var names []string
	ensured := false
	for _, r := range p.tables {
		names = append(names, r.display)
		if r.cat.partitioned && !ensured {
			if err := pgEnsureEventTrigger(ctx, c, p.tg, r.field("Name"), r.display); err != nil {
				return err
			}
			ensured = true
		}
	}
	if err := c.exec(ctx, fmt.Sprintf("SELECT set_config(%s, '', true)", quoteLiteral(pgSyncSetting))); err != nil {
		return fmt.Errorf("capture: install: %w", err)
	}
	return pgVerify(ctx, c, p.tg, names, true)
}

func (pgBackend) script(p *plan) (string, []string) {
	var more []string
	if slices.ContainsFunc(p.tables, func(r *resolved) bool { return r.cat.partitioned }) {
		more = pgEventTriggerStatements(p.tg)
	}
	return fmt.Sprintf("BEGIN;\nSELECT pg_advisory_xact_lock(%d);\n", p.tg.seed), more
}

// uninstall drops each table's triggers and function, and the triggers calling the function
// elsewhere (its partitions), under Migrate's lock.
func (pgBackend) uninstall(ctx context.Context, c conn, tg *target, tables []Table) ([]string, error) {
	stmts := []string{fmt.Sprintf("SELECT pg_advisory_xact_lock(%d)", tg.seed)}
	for _, t := range tables {
		got, err := queryStrings(ctx, c, `SELECT n.nspname::text || '.' || c.relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass($1)`, quoteParts(t.Name))
		if err != nil {
			return nil, fmt.Errorf("capture: uninstall %s: %w", t.Name, err)
		}
		if len(got) == 1 {
			schemaName, table, _ := strings.Cut(got[0], ".")
			// The triggers calling the table's function elsewhere: its partitions.
			others, err := queryStrings(ctx, c, `SELECT format('DROP TRIGGER %I ON %s', t.tgname, t.tgrelid::regclass) FROM pg_trigger t
WHERE t.tgfoid = to_regprocedure($1) AND t.tgrelid <> to_regclass($2) ORDER BY t.tgrelid, t.tgname`, pgFunction(schemaName, table)+"()", quoteParts(t.Name))
			if err != nil {
				return nil, fmt.Errorf("capture: uninstall %s: %w", t.Name, err)
			}
			stmts = append(append(stmts, others...), pgUninstall(schemaName, table)...)
		}
	}
	return stmts, nil
}

func (pgBackend) verify(ctx context.Context, c conn, tg *target, tables []Table) error {
	exists, err := pgOutboxExists(ctx, c, tg)
	if err != nil {
		return fmt.Errorf("capture: read catalog: %w", err)
	}
	if !exists {
		return &outbox.ConfigError{Field: "SchemaConfig.Table", Reason: fmt.Sprintf("outbox table %s does not exist: run outbox.Migrate first", tg.table), Err: ErrOutboxTable}
	}
	var names []string
	for i, t := range tables {
		got, err := queryStrings(ctx, c, `SELECT n.nspname::text || '.' || c.relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass($1)`, quoteParts(t.Name))
		if err != nil {
			return fmt.Errorf("capture: verify %s: %w", t.Name, err)
		}
		if len(got) != 1 {
			return &outbox.ConfigError{Field: fmt.Sprintf("Table[%d].Name", i), Reason: fmt.Sprintf("no table %q", t.Name), Err: ErrUnknownTable}
		}
		names = append(names, got[0])
	}
	return pgVerify(ctx, c, tg, names, len(tables) > 0)
}

func (pgBackend) txSettings() bool { return true }

// withExtension sets the transaction-local setting the triggers read for fn's duration.
func (pgBackend) withExtension(ctx context.Context, tx any, _ *target, _ Extension, b []byte, fn func() error) error {
	if err := setExtension(ctx, tx, string(b)); err != nil {
		return err
	}
	fnErr := fn()
	if err := setExtension(context.WithoutCancel(ctx), tx, ""); err != nil && fnErr == nil {
		return err
	}
	return fnErr
}
