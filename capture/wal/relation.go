package wal

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pglogrepl"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/capture"
)

// declared is one Config.Tables entry resolved against the catalog at start.
type declared struct {
	table  capture.Table
	names  *capture.Names
	schema string // unquoted
	name   string // unquoted
	key    []string
}

// relation is a table of the stream (a RelationMessage) with its declaration's rules.
type relation struct {
	decl    *declared
	cols    []string
	rules   []*typeRule
	carried []int // column indexes carried in images and "changed"
	key     []int // key column indexes
	ops     map[capture.Operation]bool
}

// newRelation matches a RelationMessage to its declaration; nil decl means the relation is
// not captured (its changes are skipped).
func newRelation(ctx context.Context, rules *typeRules, m *pglogrepl.RelationMessage, decl *declared) (*relation, error) {
	r := &relation{decl: decl}
	if decl == nil {
		return r, nil
	}
	idx := map[string]int{}
	for i, c := range m.Columns {
		r.cols = append(r.cols, c.Name)
		idx[c.Name] = i
	}
	display := decl.schema + "." + decl.name
	for _, list := range [][]string{decl.table.Fields, decl.table.Exclude, decl.key} {
		for _, n := range list {
			if _, ok := idx[n]; !ok {
				return nil, &outbox.ConfigError{Field: "wal.Config.Tables", Reason: fmt.Sprintf("%s has no column %q", display, n), Err: capture.ErrUnknownColumn}
			}
		}
	}
	if len(decl.table.Fields) > 0 {
		for _, n := range decl.table.Fields {
			r.carried = append(r.carried, idx[n])
		}
	} else {
		for i, c := range r.cols {
			if !slices.Contains(decl.table.Exclude, c) {
				r.carried = append(r.carried, i)
			}
		}
	}
	for _, n := range decl.key {
		r.key = append(r.key, idx[n])
	}
	r.rules = make([]*typeRule, len(m.Columns))
	for _, i := range append(slices.Clone(r.carried), r.key...) {
		rule, err := rules.rule(ctx, m.Columns[i].DataType)
		if err != nil {
			return nil, err
		}
		if rule == nil {
			var typ string
			_ = rules.pool.QueryRow(ctx, `SELECT format_type($1, NULL)`, m.Columns[i].DataType).Scan(&typ)
			return nil, &outbox.ConfigError{Field: "wal.Config.Tables", Reason: "unsupported column type", Err: &capture.UnsupportedTypeError{Table: display, Column: r.cols[i], Type: typ}}
		}
		r.rules[i] = rule
	}
	r.ops = map[capture.Operation]bool{}
	for _, op := range decl.names.Operations() {
		r.ops[op] = true
	}
	return r, nil
}

// tuple is a row image of the stream: values in text form, nil for NULL; unchanged marks
// unchanged TOAST values (taken from the old image).
type tuple struct {
	vals      [][]byte
	unchanged []bool
}

func tupleOf(t *pglogrepl.TupleData) *tuple {
	if t == nil {
		return nil
	}
	out := &tuple{vals: make([][]byte, len(t.Columns)), unchanged: make([]bool, len(t.Columns))}
	for i, c := range t.Columns {
		switch c.DataType {
		case pglogrepl.TupleDataTypeText, pglogrepl.TupleDataTypeBinary:
			out.vals[i] = c.Data
		case pglogrepl.TupleDataTypeToast:
			out.unchanged[i] = true
		}
	}
	return out
}

// change is one captured row change ready to deliver, or in outbox-table mode one inserted
// outbox row (row set).
type change struct {
	id      uuid.UUID
	topic   string
	key     string
	payload json.RawMessage
	commit  time.Time
	row     *outboxRow
}

