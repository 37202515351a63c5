package capture

import (
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/watermill-outbox/outbox"
)

// Operation is a kind of row change a trigger captures.
type Operation string

// The operations, as they appear in the envelope's "operation" and in the {operation} of a
// topic template.
const (
	Inserted  Operation = "inserted"
	Updated   Operation = "updated"
	Deleted   Operation = "deleted"
	Truncated Operation = "truncated"
)

// Payload chooses which row images the envelope carries.
type Payload int

const (
	// PayloadAfter (the zero value, default): "after" is the row as the write left it; for a
	// delete, "before" is the row as it was. No "before" on insert and update (except the old
	// key after a primary-key change).
	PayloadAfter Payload = iota
	// PayloadKeys: the envelope without row images ("pk" and "changed" only, plus the old key
	// in "before" after a primary-key change).
	PayloadKeys
	// PayloadBeforeAndAfter: both images; "before" is null on insert, "after" null on delete.
	PayloadBeforeAndAfter
)

// String returns "after", "keys" or "before-and-after".
func (p Payload) String() string {
	switch p {
	case PayloadAfter:
		return "after"
	case PayloadKeys:
		return "keys"
	case PayloadBeforeAndAfter:
		return "before-and-after"
	}
	return fmt.Sprintf("Payload(%d)", int(p))
}

// ParsePayload parses "after", "keys" or "before-and-after" (also "before_and_after").
func ParsePayload(s string) (Payload, error) {
	switch strings.ToLower(strings.ReplaceAll(s, "_", "-")) {
	case "", "after":
		return PayloadAfter, nil
	case "keys":
		return PayloadKeys, nil
	case "before-and-after":
		return PayloadBeforeAndAfter, nil
	}
	return 0, fmt.Errorf("capture: unknown payload mode %q (want after, keys or before-and-after)", s)
}

// Truncate chooses what a TRUNCATE of a captured PostgreSQL table does. SQLite has no
// TRUNCATE: its "DELETE FROM t" without WHERE runs the delete trigger for every row.
type Truncate int

const (
	// TruncateRefuse (the zero value, default): a statement trigger raises an error, so the
	// TRUNCATE (and its transaction) fails; rows must be deleted with DELETE to be captured.
	TruncateRefuse Truncate = iota
	// TruncateCapture writes one event of operation "truncated" (no "pk", no row images,
	// unordered) for each TRUNCATE statement.
	TruncateCapture
	// TruncateIgnore lets TRUNCATE run without an event.
	TruncateIgnore
)

// Extend adds values computed by SQL inside the trigger. Every expression is trusted SQL text
// written by the programmer (never by end users), evaluated once per captured row in the
// writer's transaction; "{row}" stands for the changed row (NEW, or OLD for a delete), so
// "{row}.tenant_id" reads the row's tenant_id column.
type Extend struct {
	// Payload adds top-level keys to the envelope: key → SQL expression of a JSON-compatible
	// value (a string, a number, a boolean; on PostgreSQL any value to_jsonb accepts). A key
	// that is an envelope key ("table", "pk", …) is a *outbox.ConfigError.
	Payload map[string]string
	// Headers adds event headers: header name → SQL expression of a text value. A NULL value
	// omits the header.
	Headers map[string]string
	// Columns fills the outbox's extra columns (SchemaConfig.ExtraColumns): column name → SQL
	// expression of the column's type.
	Columns map[string]string
}

