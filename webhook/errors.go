package webhook

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"
)

// Sentinel errors. Test for them with errors.Is; the typed errors below carry the details.
var (
	// ErrPublisherClosed is returned by Publish after Close has been called.
	ErrPublisherClosed = errors.New("webhook: publisher closed")

	// ErrInvalidHeader means a header name or value would be unsafe or invalid on the wire:
	// a name that is not an RFC 9110 token, or a value with CR, LF, NUL or another control
	// character (tab excepted), or with invalid UTF-8. It surfaces from Publish inside a
	// permanent *DeliveryError (the request is never sent) wrapping a *HeaderError, and from
	// Config.Validate inside a *ConfigError.
	ErrInvalidHeader = errors.New("webhook: invalid header")

	// ErrURLDenied means a guard refused the destination: Config.URLGuard returned an error
	// (wrapped next to this sentinel), or the built-in address guard refused the address the
	// URL names or resolves to (a *DeniedAddressError, which unwraps to this sentinel). It
	// surfaces from Publish inside a *DeliveryError; the request is never sent. A denial is
	// not permanent: the relay retries it like any other failure.
	ErrURLDenied = errors.New("webhook: destination denied")

	// ErrUnexpectedStatus means the receiver answered with a status outside 200–299, including
	// any 3xx (redirects are never followed). *DeliveryError.StatusCode holds the status.
	ErrUnexpectedStatus = errors.New("webhook: unexpected response status")

	// ErrSecretConflict means a secret was given both in Config.Secret and by the Target
	// function for one message; it is not clear which one the receiver expects. It surfaces
	// inside a *ConfigError (Field "Target.Secret") inside a permanent *DeliveryError.
	ErrSecretConflict = errors.New("webhook: secret set in both Config and Target")

	// ErrMissingEventID means a message has an empty UUID. Every delivery carries the event id
	// so that receivers can drop repeats; the message fails permanently.
	ErrMissingEventID = errors.New("webhook: message has no event id (UUID)")

	// ErrInvalidSecret means a secret is empty where one is required, a Standard Webhooks
	// secret is not "whsec_" + standard base64 of 24–64 bytes (Standard Webhooks spec,
	// "Signature scheme"), or a seed-scheme secret is shorter than MinSeedSecretBytes.
	ErrInvalidSecret = errors.New("webhook: invalid secret")

	// ErrSignatureMismatch means a signature was well formed but no accepted secret produced
	// it. Returned by Verify, VerifyStandard and (as a 401) by VerifyMiddleware.
	ErrSignatureMismatch = errors.New("webhook: signature mismatch")

	// ErrMalformedSignature means a signature header, id or timestamp is missing, repeated or
	// not in the expected shape. Verification fails closed on it.
	ErrMalformedSignature = errors.New("webhook: malformed signature")

	// ErrTimestampOutOfTolerance means a Standard Webhooks timestamp is further from the
	// receiver's clock than the tolerance, in the past (replay) or in the future.
	ErrTimestampOutOfTolerance = errors.New("webhook: timestamp out of tolerance")

	// ErrBodyTooLarge means a request body exceeded VerifyOptions.MaxBodyBytes; VerifyMiddleware
	// answers 413 and passes it to VerifyOptions.OnReject.
	ErrBodyTooLarge = errors.New("webhook: request body too large")
)

// ConfigError reports an invalid configuration value. Field names the Config (or
// VerifyOptions) field, e.g. "Timeout" or "Headers[X-Tenant]"; Reason says what is wrong. Err,
// when not nil, is the underlying cause (e.g. ErrInvalidHeader, ErrSecretConflict, a
// *DeniedAddressError) and is returned by Unwrap.
type ConfigError struct {
	Field  string
	Reason string
	Err    error
}

// Error returns "webhook: config <Field>: <Reason>[: <Err>]".
func (e *ConfigError) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("webhook: config %s: %s: %v", e.Field, e.Reason, e.Err)
	}
	return fmt.Sprintf("webhook: config %s: %s", e.Field, e.Reason)
}

// Unwrap returns the underlying cause, possibly nil.
func (e *ConfigError) Unwrap() error { return e.Err }

// HeaderError names the header that was refused and why. It unwraps to ErrInvalidHeader. The
// value is never included, since headers may carry credentials.
type HeaderError struct {
	// Name is the header name as given (quoted with %q in Error, so control bytes are visible).
	Name string
	// Source is where the header came from: "config", "target" or "metadata".
	Source string
	// Reason says what is wrong with the name or the value.
	Reason string
}

// Error names the header, its source and the problem.
func (e *HeaderError) Error() string {
	return fmt.Sprintf("webhook: invalid header %q from %s: %s", e.Name, e.Source, e.Reason)
}

// Unwrap returns ErrInvalidHeader.
func (e *HeaderError) Unwrap() error { return ErrInvalidHeader }

