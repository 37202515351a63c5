package dialect

import (
	"fmt"
	"strings"
)

// ParseSQLFile splits an embedded .sql file into its named statements: each starts at a line
// "-- name: <name>" and runs to the next such line. Comment lines document the statement in the
// file and are dropped from its text; text before the first name is the file's preamble.
// It panics on a repeated name (a programming error).
func ParseSQLFile(text string) map[string]string {
	out := map[string]string{}
	var name string
	var b strings.Builder
	flush := func() {
		if name == "" {
			return
		}
		if _, dup := out[name]; dup {
			panic(fmt.Sprintf("dialect: statement %q defined twice", name))
		}
		out[name] = strings.TrimSpace(b.String())
	}
	for _, line := range strings.Split(text, "\n") {
		if n, ok := strings.CutPrefix(strings.TrimSpace(line), "-- name:"); ok {
			flush()
			name = strings.TrimSpace(n)
			b.Reset()
			continue
		}
		if name != "" && !strings.HasPrefix(strings.TrimSpace(line), "--") {
			b.WriteString(line)
			b.WriteByte('\n')
		}
	}
	flush()
	return out
}

// Fill replaces each {name} of q by vars[name]; it panics when a placeholder has no value (a
// programming error found by any test that builds the statement).
func Fill(q string, vars map[string]string) string {
	var b strings.Builder
	for {
		i := strings.IndexByte(q, '{')
		if i < 0 {
			b.WriteString(q)
			return b.String()
		}
		j := strings.IndexByte(q[i:], '}')
		name := ""
		if j > 0 {
			name = q[i+1 : i+j]
		}
		v, ok := vars[name]
		if j < 0 || !ok || !isPlaceholder(name) {
			// Not a placeholder ('{}' array literals, JSON): copied as is.
			if j > 0 && isPlaceholder(name) && !ok {
				panic(fmt.Sprintf("dialect: no value for {%s}", name))
			}
			b.WriteString(q[:i+1])
			q = q[i+1:]
			continue
		}
		b.WriteString(q[:i] + v)
		q = q[i+j+1:]
	}
}

func isPlaceholder(name string) bool {
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		if !(name[i] == '_' || (name[i] >= 'a' && name[i] <= 'z')) {
			return false
		}
	}
	return true
}