// Table declares one captured table. The zero value of every field but Name is the default.
type Table struct {
	// Name is the table, optionally schema-qualified ("public.loan"); unqualified names are
	// resolved through the connection's search_path (PostgreSQL) or in "main" (SQLite).
	Name string
	// Operations lists the captured operations among Inserted, Updated and Deleted. Default
	// (nil or empty): all three. Truncated is not allowed here: see Truncate.
	Operations []Operation
	// Payload chooses the row images of the envelope. Default PayloadAfter.
	Payload Payload
	// Fields lists the columns the event carries (in "before"/"after" and "changed"); Exclude
	// lists the columns it leaves out. At most one of them; default all columns. Key columns
	// are always in "pk" whatever Fields says.
	Fields  []string
	Exclude []string
	// Topic is a template of {schema}, {table} and {operation} giving the event's topic, lower
	// cased. Default DefaultTopic ("{table}.{operation}").
	Topic string
	// OrderingKey is a template of {schema}, {table} and {pk} (the key columns' text joined by
	// ':') giving the event's ordering key. Default DefaultOrderingKey ("{table}:{pk}"), so the
	// events of one row are delivered in commit order: the row's lock orders its writers, so no
	// per-key lock is taken. That holds only while no two rows share a key: tables of one name in
	// several schemas (a schema per tenant), or composite keys whose parts contain ':', do;
	// give those "{schema}.{table}:{pk}" (a key that is distinct again) or LockOrderingKey,
	// otherwise one key's events can commit out of sequence order and wait behind each other.
	// See OrderingKeySQL and Unordered.
	OrderingKey string
	// OrderingKeySQL, when set, replaces OrderingKey by a SQL expression of text over {row}
	// (for example "'account:' || {row}.account_id"). NULL or '' means unordered.
	OrderingKeySQL string
	// Unordered writes events without an ordering key.
	Unordered bool
	// LockOrderingKey makes the trigger take the Publisher's per-key lock (see the package
	// doc, "Ordering") also for the default ordering key. Any other ordering key always takes
	// it. Each distinct key holds a slot of PostgreSQL's shared lock table until COMMIT (about
	// 7.8k slots by default), so one statement changing more rows than that then fails.
	LockOrderingKey bool
	// Key names the columns identifying a row, in order. Default: the primary key. A table
	// without a primary key needs Key, OrderingKeySQL or Unordered (then "pk" is null).
	Key []string
	// EmitUnchanged writes an event also for an UPDATE that changes none of the carried
	// columns ("changed" is then empty). Default false: no event.
	EmitUnchanged bool
	// Extend adds SQL-computed payload keys, headers and extra columns.
	Extend Extend
	// Truncate chooses what a TRUNCATE does (PostgreSQL). Default TruncateRefuse.
	Truncate Truncate
	// SkipReplicaSessions (PostgreSQL) lets the triggers be skipped by sessions with
	// session_replication_role = replica. Default false: the triggers are enabled ALWAYS
	// (ALTER TABLE … ENABLE ALWAYS TRIGGER), so pg_restore --disable-triggers, logical
	// replication apply, pgcopydb and bulk loaders that set the role write events too instead
	// of changing rows silently. Set it where replica sessions must not write events, for
	// example on a logical-replication subscriber whose publisher already captured the change.
	SkipReplicaSessions bool
}

// DefaultTopic is Table.Topic's default.
const DefaultTopic = "{table}.{operation}"

// DefaultOrderingKey is Table.OrderingKey's default.
const DefaultOrderingKey = "{table}:{pk}"

// envelopeKeys are the envelope's own keys, which extensions may not use.
var envelopeKeys = []string{"table", "operation", "pk", "changed", "before", "after", "occurred_at"}

var templateRe = regexp.MustCompile(`\{[^{}]*\}`)

// template is a parsed name template: literal text and names in order.
type template []tmplPart

type tmplPart struct {
	lit  string
	name string // "" for a literal
}

func parseTemplate(field, s string, allowed ...string) (template, error) {
	var t template
	last := 0
	for _, m := range templateRe.FindAllStringIndex(s, -1) {
		if m[0] > last {
			t = append(t, tmplPart{lit: s[last:m[0]]})
		}
		name := s[m[0]+1 : m[1]-1]
		if !slices.Contains(allowed, name) {
			return nil, &outbox.ConfigError{Field: field, Reason: fmt.Sprintf("%q: unknown template name {%s} (want one of {%s})", s, name, strings.Join(allowed, "}, {")), Err: ErrTemplate}
		}
		t = append(t, tmplPart{name: name})
		last = m[1]
	}
	if rest := s[last:]; rest != "" {
		if strings.ContainsAny(rest, "{}") {
			return nil, &outbox.ConfigError{Field: field, Reason: fmt.Sprintf("%q: unbalanced brace", s), Err: ErrTemplate}
		}
		t = append(t, tmplPart{lit: rest})
	}
	return t, nil
}

func (t template) uses(name string) bool {
	return slices.ContainsFunc(t, func(p tmplPart) bool { return p.name == name })
}

// expand renders t with the given names; values not in vals are kept as "{name}".
func (t template) expand(vals map[string]string) string {
	var b strings.Builder
	for _, p := range t {
		if p.name == "" {
			b.WriteString(p.lit)
		} else {
			b.WriteString(vals[p.name])
		}
	}
	return b.String()
}

// checked is a Table whose static rules passed, with defaults filled.
type checked struct {
	Table
	index   int
	ops     []Operation
	topic   template
	okey    template // nil when OrderingKeySQL or Unordered
	lockKey bool
}

