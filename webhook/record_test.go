package webhook

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

func TestTruncateForRecord(t *testing.T) {
	cases := []struct {
		name, in, want string
	}{
		{"short", "ok", "ok"},
		{"NUL", "a\x00b\x00", "a\uFFFDb\uFFFD"},
		{"invalid UTF-8", "caf\xe9 \xff\xfe!", "caf\uFFFD \uFFFD!"},
		{"exactly the limit", strings.Repeat("x", RecordLimit), strings.Repeat("x", RecordLimit)},
		{"over the limit, multibyte", strings.Repeat("é", RecordLimit+1000), strings.Repeat("é", RecordLimit)},
		{"emoji at the edge", strings.Repeat("x", RecordLimit-1) + "😀yz", strings.Repeat("x", RecordLimit-1) + "😀"},
		{"NUL counted after replacement", strings.Repeat("\x00", RecordLimit+1), strings.Repeat("\uFFFD", RecordLimit)},
	}
	for _, c := range cases {
		got := TruncateForRecord(c.in)
		if got != c.want {
			t.Errorf("%s: got %d runes %q…, want %d runes", c.name, utf8.RuneCountInString(got), firstRunes(got, 8), utf8.RuneCountInString(c.want))
		}
		if !utf8.ValidString(got) || strings.IndexByte(got, 0) >= 0 {
			t.Errorf("%s: result not clean", c.name)
		}
	}
}

func firstRunes(s string, n int) string { return truncateRunes(s, n) }

func TestColumnRecorder(t *testing.T) {
	type call struct {
		sql  string
		args []any
	}
	var calls []call
	exec := func(_ context.Context, sql string, args ...any) error {
		calls = append(calls, call{sql, args})
		return nil
	}
	rec, err := ColumnRecorder(exec, "public.watermill_outbox", "webhook_result", nil)
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 11, 30, 12, 0, 0, 5, time.FixedZone("CET", 3600))
	rec(context.Background(), Result{
		EventID: eventID, Topic: "orders", URL: "https://example.com/h", StatusCode: 500,
		Body: "<oops> & more", Err: "webhook: status 500", Attempt: at, Duration: 1500 * time.Microsecond,
	})
	if len(calls) != 1 {
		t.Fatalf("exec called %d times", len(calls))
	}
	const wantSQL = `UPDATE "public"."watermill_outbox" SET "webhook_result" = $1::jsonb WHERE id = $2`
	if calls[0].sql != wantSQL {
		t.Errorf("sql = %s\nwant  %s", calls[0].sql, wantSQL)
	}
	if len(calls[0].args) != 2 || calls[0].args[1] != eventID {
		t.Fatalf("args = %#v", calls[0].args)
	}
	doc, ok := calls[0].args[0].(string)
	if !ok {
		t.Fatalf("$1 is %T, want string", calls[0].args[0])
	}
	const wantDoc = `{"event_id":"` + eventID + `","topic":"orders","url":"https://example.com/h","status_code":500,` +
		`"body":"<oops> & more","error":"webhook: status 500","attempted_at":"2026-11-30T11:00:00.000000005Z","duration_ms":1.5}`
	if doc != wantDoc {
		t.Errorf("$1 = %s\nwant %s", doc, wantDoc)
	}
	var parsed map[string]any
	if err := json.Unmarshal([]byte(doc), &parsed); err != nil {
		t.Errorf("$1 is not JSON: %v", err)
	}

	// Success omits empty fields.
	calls = nil
	rec(context.Background(), Result{EventID: "e", Topic: "t", StatusCode: 204, Attempt: time.Unix(0, 0)})
	if got := calls[0].args[0]; got != `{"event_id":"e","topic":"t","status_code":204,"attempted_at":"1970-01-01T00:00:00Z","duration_ms":0}` {
		t.Errorf("success doc = %s", got)
	}
}

func TestColumnRecorderQuotingAndErrors(t *testing.T) {
	var gotSQL string
	exec := func(_ context.Context, sql string, _ ...any) error { gotSQL = sql; return nil }
	rec, err := ColumnRecorder(exec, `my"schema.out box`, `res"ult`, nil)
	if err != nil {
		t.Fatal(err)
	}
	rec(context.Background(), Result{EventID: "e"})
	if want := `UPDATE "my""schema"."out box" SET "res""ult" = $1::jsonb WHERE id = $2`; gotSQL != want {
		t.Errorf("sql = %s, want %s", gotSQL, want)
	}
	rec, _ = ColumnRecorder(exec, "watermill_outbox", "r", nil)
	rec(context.Background(), Result{EventID: "e"})
	if want := `UPDATE "watermill_outbox" SET "r" = $1::jsonb WHERE id = $2`; gotSQL != want {
		t.Errorf("sql = %s, want %s", gotSQL, want)
	}

	bad := []struct{ table, column, field string }{
		{"", "c", "table"},
		{"public.", "c", "table"},
		{".t", "c", "table"},
		{"a..b", "c", "table"},
		{"db.public.t", "c", "table"},
		{"t\x00", "c", "table"},
		{"t\xff", "c", "table"},
		{strings.Repeat("t", 64), "c", "table"},
		{"t", "", "column"},
		{"t", "a.b", "column"},
		{"t", "c\x00", "column"},
	}
	for _, b := range bad {
		_, err := ColumnRecorder(exec, b.table, b.column, nil)
		var ce *ConfigError
		if !errors.As(err, &ce) || ce.Field != b.field {
			t.Errorf("ColumnRecorder(%q, %q) = %v, want *ConfigError for %s", b.table, b.column, err, b.field)
		}
	}
	if _, err := ColumnRecorder(nil, "t", "c", nil); err == nil {
		t.Error("nil exec accepted")
	}
	if _, err := ColumnRecorder(exec, strings.Repeat("t", 63), "c", nil); err != nil {
		t.Errorf("63-byte identifier refused: %v", err)
	}

	// Exec errors go to onError with the result.
	errDB := errors.New("db down")
	var reported []error
	rec, _ = ColumnRecorder(func(context.Context, string, ...any) error { return errDB }, "t", "c",
		func(_ context.Context, r Result, err error) {
			if r.EventID != "e" {
				t.Errorf("onError got result %+v", r)
			}
			reported = append(reported, err)
		})
	rec(context.Background(), Result{EventID: "e"})
	if len(reported) != 1 || !errors.Is(reported[0], errDB) {
		t.Errorf("onError got %v", reported)
	}
}
