package webhook

import (
	"maps"
	"net/http"
	"slices"
	"unicode/utf8"
)

// validHeaderName reports whether name is a non-empty RFC 9110 §5.6.2 token.
func validHeaderName(name string) bool {
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		if !isTokenChar(name[i]) {
			return false
		}
	}
	return true
}

func isTokenChar(c byte) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		return true
	}
	switch c {
	case '!', '#', '$', '%', '&', '\'', '*', '+', '-', '.', '^', '_', '`', '|', '~':
		return true
	}
	return false
}

// headerValueProblem returns why v cannot be sent as a header value, or "" when it can: no
// control characters other than horizontal tab (RFC 9110 §5.5 — this excludes CR, LF and NUL,
// which would allow header injection), and valid UTF-8.
func headerValueProblem(v string) string {
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c == '\r' || c == '\n' {
			return "value contains CR or LF"
		}
		if (c < 0x20 && c != '\t') || c == 0x7f {
			return "value contains a control character"
		}
	}
	if !utf8.ValidString(v) {
		return "value is not valid UTF-8"
	}
	return ""
}

// checkHeader validates one header and returns a *HeaderError or nil.
func checkHeader(source, name, value string) error {
	if !validHeaderName(name) {
		return &HeaderError{Name: name, Source: source, Reason: "name is not an RFC 9110 token"}
	}
	if p := headerValueProblem(value); p != "" {
		return &HeaderError{Name: name, Source: source, Reason: p}
	}
	return nil
}

// transportHeaders are owned by the HTTP transport or are hop-by-hop (RFC 9110 §7.6.1); they
// are never copied from targets or metadata.
var transportHeaders = map[string]bool{
	"Connection":          true,
	"Content-Length":      true,
	"Host":                true,
	"Keep-Alive":          true,
	"Proxy-Authenticate":  true,
	"Proxy-Authorization": true,
	"Proxy-Connection":    true,
	"Te":                  true,
	"Trailer":             true,
	"Transfer-Encoding":   true,
	"Upgrade":             true,
}

// addHeaders validates hs and sets them on h in sorted key order (so that two keys differing
// only in case resolve the same way every time), overriding what h holds. Transport-owned
// headers are skipped.
func addHeaders(h http.Header, source string, hs map[string]string) error {
	for _, k := range slices.Sorted(maps.Keys(hs)) {
		v := hs[k]
		if err := checkHeader(source, k, v); err != nil {
			return err
		}
		ck := http.CanonicalHeaderKey(k)
		if transportHeaders[ck] {
			continue
		}
		h[ck] = []string{v}
	}
	return nil
}
