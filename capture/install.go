package capture

import (
	"context"
	"fmt"
	"strings"

	"github.com/watermill-outbox/outbox"
)

// Install creates or regenerates the capture triggers of tables, writing into the outbox
// table of schema (which must exist: run outbox.Migrate first). It is idempotent, runs in one
// transaction (the caller's when db is a pgx.Tx or *sql.Tx) and, on PostgreSQL, serialises
// with Migrate and other Installs on the same transaction-scoped advisory lock Migrate takes
// (on SQLite on the write lock). Every declaration is checked against the catalog before any
// DDL runs, so a refused declaration installs nothing.
//
// db is a *pgxpool.Pool, *pgx.Conn or pgx.Tx, or for either dialect a *sql.DB, *sql.Conn or
// *sql.Tx. Errors: a *outbox.ConfigError for an invalid schema, handle or declaration (see
// the sentinels in errors.go and *UnsupportedTypeError), else the database error wrapped with
// context.
//
// The triggers carry the columns the table has when Install runs: re-run Install after ALTER
// TABLE, or an added column is not carried (and a dropped or retyped one makes the trigger,
// hence the write, fail loudly).
//
// PostgreSQL: a partitioned table gets its triggers on every partition too (sub-partitions
// included), and the database gets PartitionsEventTrigger, which gives partitions created or
// attached later their triggers; creating it needs a superuser once per database (without it,
// a *outbox.ConfigError of ErrEventTrigger). A partition cannot be declared itself
// (ErrPartition). The triggers are enabled ALWAYS unless Table.SkipReplicaSessions. Install
// ends by running Verify on the declared tables, so its error can also be a *VerifyError.
func Install(ctx context.Context, db any, schema outbox.SchemaConfig, tables ...Table) error {
	return inTx(ctx, db, func(c conn) error {
		p, err := generate(ctx, c, schema, tables, true)
		if err != nil {
			return err
		}
		for _, st := range p.stmts {
			if err := c.exec(ctx, st); err != nil {
				return fmt.Errorf("capture: install: %w", err)
			}
		}
		return p.tg.be.installed(ctx, c, p)
	})
}

// SQL returns the DDL Install would run, as one script for a migration tool or psql: on
// PostgreSQL wrapped in BEGIN … COMMIT with Migrate's advisory lock, on SQLite in BEGIN
// IMMEDIATE … COMMIT. It reads the catalog through db (the generated code depends on the
// column types) and changes nothing. Errors as Install. For a partitioned table the script
// also creates PartitionsEventTrigger when the database has none, which needs a superuser.
func SQL(ctx context.Context, db any, schema outbox.SchemaConfig, tables ...Table) (string, error) {
	var script string
	err := inTx(ctx, db, func(c conn) error {
		p, err := generate(ctx, c, schema, tables, false)
		if err != nil {
			return err
		}
		begin, more := p.tg.be.script(p)
		stmts := append(p.stmts, more...)
		var b strings.Builder
		b.WriteString(begin)
		for _, st := range stmts {
			b.WriteString(st)
			b.WriteString(";\n")
		}
		b.WriteString("COMMIT;\n")
		script = b.String()
		return nil
	})
	return script, err
}

// Uninstall drops the capture triggers (and PostgreSQL trigger functions) of the named tables,
// and of their partitions; only Table.Name is read. A table without triggers, or that no
// longer exists, is skipped. One transaction, locked as Install. PartitionsEventTrigger stays:
// it does nothing for tables that are not captured.
func Uninstall(ctx context.Context, db any, schema outbox.SchemaConfig, tables ...Table) error {
	tg, err := newTarget(schema)
	if err != nil {
		return err
	}
	return inTx(ctx, db, func(c conn) error {
		stmts, err := tg.be.uninstall(ctx, c, tg, tables)
		if err != nil {
			return err
		}
		for _, st := range stmts {
			if err := c.exec(ctx, st); err != nil {
				return fmt.Errorf("capture: uninstall: %w", err)
			}
		}
		return nil
	})
}

func quoteParts(name string) string {
	parts := strings.Split(name, ".")
	for i, p := range parts {
		parts[i] = quoteIdent(p)
	}
	return strings.Join(parts, ".")
}

// plan is what generate returns: the DDL, the resolved declarations and the outbox table.
type plan struct {
	stmts  []string
	tables []*resolved
	tg     *target
}

// generate checks every declaration and returns the DDL; withLock (Install) takes the advisory
// lock (PostgreSQL) before the catalog is read, and keeps the event trigger from acting on
// Install's own DDL.
func generate(ctx context.Context, c conn, schema outbox.SchemaConfig, tables []Table, withLock bool) (*plan, error) {
	tg, err := newTarget(schema)
	if err != nil {
		return nil, err
	}
	checkedTables := make([]*checked, len(tables))
	for i, t := range tables {
		if checkedTables[i], err = check(i, t); err != nil {
			return nil, err
		}
	}
	p := &plan{tg: tg}
	if lock := tg.be.lock(tg); lock != "" && withLock {
		if err := c.exec(ctx, lock); err != nil {
			return nil, fmt.Errorf("capture: lock: %w", err)
		}
	}
	exists, err := tg.be.outboxExists(ctx, c, tg)
	if err != nil {
		return nil, fmt.Errorf("capture: read catalog: %w", err)
	}
	if !exists {
		return nil, &outbox.ConfigError{Field: "SchemaConfig.Table", Reason: fmt.Sprintf("outbox table %s does not exist: run outbox.Migrate first", tg.table), Err: ErrOutboxTable}
	}
	seen := map[string]int{}
	for i, ch := range checkedTables {
		cat, err := tg.be.catalog(ctx, c, ch.Name, tg)
		if err != nil {
			return nil, err
		}
		if cat == nil {
			return nil, &outbox.ConfigError{Field: ch.field("Name"), Reason: fmt.Sprintf("no table %q", ch.Name), Err: ErrUnknownTable}
		}
		r, err := resolve(ch, cat, tg)
		if err != nil {
			return nil, err
		}
		if j, dup := seen[r.display]; dup {
			return nil, &outbox.ConfigError{Field: ch.field("Name"), Reason: fmt.Sprintf("%s is declared twice (Table[%d])", r.display, j), Err: ErrInvalid}
		}
		seen[r.display] = i
		p.tables = append(p.tables, r)
		p.stmts = append(p.stmts, tg.be.statements(r, tg)...)
	}
	return p, nil
}
