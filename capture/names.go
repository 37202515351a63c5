package capture

import "strings"

// Names is a checked Table's naming outside the triggers: its operations, topic and ordering
// key rendered in Go. The WAL source (package capture/wal) builds the same events from the
// database log with it. Safe for concurrent use.
type Names struct{ c *checked }

// CheckTable runs the rules of t that need no catalog (templates, modes, mutually exclusive
// fields) and returns its Names. i is t's index in the caller's list, used in the Field of the
// *outbox.ConfigError it returns ("Table[i].Topic").
func CheckTable(i int, t Table) (*Names, error) {
	c, err := check(i, t)
	if err != nil {
		return nil, err
	}
	return &Names{c: c}, nil
}

// Operations returns the captured operations (the default three when Table.Operations is
// empty).
func (n *Names) Operations() []Operation { return n.c.ops }

// Topic returns the lower-cased topic of op for the table schema.table.
func (n *Names) Topic(schema, table string, op Operation) string {
	return strings.ToLower(n.c.topic.expand(map[string]string{"schema": schema, "table": table, "operation": string(op)}))
}

// Keyed reports whether events get an ordering key from the OrderingKey template (false with
// Unordered or OrderingKeySQL).
func (n *Names) Keyed() bool { return n.c.okey != nil }

// OrderingKey renders the OrderingKey template; pk is the key columns' text joined by ':'.
// It returns "" when Keyed is false.
func (n *Names) OrderingKey(schema, table, pk string) string {
	if n.c.okey == nil {
		return ""
	}
	return n.c.okey.expand(map[string]string{"schema": schema, "table": table, "pk": pk})
}
