package webhook

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// SignatureScheme selects how the publisher signs requests and how VerifyMiddleware checks
// them. The zero value is SchemeHMACSHA256.
type SignatureScheme int

const (
	// SchemeHMACSHA256 is the seed scheme: one header (default "Outbox-Signature", see
	// Config.SignatureHeader) with the value "sha256=" followed by the lowercase hex HMAC-SHA256
	// (RFC 2104) of the exact body bytes, keyed with the secret's bytes (at least
	// MinSeedSecretBytes of them). It carries no
	// timestamp, so it does not protect against replay; receivers drop repeats by event id.
	SchemeHMACSHA256 SignatureScheme = iota

	// SchemeStandardWebhooks follows the Standard Webhooks spec
	// (https://www.standardwebhooks.com, "Signature scheme"): headers "webhook-id" (the event
	// id), "webhook-timestamp" (Unix seconds, taken fresh for every attempt) and
	// "webhook-signature" with the value "v1," followed by the standard base64 HMAC-SHA256 of
	// "<id>.<timestamp>.<body>" — one space-separated entry per active secret during a
	// rotation. Secrets are written "whsec_<base64 of 24–64 key bytes>" (see DecodeSecret).
	SchemeStandardWebhooks
)

// String returns "hmac-sha256" or "standard-webhooks".
func (s SignatureScheme) String() string {
	switch s {
	case SchemeHMACSHA256:
		return "hmac-sha256"
	case SchemeStandardWebhooks:
		return "standard-webhooks"
	default:
		return "SignatureScheme(" + strconv.Itoa(int(s)) + ")"
	}
}

// Header names of the two schemes.
const (
	// DefaultSignatureHeader is the seed scheme's header when Config.SignatureHeader is empty.
	DefaultSignatureHeader = "Outbox-Signature"
	// HeaderEventID carries the message UUID on every request.
	HeaderEventID = "Outbox-Event-Id"
	// HeaderTopic carries the topic given to Publish on every request.
	HeaderTopic = "Outbox-Topic"
	// HeaderWebhookID is the Standard Webhooks message id header (= the event id).
	HeaderWebhookID = "Webhook-Id"
	// HeaderWebhookTimestamp is the Standard Webhooks timestamp header (Unix seconds).
	HeaderWebhookTimestamp = "Webhook-Timestamp"
	// HeaderWebhookSignature is the Standard Webhooks signature header ("v1,<base64>", several
	// space-separated during rotation).
	HeaderWebhookSignature = "Webhook-Signature"
)

// DefaultTolerance is the Standard Webhooks timestamp tolerance used when none is given: a
// request is accepted only if its timestamp is within 5 minutes of the receiver's clock, in
// either direction.
const DefaultTolerance = 5 * time.Minute

const (
	seedPrefix     = "sha256="
	standardPrefix = "whsec_"
)

// Sign returns the seed-scheme signature header value for body: "sha256=" followed by the
// lowercase hex HMAC-SHA256 (RFC 2104) of body keyed with secret. Safe for concurrent use.
func Sign(secret, body []byte) string {
	m := hmac.New(sha256.New, secret)
	m.Write(body)
	return seedPrefix + hex.EncodeToString(m.Sum(nil))
}

// SignStandard returns one Standard Webhooks signature, "v1,<standard base64 HMAC-SHA256 of
// id.timestamp.body>", where timestamp is ts in Unix seconds and key is the decoded secret
// (see DecodeSecret). Safe for concurrent use.
func SignStandard(key []byte, id string, ts time.Time, body []byte) string {
	return "v1," + base64.StdEncoding.EncodeToString(standardMAC(key, id, strconv.FormatInt(ts.Unix(), 10), body))
}

func standardMAC(key []byte, id, ts string, body []byte) []byte {
	m := hmac.New(sha256.New, key)
	io.WriteString(m, id)
	io.WriteString(m, ".")
	io.WriteString(m, ts)
	io.WriteString(m, ".")
	m.Write(body)
	return m.Sum(nil)
}

