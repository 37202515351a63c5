package outbox

import (
	stdjson "encoding/json"
	"fmt"
	"math/big"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
	jsonv1 "github.com/go-json-experiment/json/v1"
)

// encodeOptions are the explicit payload rules on top of JSON v2 semantics
// (github.com/go-json-experiment/json): times as RFC 3339 (default), durations as seconds (a
// number, exact to the nanosecond), IP networks and decimals as exact text, bytes as base64
// (default), UUIDs/IPs/addresses as text (their MarshalText); invalid UTF-8, NaN, ±Inf,
// channels, functions and complex numbers are errors. Nil slices and maps are null, as in
// encoding/json, and map keys are sorted.
var encodeOptions = json.JoinOptions(
	json.Deterministic(true),
	json.FormatNilSliceAsNull(true),
	json.FormatNilMapAsNull(true),
	// omitempty as encoding/json defines it (false, 0, "", nil, empty slices and maps), so
	// struct tags written for encoding/json keep their meaning.
	jsonv1.OmitEmptyWithLegacySemantics(true),
	json.WithMarshalers(json.JoinMarshalers(
		// encoding/json.Number is a number (its exact digits), as encoding/json writes it.
		json.MarshalToFunc(func(enc *jsontext.Encoder, n stdjson.Number) error {
			if n == "" {
				return enc.WriteValue(jsontext.Value("0"))
			}
			if c := n[0]; c != '-' && (c < '0' || c > '9') {
				return fmt.Errorf("json: invalid number literal %q", string(n))
			}
			return enc.WriteValue(jsontext.Value(n))
		}),
		json.MarshalToFunc(func(enc *jsontext.Encoder, d time.Duration) error {
			return enc.WriteValue(jsontext.Value(durationSeconds(d)))
		}),
		json.MarshalToFunc(func(enc *jsontext.Encoder, n *net.IPNet) error {
			if n == nil {
				return enc.WriteToken(jsontext.Null)
			}
			return enc.WriteToken(jsontext.String(n.String()))
		}),
		json.MarshalToFunc(func(enc *jsontext.Encoder, n net.IPNet) error {
			return enc.WriteToken(jsontext.String(n.String()))
		}),
		json.MarshalToFunc(func(enc *jsontext.Encoder, f *big.Float) error {
			if f == nil {
				return enc.WriteToken(jsontext.Null)
			}
			if f.IsInf() {
				return fmt.Errorf("cannot encode infinite big.Float")
			}
			// A binary float has a finite exact decimal expansion; 'g' with precision -1 gives
			// the shortest text that reads back to the same value.
			return enc.WriteToken(jsontext.String(f.Text('g', -1)))
		}),
		json.MarshalToFunc(func(enc *jsontext.Encoder, r *big.Rat) error {
			if r == nil {
				return enc.WriteToken(jsontext.Null)
			}
			return enc.WriteToken(jsontext.String(r.RatString()))
		}),
	)),
)

// durationSeconds renders d as an exact decimal number of seconds ("1.5", "-0.000000001").
func durationSeconds(d time.Duration) string {
	neg := d < 0
	u := uint64(d)
	if neg {
		u = -u
	}
	s := strconv.FormatUint(u/uint64(time.Second), 10)
	if frac := u % uint64(time.Second); frac != 0 {
		s += "." + strings.TrimRight(fmt.Sprintf("%09d", frac), "0")
	}
	if neg {
		s = "-" + s
	}
	return s
}

// EncodePayload encodes v as a JSON payload with the package's explicit rules: times
// as RFC 3339 strings; time.Duration as a number of seconds (exact); *net.IPNet, *big.Float and
// *big.Rat as exact text; net.IP, netip.Addr, netip.Prefix and uuid.UUID as text (their
// MarshalText); []byte as base64; big.Int as a number; types with MarshalJSON or MarshalText use
// them; map keys sorted; an encoding/json Number as the number it holds; struct tags as
// encoding/json reads them (omitempty omits false, 0, "", nil and empty slices and maps). A
// json.RawMessage or jsontext.Value is taken as it is (after the same validation). NaN, ±Inf, invalid UTF-8, channels, functions, complex numbers and anything else
// that has no JSON form are errors, never a silent fmt.Sprint. The result passes
// ValidatePayload or an error is returned. Safe for concurrent use.
func EncodePayload(v any) ([]byte, error) {
	b, err := json.Marshal(v, encodeOptions)
	if err != nil {
		return nil, err
	}
	if reason := ValidatePayload(b); reason != "" {
		return nil, fmt.Errorf("%s", reason)
	}
	return b, nil
}
