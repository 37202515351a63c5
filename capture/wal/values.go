package wal

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// toJSON renders a column value in pgoutput's text form as the JSON value the capture
// triggers write for it (package capture, "JSON form of values"). The replication session
// runs with DateStyle ISO, TimeZone UTC, bytea_output hex and extra_float_digits 3.
type toJSON func(text []byte) (json.RawMessage, error)

// typeRule is how the source renders one column type: its JSON rule and its {pk} text.
type typeRule struct {
	json toJSON
	// text is the value's text as the triggers' (x)::text gives it (bpchar loses trailing
	// blanks).
	text func(text []byte) string
}

func plainText(b []byte) string { return string(b) }

// jsonString is the JSON string of s.
func jsonString(s string) json.RawMessage {
	b, _ := json.Marshal(s)
	return b
}

var (
	asNumber = func(b []byte) (json.RawMessage, error) { return json.RawMessage(b), nil }
	asString = func(b []byte) (json.RawMessage, error) { return jsonString(string(b)), nil }
)

// typeRules classifies column types by oid, caching pg_type lookups.
type typeRules struct {
	pool  *pgxpool.Pool
	cache map[uint32]*typeRule
}

// rule returns the rule of type oid, or nil when the type has none (the source then refuses
// the table with a *capture.UnsupportedTypeError).
func (t *typeRules) rule(ctx context.Context, oid uint32) (*typeRule, error) {
	if r, ok := t.cache[oid]; ok {
		return r, nil
	}
	var name, typtype string
	var base uint32
	err := t.pool.QueryRow(ctx, `SELECT typname::text, typtype::text, typbasetype FROM pg_type WHERE oid = $1`, oid).Scan(&name, &typtype, &base)
	if err != nil {
		return nil, fmt.Errorf("wal: read type %d: %w", oid, err)
	}
	var r *typeRule
	switch {
	case typtype == "d":
		if r, err = t.rule(ctx, base); err != nil {
			return nil, err
		}
	case typtype == "e":
		r = &typeRule{json: asString, text: plainText}
	default:
		r = builtinRule(name)
	}
	t.cache[oid] = r
	return r, nil
}

// builtinRule is the rule of a base type by name, or nil.
func builtinRule(name string) *typeRule {
	switch name {
	case "int2", "int4", "int8", "oid":
		return &typeRule{json: asNumber, text: plainText}
	case "float4", "float8":
		return &typeRule{json: func(b []byte) (json.RawMessage, error) {
			switch s := string(b); s {
			case "NaN", "Infinity", "-Infinity":
				return jsonString(s), nil
			case "-0":
				return json.RawMessage("0"), nil
			}
			return json.RawMessage(b), nil
		}, text: plainText}
	case "bool":
		return &typeRule{json: func(b []byte) (json.RawMessage, error) {
			if string(b) == "t" {
				return json.RawMessage("true"), nil
			}
			return json.RawMessage("false"), nil
		}, text: func(b []byte) string {
			if string(b) == "t" {
				return "true"
			}
			return "false"
		}}
	case "inet":
		// inet's output drops a host mask (/32, /128); its ::text keeps it.
		withMask := func(b []byte) string {
			s := string(b)
			switch {
			case strings.Contains(s, "/"):
				return s
			case strings.Contains(s, ":"):
				return s + "/128"
			}
			return s + "/32"
		}
		return &typeRule{json: func(b []byte) (json.RawMessage, error) { return jsonString(withMask(b)), nil }, text: withMask}
	case "text", "varchar", "name", "numeric", "uuid", "cidr", "macaddr", "macaddr8", "citext", "date", "time", "timetz":
		return &typeRule{json: asString, text: plainText}
	case "bpchar":
		trim := func(b []byte) string { return strings.TrimRight(string(b), " ") }
		return &typeRule{json: func(b []byte) (json.RawMessage, error) { return jsonString(trim(b)), nil }, text: trim}
	case "timestamp":
		return &typeRule{json: func(b []byte) (json.RawMessage, error) {
			return jsonString(strings.Replace(string(b), " ", "T", 1)), nil
		}, text: plainText}
	case "timestamptz":
		return &typeRule{json: func(b []byte) (json.RawMessage, error) {
			s := string(b)
			if s == "infinity" || s == "-infinity" {
				return jsonString(s), nil
			}
			ts, err := time.Parse("2006-01-02 15:04:05.999999-07", s)
			if err != nil {
				return nil, fmt.Errorf("wal: timestamptz %q: %w", s, err)
			}
			return jsonString(ts.UTC().Format("2006-01-02T15:04:05.000000+00:00")), nil
		}, text: plainText}
	case "bytea":
		return &typeRule{json: func(b []byte) (json.RawMessage, error) {
			s, ok := strings.CutPrefix(string(b), `\x`)
			if !ok {
				return nil, fmt.Errorf("wal: bytea not in hex form")
			}
			raw, err := hex.DecodeString(s)
			if err != nil {
				return nil, fmt.Errorf("wal: bytea: %w", err)
			}
			return jsonString(base64.StdEncoding.EncodeToString(raw)), nil
		}, text: plainText}
	case "json", "jsonb":
		return &typeRule{json: func(b []byte) (json.RawMessage, error) {
			if !json.Valid(b) {
				return nil, fmt.Errorf("wal: invalid JSON value")
			}
			return json.RawMessage(b), nil
		}, text: plainText}
	}
	return nil
}
