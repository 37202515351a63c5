package main

// The command's own SQL (the demo's and the bench's tables), where databases write it
// differently: quoting, placeholders, and the outbox table's companions.

import (
	"context"
	"strconv"
	"strings"
)

// ident quotes a possibly qualified table name ("schema.table"; "db.table" on MariaDB/MySQL)
// as an identifier of d's database: double quotes, backticks on MariaDB/MySQL.
func (d *database) ident(name string) string {
	q, esc := `"`, `""`
	if d.url.kind == kindMySQL {
		q, esc = "`", "``"
	}
	parts := strings.Split(name, ".")
	for i, p := range parts {
		parts[i] = q + strings.ReplaceAll(p, q, esc) + q
	}
	return strings.Join(parts, ".")
}

// params returns n placeholders for a VALUES list: "$1, $2, …", or "?, ?, …" on MariaDB/MySQL
// (go-sql-driver/mysql knows no numbered placeholders).
func (d *database) params(n int) string {
	ps := make([]string, n)
	for i := range ps {
		ps[i] = "?"
		if d.url.kind != kindMySQL {
			ps[i] = "$" + strconv.Itoa(i+1)
		}
	}
	return strings.Join(ps, ", ")
}

// keyType is the column type of a short text primary key: MariaDB/MySQL cannot index TEXT
// without a prefix length, so there VARCHAR(64) (the demo's and the bench's keys are shorter).
func (d *database) keyType() string {
	if d.url.kind == kindMySQL {
		return "VARCHAR(64)"
	}
	return "TEXT"
}

// outboxTables returns the tables an outbox table named table consists of: itself, and on
// MariaDB/MySQL its key-lock table "<table>_keys" (outbox.DialectMySQL). The companion's name
// is the table's own plus "_keys" for names of at most 40 bytes, as the demo's and the bench's
// are; a longer name's companion is named after a hash and is not returned.
func (d *database) outboxTables(table string) []string {
	if d.url.kind == kindMySQL && len(table) <= 40 {
		return []string{table, table + "_keys"}
	}
	return []string{table}
}

// dropTables drops the tables that exist among names, one statement each so that a failure
// leaves no other behind, and returns the first error.
func (d *database) dropTables(ctx context.Context, names ...string) error {
	var first error
	for _, n := range names {
		if err := d.exec(ctx, "DROP TABLE IF EXISTS "+d.ident(n)); err != nil && first == nil {
			first = err
		}
	}
	return first
}
