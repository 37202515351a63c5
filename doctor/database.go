package doctor

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/watermill-outbox/outbox"
)

// Database runs the checks that apply to cfg.Schema's dialect over db, in a fixed order, and
// returns them all (checks that do not apply are Skipped with the reason). db is a
// *pgxpool.Pool for PostgreSQL (the pool's connection settings are also used for the pooler
// and LISTEN/NOTIFY probes), a *sql.DB for SQLite and MariaDB/MySQL. A check that cannot run
// (a catalog view the role may not read) is a Fail naming the error; the other checks still
// run. Errors: a *outbox.ConfigError for an invalid cfg or a handle of the wrong kind. Safe to
// call concurrently; on PostgreSQL each call also opens up to four short-lived connections of
// its own (two at a time: the pooler and LISTEN/NOTIFY probes) and closes them before it returns.
func Database(ctx context.Context, db any, cfg Config) ([]Check, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	switch cfg.Schema.Dialect {
	case outbox.DialectPostgreSQL:
		pool, isPool := db.(*pgxpool.Pool)
		if !isPool {
			return nil, &outbox.ConfigError{Field: "db", Reason: fmt.Sprintf("PostgreSQL checks need a *pgxpool.Pool, not %T", db)}
		}
		return postgresChecks(ctx, pool, cfg), nil
	case outbox.DialectSQLite, outbox.DialectMySQL:
		sdb, isDB := db.(*sql.DB)
		if !isDB {
			return nil, &outbox.ConfigError{Field: "db", Reason: fmt.Sprintf("%s checks need a *sql.DB, not %T", cfg.Schema.Dialect, db)}
		}
		if cfg.Schema.Dialect == outbox.DialectSQLite {
			return sqliteChecks(ctx, sdb, cfg), nil
		}
		return mysqlChecks(ctx, sdb, cfg), nil
	}
	return nil, &outbox.ConfigError{Field: "doctor.Config.Schema.Dialect", Reason: cfg.Schema.Dialect.String() + " is not supported"}
}

// indexNameRe finds the index names in the DDL that SchemaSQL returns (PostgreSQL, SQLite:
// CREATE [UNIQUE] INDEX IF NOT EXISTS "name"; MariaDB/MySQL: [UNIQUE] INDEX `name` inside
// CREATE TABLE).
var indexNameRe = regexp.MustCompile("INDEX\\s+(?:CONCURRENTLY\\s+)?(?:IF NOT EXISTS\\s+)?[\"`]([^\"`]+)[\"`]")

// wantIndexes returns the names of the indexes Migrate creates for schema, read from its DDL.
func wantIndexes(schema outbox.SchemaConfig) ([]string, error) {
	ddl, err := outbox.SchemaSQL(schema)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, m := range indexNameRe.FindAllStringSubmatch(ddl, -1) {
		names = append(names, m[1])
	}
	return names, nil
}

// tableName is the table's name as configured (the default when empty).
func tableName(schema outbox.SchemaConfig) string {
	if schema.Table == "" {
		return outbox.DefaultTable
	}
	return schema.Table
}

// indexLister returns the indexes of the table: name → valid (PostgreSQL: indisvalid; always
// true elsewhere).
type indexLister func(ctx context.Context) (map[string]bool, error)

// schemaCheck checks that the table exists with every column (outbox.CheckTable) and every index
// Migrate creates (read from SchemaSQL's DDL, so this check never disagrees with Migrate). It
// returns whether the table exists, for the checks that read it.
func schemaCheck(ctx context.Context, db any, cfg Config, list indexLister) (Check, bool) {
	const name = "schema"
	table := tableName(cfg.Schema)
	err := outbox.CheckTable(ctx, db, cfg.Schema)
	var nf *outbox.TableNotFoundError
	switch {
	case errors.As(err, &nf):
		return failed(name, fmt.Sprintf("outbox table %q does not exist", table), "create it with "+cfg.MigrateHint+"."), false
	case errors.Is(err, outbox.ErrTableOutdated):
		return failed(name, strings.TrimPrefix(oneLine(err.Error()), "outbox: "), "upgrade it with "+cfg.MigrateHint+"."), true
	case err != nil:
		return errCheck(name, "checking the table", err), false
	}
	want, err := wantIndexes(cfg.Schema)
	if err != nil {
		return errCheck(name, "reading the schema's DDL", err), true
	}
	have, err := list(ctx)
	if err != nil {
		return errCheck(name, "listing the table's indexes", err), true
	}
	var missing, invalid []string
	for _, ix := range want {
		valid, found := have[ix]
		switch {
		case !found:
			missing = append(missing, ix)
		case !valid:
			invalid = append(invalid, ix)
		}
	}
	sort.Strings(missing)
	sort.Strings(invalid)
	switch {
	case len(missing) > 0:
		return failed(name, fmt.Sprintf("outbox table %q lacks the index(es) %s that the relay's statements rely on (without them claims scan the whole table)", table, strings.Join(missing, ", ")),
			"create them with "+cfg.MigrateHint+" (idempotent; on a big table, run the CREATE INDEX CONCURRENTLY form of the statements of outbox.SchemaSQL first)."), true
	case len(invalid) > 0:
		return failed(name, fmt.Sprintf("outbox table %q has invalid index(es) %s (a CREATE INDEX CONCURRENTLY that failed): PostgreSQL maintains them but never reads them", table, strings.Join(invalid, ", ")),
			"drop them with DROP INDEX CONCURRENTLY, then run "+cfg.MigrateHint+" again."), true
	}
	return ok(name, fmt.Sprintf("outbox table %q has every column and all %d indexes that Migrate creates", table, len(want))), true
}

// pgIndexes lists the indexes of the PostgreSQL table and whether each is valid.
func pgIndexes(pool *pgxpool.Pool, schema outbox.SchemaConfig) indexLister {
	return func(ctx context.Context) (map[string]bool, error) {
		rows, err := pool.Query(ctx, `SELECT c.relname::text, i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid WHERE i.indrelid = to_regclass($1)`,
			pgx.Identifier(strings.Split(tableName(schema), ".")).Sanitize())
		if err != nil {
			return nil, err
		}
		out := map[string]bool{}
		var (
			n     string
			valid bool
		)
		_, err = pgx.ForEachRow(rows, []any{&n, &valid}, func() error {
			out[n] = valid
			return nil
		})
		return out, err
	}
}

// sqlIndexes lists the indexes of a SQLite or MariaDB/MySQL table through query (one column:
// the index name; args are its arguments).
func sqlIndexes(db *sql.DB, query string, args ...any) indexLister {
	return func(ctx context.Context) (map[string]bool, error) {
		rows, err := db.QueryContext(ctx, query, args...)
		if err != nil {
			return nil, err
		}
		defer rows.Close()
		out := map[string]bool{}
		for rows.Next() {
			var n string
			if err := rows.Scan(&n); err != nil {
				return nil, err
			}
			out[n] = true
		}
		return out, rows.Err()
	}
}
