package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"time"
	"unicode/utf8"
)

// RecordLimit is the number of characters (Unicode code points) TruncateForRecord keeps.
const RecordLimit = 4000

// Result describes one delivery attempt of one message, as passed to Config.OnResult.
//
// OnResult's context carries the values of msg.Context() but is not cancelled with it (so a
// timed-out attempt can still be recorded) and expires after Config.Timeout.
type Result struct {
	// EventID is the message UUID.
	EventID string
	// Topic is the topic given to Publish.
	Topic string
	// URL is the destination with any password removed; empty when no target was determined.
	URL string
	// StatusCode is the HTTP status, 0 when no response arrived.
	StatusCode int
	// Body is the start of the response body, cleaned by TruncateForRecord.
	Body string
	// Err is the attempt's error text cleaned by TruncateForRecord; empty on success.
	Err string
	// Attempt is when the attempt started, by Config.Now.
	Attempt time.Time
	// Duration is how long the attempt took (monotonic clock).
	Duration time.Duration
}

// OK reports whether the attempt delivered the message (a 2xx answer).
func (r Result) OK() bool { return r.Err == "" && r.StatusCode >= 200 && r.StatusCode < 300 }

// resultJSON is Result's JSON shape.
type resultJSON struct {
	EventID    string  `json:"event_id"`
	Topic      string  `json:"topic"`
	URL        string  `json:"url,omitempty"`
	StatusCode int     `json:"status_code,omitempty"`
	Body       string  `json:"body,omitempty"`
	Err        string  `json:"error,omitempty"`
	Attempt    string  `json:"attempted_at"`
	DurationMS float64 `json:"duration_ms"`
}

// MarshalJSON encodes r as a JSON object with the keys event_id, topic, url, status_code, body,
// error (the last four omitted when empty/zero), attempted_at (RFC 3339 with nanoseconds,
// UTC) and duration_ms (milliseconds, fractional). It writes <, > and & unescaped;
// json.Marshal re-escapes them as \u003c etc., which decodes to the same value.
func (r Result) MarshalJSON() ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	err := enc.Encode(resultJSON{
		EventID:    r.EventID,
		Topic:      r.Topic,
		URL:        r.URL,
		StatusCode: r.StatusCode,
		Body:       r.Body,
		Err:        r.Err,
		Attempt:    r.Attempt.UTC().Format(time.RFC3339Nano),
		DurationMS: float64(r.Duration) / float64(time.Millisecond),
	})
	if err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// TruncateForRecord makes s safe to store in a PostgreSQL text or jsonb column and bounded:
// invalid UTF-8 sequences become U+FFFD, NUL characters (refused by PostgreSQL) become U+FFFD,
// and the result is cut to at most RecordLimit (4000) characters, counted as runes, never in the
// middle of one. Safe for concurrent use.
func TruncateForRecord(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	s = strings.ReplaceAll(s, "\x00", "\uFFFD")
	return truncateRunes(s, RecordLimit)
}

// truncateRunes cuts valid UTF-8 s to at most n runes.
func truncateRunes(s string, n int) string {
	if len(s) <= n {
		return s
	}
	i := 0
	for pos := range s {
		if i == n {
			return s[:pos]
		}
		i++
	}
	return s
}

// ExecFunc runs one SQL statement with positional arguments ($1, $2, …). Adapt a pgx pool with
//
//	func(ctx context.Context, sql string, args ...any) error { _, err := pool.Exec(ctx, sql, args...); return err }
//
// or a *sql.DB with db.ExecContext the same way.
type ExecFunc func(ctx context.Context, sql string, args ...any) error

// ColumnRecorder returns a Config.OnResult function that stores each attempt's Result, as JSON
// (see Result.MarshalJSON), in column of the outbox row whose id is the event id, with the
// PostgreSQL statement
//
//	UPDATE <table> SET <column> = $1::jsonb WHERE id = $2
//
// with $1 the JSON text (a string) and $2 the event id (a string). table may be
// schema-qualified ("public.watermill_outbox"); each dot-separated part and column are quoted
// as identifiers (double quotes doubled), so they are never spliced in as SQL. Empty parts,
// more than two table parts, a dot in column, NUL bytes, invalid UTF-8 and parts longer than
// PostgreSQL's 63-byte identifier limit are a *ConfigError. The column should be jsonb.
//
// Recording must not fail a delivery, so errors from exec are passed to onError (which may be
// nil to ignore them) together with the Result. The returned function is safe for concurrent
// use if exec and onError are.
func ColumnRecorder(exec ExecFunc, table, column string, onError func(ctx context.Context, r Result, err error)) (func(ctx context.Context, r Result), error) {
	if exec == nil {
		return nil, &ConfigError{Field: "exec", Reason: "is nil"}
	}
	qt, err := quoteQualified(table, 2)
	if err != nil {
		return nil, &ConfigError{Field: "table", Reason: err.Error()}
	}
	qc, err := quoteQualified(column, 1)
	if err != nil {
		return nil, &ConfigError{Field: "column", Reason: err.Error()}
	}
	query := "UPDATE " + qt + " SET " + qc + " = $1::jsonb WHERE id = $2"
	return func(ctx context.Context, r Result) {
		doc, err := r.MarshalJSON() // not json.Marshal, which would re-escape <, > and &
		if err == nil {
			err = exec(ctx, query, string(doc), r.EventID)
		}
		if err != nil && onError != nil {
			onError(ctx, r, err)
		}
	}, nil
}

// maxIdentifierBytes is PostgreSQL's identifier limit (NAMEDATALEN-1); longer ones would be
// truncated silently.
const maxIdentifierBytes = 63

type identError string

func (e identError) Error() string { return string(e) }

// quoteQualified quotes a dotted identifier of 1..maxParts parts.
func quoteQualified(name string, maxParts int) (string, error) {
	if name == "" {
		return "", identError("empty identifier")
	}
	parts := strings.Split(name, ".")
	if len(parts) > maxParts {
		if maxParts == 1 {
			return "", identError("must be a single identifier without dots")
		}
		return "", identError("at most schema.table")
	}
	var b strings.Builder
	for i, p := range parts {
		switch {
		case p == "":
			return "", identError("empty identifier part in " + `"` + name + `"`)
		case strings.IndexByte(p, 0) >= 0:
			return "", identError("identifier contains NUL")
		case !utf8.ValidString(p):
			return "", identError("identifier is not valid UTF-8")
		case len(p) > maxIdentifierBytes:
			return "", identError("identifier part longer than 63 bytes")
		}
		if i > 0 {
			b.WriteByte('.')
		}
		b.WriteByte('"')
		b.WriteString(strings.ReplaceAll(p, `"`, `""`))
		b.WriteByte('"')
	}
	return b.String(), nil
}
