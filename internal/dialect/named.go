package dialect

import (
	"fmt"
	"strconv"
	"strings"
)

// Placeholder is how a driver numbers statement parameters.
type Placeholder int

const (
	// Dollar is $1, $2 … (pgx, modernc.org/sqlite): a name used twice is one parameter.
	Dollar Placeholder = iota
	// Question is ? (go-sql-driver/mysql): a name used twice is passed twice.
	Question
)

// Stmt is SQL text written with named parameters (@name), compiled for one Placeholder style.
// Names are letters, digits and '_' after '@'; '@' inside string literals, quoted identifiers,
// comments and dollar-quoted bodies is text, and "@@" (MySQL system variables) is left alone.
// Safe for concurrent use.
type Stmt struct {
	SQL   string
	names []string // the parameter of each placeholder, in order
	at    []int    // each placeholder's byte offset in SQL (Question)
}

// Compile compiles q. It panics on an '@' followed by no name: statements are constants of the
// program, so that is a programming error found by any test that runs the statement.
func Compile(q string, style Placeholder) *Stmt {
	var (
		b     strings.Builder
		names []string
		at    []int
		index = map[string]int{}
	)
	for i := 0; i < len(q); {
		c := q[i]
		switch {
		case c == '\'' || c == '"' || c == '`':
			j := i + 1
			for j < len(q) {
				if q[j] == c {
					if j+1 < len(q) && q[j+1] == c { // doubled quote
						j += 2
						continue
					}
					break
				}
				if q[j] == '\\' && c != '"' && style == Question { // MySQL backslash escapes
					j++
				}
				j++
			}
			b.WriteString(q[i:min(j+1, len(q))])
			i = j + 1
		case c == '-' && i+1 < len(q) && q[i+1] == '-':
			j := strings.IndexByte(q[i:], '\n')
			if j < 0 {
				j = len(q) - i
			}
			b.WriteString(q[i : i+j])
			i += j
		case c == '/' && i+1 < len(q) && q[i+1] == '*':
			j := strings.Index(q[i+2:], "*/")
			end := len(q)
			if j >= 0 {
				end = i + 2 + j + 2
			}
			b.WriteString(q[i:end])
			i = end
		case c == '$' && style == Dollar && i+1 < len(q) && (q[i+1] == '$' || isNameStart(q[i+1])):
			// A dollar-quoted body ($tag$ … $tag$); $1-style text has a digit and is copied.
			j := i + 1
			for j < len(q) && isNameChar(q[j]) {
				j++
			}
			if j >= len(q) || q[j] != '$' {
				b.WriteByte(c)
				i++
				continue
			}
			tag := q[i : j+1]
			k := strings.Index(q[j+1:], tag)
			end := len(q)
			if k >= 0 {
				end = j + 1 + k + len(tag)
			}
			b.WriteString(q[i:end])
			i = end
		case c == '@' && i+1 < len(q) && q[i+1] == '@':
			b.WriteString("@@")
			i += 2
		case c == '@':
			j := i + 1
			for j < len(q) && isNameChar(q[j]) {
				j++
			}
			if j == i+1 || !isNameStart(q[i+1]) {
				panic(fmt.Sprintf("dialect: '@' without a parameter name at byte %d of %q", i, q))
			}
			name := q[i+1 : j]
			switch style {
			case Question:
				names = append(names, name)
				at = append(at, b.Len())
				b.WriteByte('?')
			default:
				n, ok := index[name]
				if !ok {
					names = append(names, name)
					n = len(names)
					index[name] = n
				}
				b.WriteString("$" + strconv.Itoa(n))
			}
			i = j
		default:
			b.WriteByte(c)
			i++
		}
	}
	return &Stmt{SQL: b.String(), names: names, at: at}
}

// Args returns the statement's arguments in placeholder order. It panics when a parameter has
// no value (a programming error, like a missing parameter in SQL text).
func (s *Stmt) Args(named map[string]any) []any {
	args := make([]any, len(s.names))
	for i, n := range s.names {
		v, ok := named[n]
		if !ok {
			panic(fmt.Sprintf("dialect: no value for parameter @%s", n))
		}
		args[i] = v
	}
	return args
}

// Expand returns the statement's text and arguments for named, as Args does, but with each
// list parameter ([]int64 or []string value) written as one placeholder per element ("?, ?,
// ?"), as sqlc's sqlc.slice does for MySQL: "col IN (@list)" then reaches the server as a list
// of values, which it reads as ranges of an index (MySQL has no array type to pass instead). An
// empty list is written NULL, so "col IN (@list)" matches nothing; guard a NOT IN with a flag.
// Question style only (it panics otherwise, and like Args on a missing parameter).
func (s *Stmt) Expand(named map[string]any) (string, []any) {
	if len(s.at) != len(s.names) {
		panic("dialect: Expand of a statement not compiled for Question")
	}
	var b strings.Builder
	args := make([]any, 0, len(s.names))
	last := 0
	for i, n := range s.names {
		v, ok := named[n]
		if !ok {
			panic(fmt.Sprintf("dialect: no value for parameter @%s", n))
		}
		var vals []any
		switch l := v.(type) {
		case []int64:
			vals = anySlice(l)
		case []string:
			vals = anySlice(l)
		default:
			args = append(args, v)
			continue
		}
		b.WriteString(s.SQL[last:s.at[i]])
		if len(vals) == 0 {
			b.WriteString("NULL")
		} else {
			b.WriteString(strings.Repeat("?, ", len(vals)-1) + "?")
		}
		args = append(args, vals...)
		last = s.at[i] + 1
	}
	b.WriteString(s.SQL[last:])
	return b.String(), args
}

func anySlice[T any](vals []T) []any {
	out := make([]any, len(vals))
	for i, v := range vals {
		out[i] = v
	}
	return out
}

func isNameStart(c byte) bool {
	return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
}

func isNameChar(c byte) bool { return isNameStart(c) || (c >= '0' && c <= '9') }
