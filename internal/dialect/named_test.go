package dialect

import (
	"reflect"
	"testing"
)

func TestCompileDollar(t *testing.T) {
	s := Compile(`SELECT @a, '@x', "@y", @b -- @c
, @a /* @d */, $t$ @e $t$, $1, @@v`, Dollar)
	want := `SELECT $1, '@x', "@y", $2 -- @c
, $1 /* @d */, $t$ @e $t$, $1, @@v`
	if s.SQL != want {
		t.Fatalf("SQL = %q, want %q", s.SQL, want)
	}
	if got := s.Args(map[string]any{"a": 1, "b": "two"}); !reflect.DeepEqual(got, []any{1, "two"}) {
		t.Fatalf("Args = %v", got)
	}
}

func TestCompileQuestion(t *testing.T) {
	s := Compile(`SELECT @a, 'it''s @x \' @z', @b, @a, @@session.sql_mode`, Question)
	if want := `SELECT ?, 'it''s @x \' @z', ?, ?, @@session.sql_mode`; s.SQL != want {
		t.Fatalf("SQL = %q, want %q", s.SQL, want)
	}
	if got := s.Args(map[string]any{"a": 1, "b": 2}); !reflect.DeepEqual(got, []any{1, 2, 1}) {
		t.Fatalf("Args = %v", got)
	}
}

func TestExpandLists(t *testing.T) {
	s := Compile(`SELECT @a FROM t WHERE x IN (@xs) AND '@xs?' <> @b AND y IN (@ys) AND z IN (@xs)`, Question)
	q, args := s.Expand(map[string]any{"a": 1, "b": "?", "xs": []int64{7, 8, 9}, "ys": []string{}})
	if want := `SELECT ? FROM t WHERE x IN (?, ?, ?) AND '@xs?' <> ? AND y IN (NULL) AND z IN (?, ?, ?)`; q != want {
		t.Fatalf("SQL = %q, want %q", q, want)
	}
	if want := []any{1, int64(7), int64(8), int64(9), "?", int64(7), int64(8), int64(9)}; !reflect.DeepEqual(args, want) {
		t.Fatalf("args = %v, want %v", args, want)
	}
}

func TestArgsMissingPanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("no panic for a missing parameter")
		}
	}()
	Compile(`SELECT @a`, Dollar).Args(nil)
}
