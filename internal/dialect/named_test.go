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

func TestArgsMissingPanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("no panic for a missing parameter")
		}
	}()
	Compile(`SELECT @a`, Dollar).Args(nil)
}
