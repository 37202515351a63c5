package main

import (
	"context"
	"fmt"
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
	return d.MatchTables(ctx, pattern)
}