// DeniedAddressError is the built-in guard's refusal of one IP address (see CheckIP). It
// unwraps to ErrURLDenied.
type DeniedAddressError struct {
	// Addr is the refused address as seen (zone removed, IPv4-mapped form kept).
	Addr netip.Addr
	// Range is the refused range Addr falls in; for IPv6 forms that embed an IPv4 address
	// (IPv4-mapped, NAT64, 6to4) it is the IPv4 range of the embedded address. It is the zero
	// Prefix when no single range applies (an invalid address, or IPv6 outside 2000::/3).
	Range netip.Prefix
	// Reason names the refused range and the rule's source, e.g.
	// "loopback 127.0.0.0/8 (RFC 6890)".
	Reason string
}

// Error names the address and the refused range.
func (e *DeniedAddressError) Error() string {
	return fmt.Sprintf("webhook: destination denied: address %s is %s", e.Addr, e.Reason)
}

// Unwrap returns ErrURLDenied.
func (e *DeniedAddressError) Unwrap() error { return ErrURLDenied }

// DeliveryError describes the failure of one message in Publish. Publish stops at the first
// failing message and returns its *DeliveryError; the messages before it were delivered and
// the ones after it were not attempted. The relay treats the error as a Nack.
type DeliveryError struct {
	// Index is the message's position in the Publish call (0-based).
	Index int
	// EventID is the message UUID.
	EventID string
	// Topic is the topic given to Publish.
	Topic string
	// URL is the destination with any password removed (url.URL.Redacted); empty when the
	// target could not be determined.
	URL string
	// StatusCode is the HTTP status received, 0 when no response arrived (transport error,
	// timeout, refusal before sending).
	StatusCode int
	// Location is the response's Location header, recorded for 3xx answers (never followed).
	Location string
	// Body is the start of the response body, read up to Config.MaxResponseBodyBytes and
	// cleaned with TruncateForRecord.
	Body string
	// Permanent is true when retrying the same message with the same configuration cannot
	// succeed: an invalid header, a missing event id, an invalid target, a secret conflict (the
	// request was not sent), or an answer whose status Config.PermanentStatuses lists. Publish
	// then returns the error inside an *outbox.PermanentError: the relay dead-letters the event
	// at once. Transport errors are never permanent.
	Permanent bool
	// Unavailable is true when the receiver could not be reached at all (connection refused,
	// DNS failure, host unreachable, connect timeout, TLS handshake failure: the attempt ended
	// before a connection was made, so nothing was sent; not a refusal by the address guard,
	// nor a cancellation by Close or the caller's context) or
	// answered 429, 502, 503 or 504. Publish then returns the error inside an
	// *outbox.UnavailableError (Destination "webhook <host>", RetryAfter below): the relay
	// counts no attempt and pauses the destination's topics instead. Any other transport
	// error (a reset or timeout after the request was sent: it may have been processed) or
	// status is an ordinary failure.
	Unavailable bool
	// RetryAfter is the response's Retry-After (delay-seconds or HTTP-date, RFC 9110 §10.2.3)
	// on an Unavailable answer; 0 when absent, malformed or in the past.
	RetryAfter time.Duration
	// Err is the cause: ErrUnexpectedStatus, a transport error (context.DeadlineExceeded for
	// a timeout), a *HeaderError, a *ConfigError, a *DeniedAddressError, ErrURLDenied …
	Err error
}

// Error names the message (its index in the Publish call), the redacted URL, the status (with
// the redirect target for a 3xx), up to 256 characters of the response body, and the cause. It
// is one line. The event id is left out (it is EventID): the relay logs it beside the error.
func (e *DeliveryError) Error() string {
	var b strings.Builder
	b.WriteString("webhook: deliver message ")
	b.WriteString(strconv.Itoa(e.Index))
	if e.URL != "" {
		b.WriteString(" to ")
		b.WriteString(e.URL)
	}
	b.WriteString(": ")
	switch {
	case e.StatusCode >= 300 && e.StatusCode < 400:
		fmt.Fprintf(&b, "status %d, redirect to %q not followed", e.StatusCode, e.Location)
	case e.StatusCode != 0:
		fmt.Fprintf(&b, "status %d", e.StatusCode)
	}
	if e.StatusCode != 0 && e.Body != "" {
		b.WriteString(", body ")
		b.WriteString(strconv.Quote(truncateRunes(e.Body, errorBodyRunes)))
	}
	if e.Err != nil && !(e.StatusCode != 0 && errors.Is(e.Err, ErrUnexpectedStatus)) {
		if e.StatusCode != 0 {
			b.WriteString(": ")
		}
		b.WriteString(e.Err.Error())
	}
	return b.String()
}

// Unwrap returns the cause.
func (e *DeliveryError) Unwrap() error { return e.Err }

// errorBodyRunes bounds how much of a response body DeliveryError.Error repeats.
const errorBodyRunes = 256