func (c *checked) field(name string) string { return fmt.Sprintf("Table[%d].%s", c.index, name) }

// check runs the rules that need no catalog.
func check(i int, t Table) (*checked, error) {
	c := &checked{Table: t, index: i}
	if strings.TrimSpace(t.Name) == "" {
		return nil, &outbox.ConfigError{Field: c.field("Name"), Reason: "empty table name", Err: ErrUnknownTable}
	}
	c.ops = t.Operations
	if len(c.ops) == 0 {
		c.ops = []Operation{Inserted, Updated, Deleted}
	}
	for _, op := range c.ops {
		if op != Inserted && op != Updated && op != Deleted {
			return nil, &outbox.ConfigError{Field: c.field("Operations"), Reason: fmt.Sprintf("%q: want inserted, updated or deleted (TRUNCATE: see Table.Truncate)", op), Err: ErrInvalid}
		}
	}
	if t.Payload < PayloadAfter || t.Payload > PayloadBeforeAndAfter {
		return nil, &outbox.ConfigError{Field: c.field("Payload"), Reason: fmt.Sprintf("unknown payload mode %d", t.Payload), Err: ErrInvalid}
	}
	if t.Truncate < TruncateRefuse || t.Truncate > TruncateIgnore {
		return nil, &outbox.ConfigError{Field: c.field("Truncate"), Reason: fmt.Sprintf("unknown truncate mode %d", t.Truncate), Err: ErrInvalid}
	}
	if len(t.Fields) > 0 && len(t.Exclude) > 0 {
		return nil, &outbox.ConfigError{Field: c.field("Fields"), Reason: "Fields and Exclude are mutually exclusive", Err: ErrFieldsAndExclude}
	}
	topic := t.Topic
	if topic == "" {
		topic = DefaultTopic
	}
	var err error
	if c.topic, err = parseTemplate(c.field("Topic"), topic, "schema", "table", "operation"); err != nil {
		return nil, err
	}
	keyed := !t.Unordered && t.OrderingKeySQL == ""
	if t.Unordered && (t.OrderingKeySQL != "" || t.OrderingKey != "") {
		return nil, &outbox.ConfigError{Field: c.field("Unordered"), Reason: "Unordered with an OrderingKey or OrderingKeySQL", Err: ErrInvalid}
	}
	if t.OrderingKeySQL != "" && t.OrderingKey != "" {
		return nil, &outbox.ConfigError{Field: c.field("OrderingKeySQL"), Reason: "OrderingKey and OrderingKeySQL are mutually exclusive", Err: ErrInvalid}
	}
	if keyed {
		okey := t.OrderingKey
		if okey == "" {
			okey = DefaultOrderingKey
		}
		if c.okey, err = parseTemplate(c.field("OrderingKey"), okey, "schema", "table", "pk"); err != nil {
			return nil, err
		}
		c.lockKey = okey != DefaultOrderingKey || t.LockOrderingKey
	} else {
		c.lockKey = t.OrderingKeySQL != ""
	}
	for k := range t.Extend.Payload {
		if slices.Contains(envelopeKeys, k) || k == "" {
			return nil, &outbox.ConfigError{Field: c.field("Extend.Payload"), Reason: fmt.Sprintf("key %q is an envelope key", k), Err: ErrInvalid}
		}
	}
	for k := range t.Extend.Headers {
		if k == "" || strings.ContainsRune(k, 0) {
			return nil, &outbox.ConfigError{Field: c.field("Extend.Headers"), Reason: fmt.Sprintf("header name %q", k), Err: ErrInvalid}
		}
	}
	for _, m := range []map[string]string{t.Extend.Payload, t.Extend.Headers, t.Extend.Columns} {
		for k, expr := range m {
			if strings.TrimSpace(expr) == "" || strings.ContainsAny(expr, ";\x00") {
				return nil, &outbox.ConfigError{Field: c.field("Extend"), Reason: fmt.Sprintf("%q: an expression must be non-empty SQL without ';'", k), Err: ErrInvalid}
			}
		}
	}
	if strings.ContainsAny(t.OrderingKeySQL, ";\x00") {
		return nil, &outbox.ConfigError{Field: c.field("OrderingKeySQL"), Reason: "an expression must be SQL without ';'", Err: ErrInvalid}
	}
	return c, nil
}

// sortedKeys returns m's keys in order, so generated SQL is deterministic.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