// image renders the JSON object of cols of t.
func (r *relation) image(t *tuple, cols []int) (json.RawMessage, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	for n, i := range cols {
		if n > 0 {
			b.WriteByte(',')
		}
		b.Write(jsonString(r.cols[i]))
		b.WriteByte(':')
		v, err := r.value(t, i)
		if err != nil {
			return nil, err
		}
		b.Write(v)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

func (r *relation) value(t *tuple, i int) (json.RawMessage, error) {
	if t.unchanged[i] {
		return nil, fmt.Errorf("wal: %s.%s: unchanged TOAST value without the old row (set REPLICA IDENTITY FULL: wal.Setup does)", r.decl.name, r.cols[i])
	}
	if t.vals[i] == nil {
		return json.RawMessage("null"), nil
	}
	v, err := r.rules[i].json(t.vals[i])
	if err != nil {
		return nil, fmt.Errorf("wal: %s.%s: %w", r.decl.name, r.cols[i], err)
	}
	return v, nil
}

// pk renders "pk" and the {pk} text of t.
func (r *relation) pk(t *tuple) (json.RawMessage, string, error) {
	switch len(r.key) {
	case 0:
		return json.RawMessage("null"), "", nil
	case 1:
		v, err := r.value(t, r.key[0])
		return v, r.keyText(t), err
	}
	v, err := r.image(t, r.key)
	return v, r.keyText(t), err
}

func (r *relation) keyText(t *tuple) string {
	parts := make([]string, len(r.key))
	for n, i := range r.key {
		if t.vals[i] != nil {
			parts[n] = r.rules[i].text(t.vals[i])
		}
	}
	return strings.Join(parts, ":")
}

// build returns the change of op with the old and new images (nil when absent), or nil when
// the triggers would write no event (an operation not captured, an UPDATE changing no carried
// column).
func (r *relation) build(op capture.Operation, oldT, newT *tuple, commit time.Time, lsn uint64, seq int) (*change, error) {
	if r.decl == nil || !r.ops[op] {
		return nil, nil
	}
	if oldT != nil && newT != nil {
		for i := range newT.vals {
			if newT.unchanged[i] && !oldT.unchanged[i] {
				newT.vals[i], newT.unchanged[i] = oldT.vals[i], false
			}
		}
	}
	row := newT
	if op == capture.Deleted {
		row = oldT
	}
	changed := make([]string, 0, len(r.carried))
	keyChanged := false
	for _, i := range r.carried {
		if op != capture.Updated || oldT == nil || !bytes.Equal(oldT.vals[i], newT.vals[i]) || (oldT.vals[i] == nil) != (newT.vals[i] == nil) {
			changed = append(changed, r.cols[i])
		}
	}
	if op == capture.Updated && oldT != nil {
		for _, i := range r.key {
			if !bytes.Equal(oldT.vals[i], newT.vals[i]) {
				keyChanged = true
			}
		}
	}
	if op == capture.Updated && len(changed) == 0 && !r.decl.table.EmitUnchanged {
		return nil, nil
	}
	pk, pkText, err := r.pk(row)
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	field := func(k string, v []byte) {
		b.WriteByte(',')
		b.Write(jsonString(k))
		b.WriteByte(':')
		b.Write(v)
	}
	b.WriteString(`{"table":`)
	display := r.decl.schema + "." + r.decl.name
	b.Write(jsonString(display))
	field("operation", jsonString(string(op)))
	field("pk", pk)
	ch, _ := json.Marshal(changed)
	field("changed", ch)
	field("occurred_at", jsonString(commit.UTC().Format("2006-01-02T15:04:05.000000+00:00")))
	img := func(t *tuple, cols []int) (json.RawMessage, error) {
		if t == nil {
			return json.RawMessage("null"), nil
		}
		return r.image(t, cols)
	}
	var before, after json.RawMessage
	switch p := r.decl.table.Payload; {
	case p == capture.PayloadBeforeAndAfter:
		if op != capture.Inserted {
			if before, err = img(oldT, r.carried); err != nil {
				return nil, err
			}
		} else {
			before = json.RawMessage("null")
		}
		if op != capture.Deleted {
			if after, err = img(newT, r.carried); err != nil {
				return nil, err
			}
		} else {
			after = json.RawMessage("null")
		}
	case p == capture.PayloadAfter && op == capture.Deleted:
		before, err = img(oldT, r.carried)
	case p == capture.PayloadAfter:
		after, err = img(newT, r.carried)
	}
	if err != nil {
		return nil, err
	}
	if keyChanged && r.decl.table.Payload != capture.PayloadBeforeAndAfter {
		if before, err = r.image(oldT, r.key); err != nil {
			return nil, err
		}
	}
	if before != nil {
		field("before", before)
	}
	if after != nil {
		field("after", after)
	}
	b.WriteByte('}')
	c := &change{id: changeID(commit, lsn, seq), payload: b.Bytes(), commit: commit}
	c.topic = r.decl.names.Topic(r.decl.schema, r.decl.name, op)
	if r.decl.names.Keyed() {
		c.key = r.decl.names.OrderingKey(r.decl.schema, r.decl.name, pkText)
	}
	return c, nil
}

// truncated returns the "truncated" change of a TRUNCATE (Table.Truncate = TruncateCapture),
// or nil.
func (r *relation) truncated(commit time.Time, lsn uint64, seq int) *change {
	if r.decl == nil || r.decl.table.Truncate != capture.TruncateCapture {
		return nil
	}
	display := r.decl.schema + "." + r.decl.name
	payload := fmt.Sprintf(`{"table":%s,"operation":"truncated","pk":null,"changed":[],"occurred_at":%s}`,
		jsonString(display), jsonString(commit.UTC().Format("2006-01-02T15:04:05.000000+00:00")))
	return &change{id: changeID(commit, lsn, seq), topic: r.decl.names.Topic(r.decl.schema, r.decl.name, capture.Truncated), payload: json.RawMessage(payload), commit: commit}
}

// changeID is the change's event id: a UUIDv7 (RFC 9562) whose time is the commit time and
// whose other bits are a hash of the transaction's commit LSN and the change's position in
// it, so the same change read again after a restart has the same id (a consumer's inbox
// drops the duplicate).
func changeID(commit time.Time, lsn uint64, seq int) uuid.UUID {
	var in [16]byte
	binary.BigEndian.PutUint64(in[:8], lsn)
	binary.BigEndian.PutUint64(in[8:], uint64(seq))
	h := sha256.Sum256(in[:])
	var u uuid.UUID
	ms := uint64(commit.UnixMilli())
	u[0], u[1], u[2], u[3], u[4], u[5] = byte(ms>>40), byte(ms>>32), byte(ms>>24), byte(ms>>16), byte(ms>>8), byte(ms)
	copy(u[6:], h[:10])
	u[6] = u[6]&0x0f | 0x70
	u[8] = u[8]&0x3f | 0x80
	return u
}
