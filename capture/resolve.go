package capture

import (
	"fmt"
	"hash/fnv"
	"maps"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/watermill-outbox/outbox"
)

// catColumn is a column of a captured table as the catalog describes it, with its JSON rule.
type catColumn struct {
	name string
	typ  string // the type as the catalog shows it
	// json renders the column's value at ref (NEW."c") as a JSON value expression; nil when
	// the type has no rule.
	json func(ref string) string
	// plain: the JSON rule is to_jsonb of the value (PostgreSQL), so to_jsonb of the whole
	// row renders this column the same way.
	plain bool
	// text renders the value at ref as text (for {pk}).
	text func(ref string) string
	// distinct renders "a differs from b".
	distinct func(a, b string) string
}

// catalog is what Install reads about one table.
type catalog struct {
	schema, table string // unquoted
	cols          []catColumn
	pk            []string
	isOutbox      bool
	// partitionOf is the partitioned table (as regclass text) the table is a partition of;
	// empty when it is none.
	partitionOf string
	// inherits lists the tables the table has an inheritance (INHERITS, not partition) link
	// with, parents or children; empty when none.
	inherits string
	// partitions are the partitions of a partitioned table, sub-partitions included, parents
	// before their partitions (PostgreSQL).
	partitions []partition
	// partitioned: the table is a partitioned table (PostgreSQL).
	partitioned bool
}

// partition is one member of a partitioned table's tree.
type partition struct {
	schema, table string // unquoted
	kind          string // pg_class.relkind: "r", "p" or "f"
}

func (p partition) quoted() string { return pgx.Identifier{p.schema, p.table}.Sanitize() }

// resolved is a declaration checked against the catalog: the code generators' input.
type resolved struct {
	*checked
	cat     *catalog
	qtable  string // quoted, qualified
	display string // "schema.table" for the envelope
	carried []catColumn
	key     []catColumn
}

// target is the outbox table the triggers write to.
type target struct {
	cfg   outbox.SchemaConfig
	table string // quoted, possibly qualified: as configured
	// written is the table the triggers insert into: on PostgreSQL schema-qualified as the
	// catalog resolved it at install (a writer's search_path does not matter), else table.
	written string
	// schemaName is the schema of written, unquoted (PostgreSQL, set by pgOutboxExists).
	schemaName string
	parts      []string
	seed       int64 // the Publisher's per-key lock seed
	be         backend
	extras     []string
}

func newTarget(cfg outbox.SchemaConfig) (*target, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	be, err := backendOf(cfg)
	if err != nil {
		return nil, err
	}
	name := cfg.Table
	if name == "" {
		name = outbox.DefaultTable
	}
	t := &target{cfg: cfg, be: be, parts: strings.Split(name, ".")}
	t.table = pgx.Identifier(t.parts).Sanitize()
	t.written = t.table
	// The seed of the Publisher's per-ordering-key lock and of Migrate's lock: FNV-1a (64
	// bits) of the quoted table name, as the root package computes it (schema.go, compile).
	h := fnv.New64a()
	h.Write([]byte(t.table))
	t.seed = int64(h.Sum64())
	for _, c := range cfg.ExtraColumns {
		t.extras = append(t.extras, c.Name)
	}
	return t, nil
}

func quoteIdent(s string) string { return pgx.Identifier{s}.Sanitize() }