// Verify checks a seed-scheme signature header value ("sha256=<64 hex digits>") against body
// using HMAC-SHA256 (RFC 2104) keyed with secret, comparing in constant time (hmac.Equal).
// It returns nil on a match, ErrSignatureMismatch when the value is well formed but does not
// match, ErrMalformedSignature when the value is not in that shape (fails closed), and
// ErrInvalidSecret for an empty secret. To accept several secrets during a rotation, call it
// once per secret or use VerifyMiddleware. Safe for concurrent use.
func Verify(secret, body []byte, signatureHeader string) error {
	if len(secret) == 0 {
		return fmt.Errorf("%w: empty", ErrInvalidSecret)
	}
	got, err := parseSeedSignature(signatureHeader)
	if err != nil {
		return err
	}
	m := hmac.New(sha256.New, secret)
	m.Write(body)
	if !hmac.Equal(got, m.Sum(nil)) {
		return ErrSignatureMismatch
	}
	return nil
}

func parseSeedSignature(v string) ([]byte, error) {
	enc, ok := strings.CutPrefix(v, seedPrefix)
	if !ok || len(enc) != hex.EncodedLen(sha256.Size) {
		return nil, fmt.Errorf("%w: want %q followed by %d hex digits", ErrMalformedSignature, seedPrefix, hex.EncodedLen(sha256.Size))
	}
	got, err := hex.DecodeString(enc)
	if err != nil {
		return nil, fmt.Errorf("%w: signature is not hex", ErrMalformedSignature)
	}
	return got, nil
}

// VerifyStandard checks a request signed per the Standard Webhooks spec: exactly one
// webhook-id (non-empty), webhook-timestamp (Unix seconds, decimal digits only) and
// webhook-signature header (space-separated "version,signature" entries). It returns nil when
// some "v1" entry equals the HMAC-SHA256 of "id.timestamp.body" under one of keys (raw key
// bytes, see DecodeSecret; several keys accepted during a rotation), compared in constant time
// with hmac.Equal; entries of other versions are ignored.
//
// The timestamp must lie within tolerance of now, in either direction; tolerance 0 means
// DefaultTolerance (5 minutes), a negative tolerance is a *ConfigError; a zero now means
// time.Now(). Errors, failing closed on anything unexpected: ErrMalformedSignature (missing,
// repeated or misshapen header, a v1 entry that is not base64, no v1 entry), ErrTimestampOutOfTolerance,
// ErrSignatureMismatch, ErrInvalidSecret (no keys, or an empty key). Safe for concurrent use.
func VerifyStandard(keys [][]byte, header http.Header, body []byte, tolerance time.Duration, now time.Time) error {
	if tolerance < 0 {
		return &ConfigError{Field: "tolerance", Reason: "must not be negative (0 means 5 minutes)"}
	}
	if tolerance == 0 {
		tolerance = DefaultTolerance
	}
	if now.IsZero() {
		now = time.Now()
	}
	if len(keys) == 0 {
		return fmt.Errorf("%w: no keys", ErrInvalidSecret)
	}
	for _, k := range keys {
		if len(k) == 0 {
			return fmt.Errorf("%w: empty key", ErrInvalidSecret)
		}
	}
	id, err := singleHeader(header, HeaderWebhookID)
	if err != nil {
		return err
	}
	tsText, err := singleHeader(header, HeaderWebhookTimestamp)
	if err != nil {
		return err
	}
	sigText, err := singleHeader(header, HeaderWebhookSignature)
	if err != nil {
		return err
	}
	ts, err := parseUnixSeconds(tsText)
	if err != nil {
		return err
	}
	if d := now.Sub(ts); d > tolerance || d < -tolerance {
		return fmt.Errorf("%w: timestamp %s is %s from now (tolerance %s)", ErrTimestampOutOfTolerance, tsText, d.Round(time.Second), tolerance)
	}
	var candidates [][]byte
	for _, entry := range strings.Fields(sigText) {
		version, sig, ok := strings.Cut(entry, ",")
		if !ok || version == "" || sig == "" {
			return fmt.Errorf("%w: signature entry is not \"version,signature\"", ErrMalformedSignature)
		}
		if version != "v1" {
			continue
		}
		raw, err := base64.StdEncoding.Strict().DecodeString(sig)
		if err != nil {
			return fmt.Errorf("%w: v1 signature is not standard base64", ErrMalformedSignature)
		}
		// A wrong-length entry cannot match (hmac.Equal compares lengths too); like the
		// reference implementations we let the other entries decide.
		candidates = append(candidates, raw)
	}
	if len(candidates) == 0 {
		return fmt.Errorf("%w: no v1 signature", ErrMalformedSignature)
	}
	matched := false
	for _, k := range keys {
		want := standardMAC(k, id, tsText, body)
		for _, c := range candidates {
			// No early exit: the work done does not depend on which key matched.
			if hmac.Equal(c, want) {
				matched = true
			}
		}
	}
	if !matched {
		return ErrSignatureMismatch
	}
	return nil
}

