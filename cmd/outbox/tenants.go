package main

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/watermill-outbox/outbox"
)

// This file lets `outbox relay --table` name several outbox tables (a schema per tenant): a
// comma-separated list whose elements may be glob patterns ('*' any run of characters, '?'
// one), resolved against the catalog once, at start. One MultiSubscriber then relays them all.

// tableList splits a --table value into its elements; multi is true when the relay serves
// several tables (more than one element, or a pattern).
func tableList(value string) (elems []string, multi bool) {
	for _, e := range strings.Split(value, ",") {
		if e = strings.TrimSpace(e); e != "" {
			elems = append(elems, e)
		}
	}
	return elems, len(elems) > 1 || strings.ContainsAny(value, "*?")
}

// openTables opens --db for a relay over the tables of a --table list: each literal table must
// exist, each pattern must match at least one outbox table (a table with the relay's columns).
// It returns the sorted, distinct table names.
func (f *dbFlags) openTables(ctx context.Context, elems []string) (*database, []string, error) {
	u, err := parseDBURL(f.db)
	if err != nil {
		return nil, nil, err
	}
	d, err := openDB(ctx, u, outbox.DefaultTable, openOptions{})
	if err != nil {
		return nil, nil, err
	}
	var tables []string
	for _, e := range elems {
		if !strings.ContainsAny(e, "*?") {
			one := *d
			one.schema.Table = e
			if err := one.schema.Validate(); err != nil {
				d.Close()
				return nil, nil, badFlag("table", fmt.Sprintf(" %q: %v", e, err))
			}
			if err := one.requireTable(ctx); err != nil {
				d.Close()
				return nil, nil, err
			}
			tables = append(tables, e)
			continue
		}
		found, err := d.matchTables(ctx, e)
		if err != nil {
			d.Close()
			return nil, nil, d.queryError("listing the outbox tables", err)
		}
		if len(found) == 0 {
			d.Close()
			return nil, nil, fmt.Errorf("--table pattern %q matches no outbox table in %s (tables are listed once, at start): create them with `outbox migrate --table NAME`", e, d.where())
		}
		tables = append(tables, found...)
	}
	slices.Sort(tables)
	return d, slices.Compact(tables), nil
}

// matchTables returns the outbox tables (those with a leased_by column) whose name matches
// the glob pattern: "schema.table" on PostgreSQL when the pattern holds a '.', else the table
// name among the tables of the search path; on MariaDB/MySQL likewise "db.table" among the
// server's databases, else the table name among the current database's tables; the table
// name on SQLite.
func (d *database) matchTables(ctx context.Context, pattern string) ([]string, error) {
	if d.url.kind == kindMySQL {
		return d.matchMySQLTables(ctx, pattern)
	}
	var q string
	arg := pattern
	if d.url.kind == kindSQLite {
		q = `SELECT m."name" FROM sqlite_master m WHERE m."type" = 'table' AND m."name" GLOB $1
			AND EXISTS (SELECT 1 FROM pragma_table_info(m."name") p WHERE p."name" = 'leased_by') ORDER BY 1`
	} else {
		like := strings.NewReplacer(`\`, `\\`, `%`, `\%`, `_`, `\_`, `*`, `%`, `?`, `_`).Replace(pattern)
		arg = like
		name, where := `c.relname`, `pg_table_is_visible(c.oid)`
		if strings.Contains(pattern, ".") {
			name, where = `n.nspname || '.' || c.relname`, `true`
		}
		q = fmt.Sprintf(`SELECT %[1]s FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
			WHERE c.relkind IN ('r', 'p') AND %[2]s AND %[1]s LIKE $1
			AND EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attname = 'leased_by' AND NOT a.attisdropped) ORDER BY 1`, name, where)
	}
	return d.queryRows(ctx, q, arg)
}

// matchMySQLTables is matchTables on MariaDB/MySQL. It lists the outbox tables from
// information_schema and matches them here: information_schema compares names without regard
// to case, and LIKE's escape character depends on sql_mode (NO_BACKSLASH_ESCAPES), while table
// names on the server are case-sensitive (lower_case_table_names=0, the Linux default).
func (d *database) matchMySQLTables(ctx context.Context, pattern string) ([]string, error) {
	q := `SELECT t.TABLE_NAME FROM information_schema.TABLES t WHERE t.TABLE_SCHEMA = DATABASE()`
	if strings.Contains(pattern, ".") {
		q = `SELECT CONCAT(t.TABLE_SCHEMA, '.', t.TABLE_NAME) FROM information_schema.TABLES t
			WHERE t.TABLE_SCHEMA NOT IN ('mysql', 'information_schema', 'performance_schema', 'sys')`
	}
	q += ` AND t.TABLE_TYPE = 'BASE TABLE' AND EXISTS (SELECT 1 FROM information_schema.COLUMNS c
		WHERE c.TABLE_SCHEMA = t.TABLE_SCHEMA AND c.TABLE_NAME = t.TABLE_NAME AND c.COLUMN_NAME = 'leased_by')`
	names, err := d.queryRows(ctx, q)
	if err != nil {
		return nil, err
	}
	glob := regexp.MustCompile("^" + strings.NewReplacer(`\*`, ".*", `\?`, ".").Replace(regexp.QuoteMeta(pattern)) + "$")
	var out []string
	for _, n := range names {
		if glob.MatchString(n) {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out, nil
}

// queryRows runs q and returns its single text column.
func (d *database) queryRows(ctx context.Context, q string, args ...any) ([]string, error) {
	if d.pool != nil {
		rs, err := d.pool.Query(ctx, q, args...)
		if err != nil {
			return nil, err
		}
		defer rs.Close()
		return scanStrings(rs)
	}
	rs, err := d.sqlDB.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rs.Close()
	return scanStrings(rs)
}

// scanStrings reads the single text column of pgx or database/sql rows.
func scanStrings(rs interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
}) ([]string, error) {
	var out []string
	for rs.Next() {
		var s string
		if err := rs.Scan(&s); err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, rs.Err()
}