func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// resolve checks c against the table's catalog.
func resolve(c *checked, cat *catalog, tg *target) (*resolved, error) {
	if cat.isOutbox {
		return nil, &outbox.ConfigError{Field: c.field("Name"), Reason: fmt.Sprintf("%q is the outbox table", c.Name), Err: ErrOutboxTable}
	}
	if cat.partitionOf != "" {
		return nil, &outbox.ConfigError{Field: c.field("Name"), Reason: fmt.Sprintf("%s.%s is a partition of %s: declare %s (its partitions are captured with it; writes through it would bypass a partition's own triggers)", cat.schema, cat.table, cat.partitionOf, cat.partitionOf), Err: ErrPartition}
	}
	if cat.inherits != "" {
		return nil, &outbox.ConfigError{Field: c.field("Name"), Reason: fmt.Sprintf("%s.%s has table inheritance with %s: a statement runs the triggers of the table it names only, so writes naming the other table would change rows without events (use declarative partitioning)", cat.schema, cat.table, cat.inherits), Err: ErrInheritance}
	}
	for _, p := range cat.partitions {
		if p.kind == "f" {
			return nil, &outbox.ConfigError{Field: c.field("Name"), Reason: fmt.Sprintf("partition %s.%s of %s.%s is a foreign table: its direct writes cannot be captured", p.schema, p.table, cat.schema, cat.table), Err: ErrPartition}
		}
	}
	r := &resolved{checked: c, cat: cat, display: cat.schema + "." + cat.table}
	r.qtable = pgx.Identifier{cat.schema, cat.table}.Sanitize()
	byName := map[string]catColumn{}
	for _, col := range cat.cols {
		byName[col.name] = col
	}
	for _, f := range [][]string{c.Fields, c.Exclude, c.Key} {
		for _, n := range f {
			if _, ok := byName[n]; !ok {
				field := map[bool]string{true: "Fields", false: "Exclude"}[len(c.Fields) > 0]
				if slices.Contains(c.Key, n) {
					field = "Key"
				}
				return nil, &outbox.ConfigError{Field: c.field(field), Reason: fmt.Sprintf("%s has no column %q", r.display, n), Err: ErrUnknownColumn}
			}
		}
	}
	switch {
	case len(c.Fields) > 0:
		for _, n := range c.Fields {
			r.carried = append(r.carried, byName[n])
		}
	default:
		for _, col := range cat.cols {
			if !slices.Contains(c.Exclude, col.name) {
				r.carried = append(r.carried, col)
			}
		}
	}
	keyNames := c.Key
	if len(keyNames) == 0 {
		keyNames = cat.pk
	}
	for _, n := range keyNames {
		r.key = append(r.key, byName[n])
	}
	if len(r.key) == 0 && c.okey != nil && c.okey.uses("pk") {
		return nil, &outbox.ConfigError{Field: c.field("Key"), Reason: fmt.Sprintf("%s has no primary key: set Key, OrderingKeySQL or Unordered", r.display), Err: ErrNoPrimaryKey}
	}
	for _, col := range append(slices.Clone(r.carried), r.key...) {
		if col.json == nil {
			return nil, &outbox.ConfigError{Field: c.field("Fields"), Reason: "unsupported column type", Err: &UnsupportedTypeError{Table: r.display, Column: col.name, Type: col.typ}}
		}
	}
	for name := range c.Extend.Columns {
		if !slices.Contains(tg.extras, name) {
			return nil, &outbox.ConfigError{Field: c.field("Extend.Columns"), Reason: fmt.Sprintf("%q is not one of SchemaConfig.ExtraColumns", name), Err: ErrInvalid}
		}
	}
	scopeFromRow(c, byName, tg.cfg.IdempotencyScope)
	return r, nil
}

// scopeFromRow fills, for a multi-tenant outbox (SchemaConfig.IdempotencyScope), each scope
// column that Extend.Columns leaves unset from the captured row's column of the same name, when
// the row has one: a captured event carries its row's tenant like a published one. The
// caller's map is never written.
func scopeFromRow(c *checked, byName map[string]catColumn, scope []string) {
	for _, col := range scope {
		if _, set := c.Extend.Columns[col]; set {
			continue
		}
		if _, has := byName[col]; !has {
			continue
		}
		c.Extend.Columns = maps.Clone(c.Extend.Columns)
		if c.Extend.Columns == nil {
			c.Extend.Columns = map[string]string{}
		}
		c.Extend.Columns[col] = "{row}." + quoteIdent(col)
	}
}