func singleHeader(h http.Header, name string) (string, error) {
	vals := h.Values(name)
	switch {
	case len(vals) == 0 || vals[0] == "":
		return "", fmt.Errorf("%w: missing %s header", ErrMalformedSignature, name)
	case len(vals) > 1:
		return "", fmt.Errorf("%w: repeated %s header", ErrMalformedSignature, name)
	}
	return vals[0], nil
}

func parseUnixSeconds(s string) (time.Time, error) {
	if len(s) > 12 {
		return time.Time{}, fmt.Errorf("%w: timestamp too long", ErrMalformedSignature)
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return time.Time{}, fmt.Errorf("%w: timestamp is not decimal Unix seconds", ErrMalformedSignature)
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("%w: timestamp is not decimal Unix seconds", ErrMalformedSignature)
	}
	return time.Unix(n, 0), nil
}

// DefaultMaxBodyBytes is VerifyMiddleware's body limit when VerifyOptions.MaxBodyBytes is 0.
const DefaultMaxBodyBytes = 1 << 20

// VerifyOptions configures VerifyMiddleware. The zero value is not usable: Keys is required.
type VerifyOptions struct {
	// Scheme selects the signature scheme to check; zero value SchemeHMACSHA256.
	Scheme SignatureScheme
	// Keys are the accepted secrets as raw key bytes (decode "whsec_" secrets with
	// DecodeSecret). A request signed with any of them passes, so list the old and the new
	// secret during a rotation. Required; empty keys are refused.
	Keys [][]byte
	// SignatureHeader is the seed scheme's header name; empty means DefaultSignatureHeader.
	// Must be empty with SchemeStandardWebhooks.
	SignatureHeader string
	// MaxBodyBytes bounds the body read for verification; a longer body is answered 413.
	// Zero means DefaultMaxBodyBytes (1 MiB); negative is a *ConfigError.
	MaxBodyBytes int64
	// Tolerance is the Standard Webhooks timestamp tolerance in either direction; zero means
	// DefaultTolerance (5 minutes); negative is a *ConfigError. Must be 0 with the seed scheme,
	// which has no timestamp.
	Tolerance time.Duration
	// Now is the receiver's clock for the timestamp check; nil means time.Now.
	Now func() time.Time
	// OnReject, when set, is called with each rejected request and the reason (errors above),
	// before the 401/413/400 answer is written — for logging. It must be safe for concurrent use.
	OnReject func(r *http.Request, err error)
}

