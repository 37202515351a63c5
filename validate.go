package outbox

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"
)

// MaxTextLength is the longest topic, ordering key or idempotency key, in characters (the
// columns are VARCHAR(255), which counts characters, not bytes).
const MaxTextLength = 255

// checkText validates a topic or key: valid UTF-8, no NUL (PostgreSQL text cannot hold it), at
// most MaxTextLength characters. Empty is checked by the caller.
func checkText(s string) string {
	if !utf8.ValidString(s) {
		return "not valid UTF-8"
	}
	if strings.IndexByte(s, 0) >= 0 {
		return "contains a NUL character"
	}
	if n := utf8.RuneCountInString(s); n > MaxTextLength {
		return fmt.Sprintf("%d characters, at most %d allowed", n, MaxTextLength)
	}
	return ""
}

// ValidatePayload reports whether PostgreSQL's jsonb accepts payload, with the reason when it
// does not: it must be valid UTF-8 and valid JSON (RFC 8259), with no \u0000 escape and no
// unpaired UTF-16 surrogate escape (jsonb refuses both), and numbers within PostgreSQL's numeric
// range (at most 131072 digits before the decimal point and 16383 after, exponents applied).
// The publisher runs it on every JSONB payload before any SQL. It returns "" when valid.
func ValidatePayload(payload []byte) string {
	if len(payload) == 0 {
		return "empty payload is not a JSON value"
	}
	if !utf8.Valid(payload) {
		return "not valid UTF-8"
	}
	if !json.Valid(payload) {
		return "not valid JSON"
	}
	return checkJSONForPostgres(payload)
}

// checkJSONForPostgres walks JSON already known to be valid and finds what jsonb refuses.
func checkJSONForPostgres(b []byte) string {
	for i := 0; i < len(b); i++ {
		c := b[i]
		switch {
		case c == '"':
			// String: scan to its end, checking \u escapes.
			for i++; i < len(b) && b[i] != '"'; i++ {
				if b[i] != '\\' {
					continue
				}
				i++
				if b[i] != 'u' {
					continue
				}
				r := hex4(b[i+1 : i+5])
				i += 4
				switch {
				case r == 0:
					return `contains \u0000, which PostgreSQL jsonb refuses`
				case r >= 0xDC00 && r <= 0xDFFF:
					return "contains an unpaired low surrogate escape"
				case r >= 0xD800 && r <= 0xDBFF:
					if i+6 >= len(b) || b[i+1] != '\\' || b[i+2] != 'u' {
						return "contains an unpaired high surrogate escape"
					}
					lo := hex4(b[i+3 : i+7])
					if lo < 0xDC00 || lo > 0xDFFF {
						return "contains an unpaired high surrogate escape"
					}
					i += 6
				}
			}
		case c == '-' || (c >= '0' && c <= '9'):
			j := i
			for j < len(b) && strings.IndexByte("+-0123456789.eE", b[j]) >= 0 {
				j++
			}
			if reason := checkNumeric(b[i:j]); reason != "" {
				return reason
			}
			i = j - 1
		}
	}
	return ""
}

// jsonDepth returns the deepest nesting of arrays and objects in valid JSON b.
func jsonDepth(b []byte) int {
	depth, deepest := 0, 0
	for i := 0; i < len(b); i++ {
		switch b[i] {
		case '"':
			for i++; i < len(b) && b[i] != '"'; i++ {
				if b[i] == '\\' {
					i++
				}
			}
		case '[', '{':
			depth++
			deepest = max(deepest, depth)
		case ']', '}':
			depth--
		}
	}
	return deepest
}

func hex4(h []byte) rune {
	var r rune
	for _, c := range h {
		r <<= 4
		switch {
		case c >= '0' && c <= '9':
			r |= rune(c - '0')
		case c >= 'a' && c <= 'f':
			r |= rune(c-'a') + 10
		case c >= 'A' && c <= 'F':
			r |= rune(c-'A') + 10
		}
	}
	return r
}

// PostgreSQL numeric limits (src/include/utils/numeric.h): NUMERIC_WEIGHT_MAX digits before the
// decimal point, NUMERIC_DSCALE_MAX after.
const (
	numericMaxIntDigits  = 131072
	numericMaxFracDigits = 16383
)

// checkNumeric checks a valid JSON number against PostgreSQL's numeric range.
func checkNumeric(n []byte) string {
	s := string(n)
	if s[0] == '-' {
		s = s[1:]
	}
	mant, exp := s, int64(0)
	if k := strings.IndexAny(s, "eE"); k >= 0 {
		mant = s[:k]
		e := s[k+1:]
		neg := false
		if e[0] == '+' || e[0] == '-' {
			neg = e[0] == '-'
			e = e[1:]
		}
		e = strings.TrimLeft(e, "0")
		if len(e) > 9 {
			return fmt.Sprintf("number %.40s… is outside PostgreSQL's numeric range", n)
		}
		for _, c := range e {
			exp = exp*10 + int64(c-'0')
		}
		if neg {
			exp = -exp
		}
	}
	intPart, frac := mant, ""
	if k := strings.IndexByte(mant, '.'); k >= 0 {
		intPart, frac = mant[:k], mant[k+1:]
	}
	digits := strings.TrimLeft(intPart+frac, "0")
	if digits == "" {
		// Zero: only the scale matters.
		if scale := int64(len(frac)) - exp; scale > numericMaxFracDigits {
			return fmt.Sprintf("number %.40s… has more than %d digits after the decimal point", n, numericMaxFracDigits)
		}
		return ""
	}
	// weight: digits before the decimal point once the exponent is applied.
	weight := int64(len(strings.TrimLeft(intPart, "0"))) + exp
	if strings.TrimLeft(intPart, "0") == "" {
		weight = exp - int64(len(frac)-len(strings.TrimLeft(frac, "0")))
	}
	if weight > numericMaxIntDigits {
		return fmt.Sprintf("number %.40s… has more than %d digits before the decimal point", n, numericMaxIntDigits)
	}
	if scale := int64(len(frac)) - exp; scale > numericMaxFracDigits {
		return fmt.Sprintf("number %.40s… has more than %d digits after the decimal point", n, numericMaxFracDigits)
	}
	return ""
}

// checkHeader refuses a metadata name or value that the headers column or a transport cannot
// carry faithfully: invalid UTF-8 (the JSON headers column cannot hold it), NUL (PostgreSQL text
// cannot hold it), and CR or LF (an HTTP header cannot carry them, RFC 9110 §5.5, so a webhook
// could never deliver the event; no other transport needs them either). The forwarder's
// metadata codec per transport is documented in package forwarder.
func checkHeader(s string) string {
	switch {
	case !utf8.ValidString(s):
		return "not valid UTF-8"
	case strings.IndexByte(s, 0) >= 0:
		return "contains a NUL character"
	case strings.ContainsAny(s, "\r\n"):
		return "contains CR or LF, which an HTTP header cannot carry"
	}
	return ""
}

// watermillUUIDHeader is the metadata name Watermill's Kafka, Redis Streams and AMQP marshalers
// use for the message UUID; the Kafka and Redis ones refuse a message whose metadata has it.
const watermillUUIDHeader = "_watermill_message_uuid"

// checkHeaderName is checkHeader for a metadata name, which also must not be the name
// Watermill's marshalers reserve for the message UUID (the event id travels there).
func checkHeaderName(s string) string {
	if s == watermillUUIDHeader {
		return "reserved by Watermill's marshalers for the message UUID (the event id)"
	}
	return checkHeader(s)
}