// topicFor returns the literal topic of op.
func (r *resolved) topicFor(op Operation) string {
	return strings.ToLower(r.topic.expand(map[string]string{"schema": r.cat.schema, "table": r.cat.table, "operation": string(op)}))
}

// keyChanged renders "a key column differs between the old and the new row", or "" without a key.
func (r *resolved) keyChanged(oldAlias, newAlias string) string {
	var parts []string
	for _, k := range r.key {
		parts = append(parts, k.distinct(rowRef(oldAlias)(k.name), rowRef(newAlias)(k.name)))
	}
	return strings.Join(parts, " OR ")
}

// orderingKey renders the ordering key expression of the row alias ("NEW", "OLD"), or "NULL";
// concat joins text expressions in the dialect.
func (r *resolved) orderingKey(alias string, concat func(parts []string) string) string {
	ref := rowRef(alias)
	switch {
	case r.Unordered:
		return "NULL"
	case r.OrderingKeySQL != "":
		return expandRow(r.OrderingKeySQL, alias)
	}
	var parts []string
	for _, p := range r.okey {
		switch p.name {
		case "":
			parts = append(parts, quoteLiteral(p.lit))
		case "schema":
			parts = append(parts, quoteLiteral(r.cat.schema))
		case "table":
			parts = append(parts, quoteLiteral(r.cat.table))
		case "pk":
			for i, k := range r.key {
				if i > 0 {
					parts = append(parts, "':'")
				}
				parts = append(parts, k.text(ref(k.name)))
			}
		}
	}
	return concat(parts)
}

// rowRef returns a function that quotes a column of the row alias ("NEW", "OLD").
func rowRef(alias string) func(string) string {
	return func(col string) string { return alias + "." + quoteIdent(col) }
}

// expandRow replaces {row} in a user expression by the row alias.
func expandRow(expr, alias string) string {
	return "(" + strings.ReplaceAll(expr, "{row}", alias) + ")"
}

// envelope returns the key/value pairs of op's envelope (JSON object arguments): pk, changed,
// occurred_at and the row images of the Payload mode. image renders a row image of an alias
// (old or new), null is the dialect's JSON null.
func (r *resolved) envelope(op Operation, pk, changed, occurredAt, oldAlias, newAlias, null string, image func(alias string, cols []catColumn) string) []string {
	env := []string{"'table', " + quoteLiteral(r.display), "'operation', " + quoteLiteral(string(op)), "'pk', " + pk,
		"'changed', " + changed, "'occurred_at', " + occurredAt}
	switch {
	case r.Payload == PayloadBeforeAndAfter && op == Inserted:
		env = append(env, "'before', "+null, "'after', "+image(newAlias, r.carried))
	case r.Payload == PayloadBeforeAndAfter && op == Updated:
		env = append(env, "'before', "+image(oldAlias, r.carried), "'after', "+image(newAlias, r.carried))
	case r.Payload == PayloadBeforeAndAfter && op == Deleted:
		env = append(env, "'before', "+image(oldAlias, r.carried), "'after', "+null)
	case r.Payload == PayloadAfter && op != Deleted:
		env = append(env, "'after', "+image(newAlias, r.carried))
	case r.Payload == PayloadAfter && op == Deleted:
		env = append(env, "'before', "+image(oldAlias, r.carried))
	}
	return env
}

// pairs returns the "'name', value" arguments of a JSON object of cols at the row alias.
func pairs(alias string, cols []catColumn) []string {
	ref := rowRef(alias)
	out := make([]string, 0, len(cols))
	for _, c := range cols {
		out = append(out, quoteLiteral(c.name)+", "+c.json(ref(c.name)))
	}
	return out
}

// pk renders the envelope's "pk" of the row alias: the key column's value, an object of a
// composite key's columns (image), or null without a key.
func (r *resolved) pk(alias, null string, image func(alias string, cols []catColumn) string) string {
	switch len(r.key) {
	case 0:
		return null
	case 1:
		return r.key[0].json(rowRef(alias)(r.key[0].name))
	}
	return image(alias, r.key)
}