func (o *VerifyOptions) validate() error {
	if o.Scheme != SchemeHMACSHA256 && o.Scheme != SchemeStandardWebhooks {
		return &ConfigError{Field: "Scheme", Reason: "unknown signature scheme " + o.Scheme.String()}
	}
	if len(o.Keys) == 0 {
		return &ConfigError{Field: "Keys", Reason: "at least one key is required", Err: ErrInvalidSecret}
	}
	for i, k := range o.Keys {
		if len(k) == 0 {
			return &ConfigError{Field: fmt.Sprintf("Keys[%d]", i), Reason: "empty key", Err: ErrInvalidSecret}
		}
	}
	if o.Scheme == SchemeStandardWebhooks && o.SignatureHeader != "" {
		return &ConfigError{Field: "SignatureHeader", Reason: "only used by SchemeHMACSHA256; Standard Webhooks header names are fixed"}
	}
	if o.SignatureHeader != "" && !validHeaderName(o.SignatureHeader) {
		return &ConfigError{Field: "SignatureHeader", Reason: "not a valid header name", Err: ErrInvalidHeader}
	}
	if o.MaxBodyBytes < 0 {
		return &ConfigError{Field: "MaxBodyBytes", Reason: "must not be negative (0 means 1 MiB)"}
	}
	if o.Tolerance < 0 {
		return &ConfigError{Field: "Tolerance", Reason: "must not be negative (0 means 5 minutes)"}
	}
	if o.Scheme == SchemeHMACSHA256 && o.Tolerance != 0 {
		return &ConfigError{Field: "Tolerance", Reason: "only used by SchemeStandardWebhooks; the seed scheme has no timestamp"}
	}
	return nil
}

// VerifyMiddleware returns a handler that authenticates webhook requests before next sees
// them. It reads the body (at most opts.MaxBodyBytes), verifies the signature with Verify
// (each key in turn) or VerifyStandard, then restores the body — next reads the same bytes —
// and calls next. A request that fails verification is answered 401 Unauthorized, a body over
// the limit 413 Request Entity Too Large, an unreadable body 400 Bad Request; next is not
// called and the reason is given only to opts.OnReject, never to the client. Invalid options
// yield a *ConfigError. The returned handler is safe for concurrent use.
func VerifyMiddleware(next http.Handler, opts VerifyOptions) (http.Handler, error) {
	if next == nil {
		return nil, &ConfigError{Field: "next", Reason: "handler is nil"}
	}
	if err := opts.validate(); err != nil {
		return nil, err
	}
	keys := make([][]byte, len(opts.Keys))
	for i, k := range opts.Keys {
		keys[i] = bytes.Clone(k)
	}
	header := opts.SignatureHeader
	if header == "" {
		header = DefaultSignatureHeader
	}
	limit := opts.MaxBodyBytes
	if limit == 0 {
		limit = DefaultMaxBodyBytes
	}
	now := opts.Now
	if now == nil {
		now = time.Now
	}
	reject := func(w http.ResponseWriter, r *http.Request, status int, err error) {
		if opts.OnReject != nil {
			opts.OnReject(r, err)
		}
		http.Error(w, http.StatusText(status), status)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
		if err != nil {
			if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
				reject(w, r, http.StatusRequestEntityTooLarge, fmt.Errorf("%w: limit %d bytes", ErrBodyTooLarge, limit))
				return
			}
			reject(w, r, http.StatusBadRequest, fmt.Errorf("webhook: read request body: %w", err))
			return
		}
		if opts.Scheme == SchemeStandardWebhooks {
			err = VerifyStandard(keys, r.Header, body, opts.Tolerance, now())
		} else {
			err = verifySeedAny(keys, body, r.Header.Values(header))
		}
		if err != nil {
			reject(w, r, http.StatusUnauthorized, err)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.ContentLength = int64(len(body))
		next.ServeHTTP(w, r)
	}), nil
}

// verifySeedAny accepts exactly one header value and any of keys.
func verifySeedAny(keys [][]byte, body []byte, values []string) error {
	switch len(values) {
	case 0:
		return fmt.Errorf("%w: missing signature header", ErrMalformedSignature)
	case 1:
	default:
		return fmt.Errorf("%w: repeated signature header", ErrMalformedSignature)
	}
	var result error = ErrSignatureMismatch
	for _, k := range keys {
		err := Verify(k, body, values[0])
		if err == nil {
			result = nil
		} else if !errors.Is(err, ErrSignatureMismatch) {
			return err
		}
	}
	return result
}
