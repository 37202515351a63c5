package webhook

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// Defaults applied to zero-valued Config fields.
const (
	// DefaultTimeout bounds each HTTP attempt (connect, send, response headers and the bounded
	// body read) when Config.Timeout is 0.
	DefaultTimeout = 10 * time.Second
	// DefaultContentType is sent when Config.ContentType is empty.
	DefaultContentType = "application/json"
	// DefaultMaxResponseBodyBytes is how much of a response body is read (for DeliveryError.Body
	// and Result.Body) when Config.MaxResponseBodyBytes is 0: enough for RecordLimit runes.
	DefaultMaxResponseBodyBytes = 16 << 10
	// DefaultUserAgent is sent unless a header layer sets User-Agent.
	DefaultUserAgent = "watermill-outbox-webhook"
)

// Target is where one message goes, as returned by Config.Target.
type Target struct {
	// URL is the absolute http or https URL to POST to. Required.
	URL string
	// Secret signs the request (see SignatureScheme). Empty means: use Config.Secret or
	// Config.Secrets; if those are empty too, the seed scheme sends no signature and the
	// Standard Webhooks scheme fails the message. Setting it (or Secrets) while Config.Secret
	// or Config.Secrets is also set fails the message with ErrSecretConflict; an invalid
	// secret (see Config.Secret) fails it permanently with a *ConfigError.
	Secret string
	// Secrets are this target's active secrets during a rotation, as Config.Secrets; set
	// either Secret or Secrets.
	Secrets []string
	// Headers are added to the request; they override Config.Headers and are overridden by the
	// message metadata. Names and values are validated like metadata.
	Headers map[string]string
}

// Config configures a Publisher. The zero value of every field except URL/Target means the
// documented default; invalid values are reported by Validate as a *ConfigError, never clamped.
type Config struct {
	// URL is the fixed destination, an absolute http or https URL. Exactly one of URL and
	// Target must be set. A literal IP host is checked by the built-in guard at construction.
	URL string

	// Secret is the signing secret (see Scheme); empty (and no Secrets) means unsigned requests
	// with the seed scheme and is a *ConfigError with SchemeStandardWebhooks and a fixed URL.
	// With SchemeStandardWebhooks it must be "whsec_" followed by the standard base64 of 24 to
	// 64 bytes (see DecodeSecret); with the seed scheme it must be at least MinSeedSecretBytes
	// (16) bytes long. Anything else is a *ConfigError wrapping ErrInvalidSecret. With Target
	// set it is the secret for every target that returns none; a Target that also returns a
	// secret fails that message (ErrSecretConflict).
	Secret string

	// Secrets are several active secrets, for a key rotation with SchemeStandardWebhooks: every
	// request carries one signature per secret, in this order, as space-separated "v1,<sig>"
	// entries of the webhook-signature header, so a receiver holding any one of the keys
	// verifies it (VerifyStandard). Rotate by adding the new secret, moving receivers to it,
	// then removing the old one. Each entry is checked like Secret. Set either Secret or
	// Secrets (both is a *ConfigError). The seed scheme sends one signature: more than one
	// entry is a *ConfigError there (its receivers accept several keys instead, see
	// VerifyOptions.Keys).
	Secrets []string

	// Target, when set, chooses the destination of each message. It is called once per message
	// and attempt, must be safe for concurrent use, and its error fails the message (wrapped
	// in a *DeliveryError). Exactly one of URL and Target must be set.
	Target func(topic string, msg *message.Message) (Target, error)

	// Headers are added to every request. Precedence, lowest first: DefaultUserAgent, Headers,
	// Target.Headers, message metadata; the publisher's own headers (Content-Type, event id,
	// topic, signature headers) always win, and Config.Headers may not name them. Hop-by-hop
	// and framing headers (Connection, Host, Content-Length, Transfer-Encoding, …) are a
	// *ConfigError here and skipped when they come from a target or metadata.
	Headers map[string]string

	// ContentType is the Content-Type of every request; empty means DefaultContentType
	// ("application/json"). The payload bytes are always sent unchanged.
	ContentType string

	// Scheme picks the signature scheme; the zero value is SchemeHMACSHA256.
	Scheme SignatureScheme

	// SignatureHeader names the seed scheme's header; empty means DefaultSignatureHeader
	// ("Outbox-Signature"). Must be empty with SchemeStandardWebhooks.
	SignatureHeader string

	// Timeout bounds each attempt (one HTTP request, from dialing to reading the bounded
	// response body); the attempt's context is derived from msg.Context(), so an earlier
	// deadline or a cancellation there also ends it. Zero means DefaultTimeout (10s);
	// negative is a *ConfigError.
	Timeout time.Duration

	// MaxResponseBodyBytes is how many bytes of a response body are read and kept; the rest
	// is drained up to a fixed bound (so the connection can be reused) and discarded. Zero
	// means DefaultMaxResponseBodyBytes (16 KiB); negative is a *ConfigError.
	MaxResponseBodyBytes int64

	// URLGuard, when set, is called before every request with the destination URL and the
	// attempt's context; a non-nil error refuses the message (ErrURLDenied, wrapping the
	// guard's error). It runs in addition to the built-in guard, never instead of it, and must
	// be safe for concurrent use.
	URLGuard func(ctx context.Context, u *url.URL) error

	// AllowedPrefixes lets the built-in guard accept addresses it would refuse, e.g.
	// 10.20.0.0/16 for receivers on a private network, or 127.0.0.0/8 in tests. See CheckIP.
	// Empty (the default) means only globally reachable addresses are dialed.
	AllowedPrefixes []netip.Prefix

	// LookupIP resolves host names before dialing; every address it returns is checked by the
	// built-in guard at connect time (net.Dialer.Control), and tried in order, each with its
	// share of the attempt's Timeout (at least 2s, as net.Dialer shares a deadline among a
	// name's addresses), so a dead first address does not use up the attempt. Nil means
	// net.DefaultResolver.LookupNetIP(ctx, "ip", host). Tests set it to map a name to a
	// loopback address without DNS. Must be safe for concurrent use.
	LookupIP func(ctx context.Context, host string) ([]netip.Addr, error)

	// Proxy selects an HTTP proxy per request, as http.Transport.Proxy. Nil (the default)
	// means no proxy, environment variables included, so the dial-time guard sees the real
	// destination. With a proxy the dial-time guard checks the proxy's address instead (list
	// it in AllowedPrefixes if it is private); the destination is then checked only by
	// CheckURL's literal-IP rule and URLGuard, and the proxy must enforce its own egress policy.
	Proxy func(*http.Request) (*url.URL, error)

	// Now is the clock for Standard Webhooks timestamps and Result.Attempt; nil means time.Now.
	// Durations are measured with the monotonic clock regardless.
	Now func() time.Time

	// PermanentStatuses lists the HTTP statuses that mean the receiver will never accept the
	// message as it is (for example 400, 410, 413, 422 for a receiver that says so): such an
	// answer makes DeliveryError.Permanent true and the relay dead-letters the event at its
	// first attempt instead of retrying it. Default empty: every non-2xx answer other than
	// 429, 502, 503 and 504 (unavailable, see DeliveryError.Unavailable) is an ordinary failure,
	// retried with backoff up to MaxAttempts. Each status must be 300–599 and not one of
	// 429, 502, 503, 504; otherwise it is a *ConfigError.
	PermanentStatuses []int

	// OnResult, when set, is called once per message attempt, successful or not, after the
	// attempt ends and before Publish moves on. See Result for the context it gets. It must be
	// safe for concurrent use and should be quick: it delays Publish.
	OnResult func(ctx context.Context, r Result)
}

func (c *Config) setDefaults() {
	if c.ContentType == "" {
		c.ContentType = DefaultContentType
	}
	if c.Scheme == SchemeHMACSHA256 && c.SignatureHeader == "" {
		c.SignatureHeader = DefaultSignatureHeader
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	if c.MaxResponseBodyBytes == 0 {
		c.MaxResponseBodyBytes = DefaultMaxResponseBodyBytes
	}
	if c.LookupIP == nil {
		c.LookupIP = defaultLookup
	}
	if c.Now == nil {
		c.Now = time.Now
	}
}

// Validate reports the first invalid field as a *ConfigError, after applying defaults to a
// copy of c (c itself is not changed). NewPublisher calls it.
func (c Config) Validate() error {
	c.setDefaults()
	_, err := c.validate()
	return err
}

// validate checks a defaulted config and returns the parsed fixed URL (nil with Target).
func (c *Config) validate() (*url.URL, error) {
	if c.Scheme != SchemeHMACSHA256 && c.Scheme != SchemeStandardWebhooks {
		return nil, &ConfigError{Field: "Scheme", Reason: "unknown signature scheme " + c.Scheme.String()}
	}
	if c.Scheme == SchemeStandardWebhooks && c.SignatureHeader != "" {
		return nil, &ConfigError{Field: "SignatureHeader", Reason: "only used by SchemeHMACSHA256; Standard Webhooks header names are fixed"}
	}
	if c.Timeout < 0 {
		return nil, &ConfigError{Field: "Timeout", Reason: "must not be negative (0 means 10s)"}
	}
	if c.MaxResponseBodyBytes < 0 {
		return nil, &ConfigError{Field: "MaxResponseBodyBytes", Reason: "must not be negative (0 means 16 KiB)"}
	}
	for i, code := range c.PermanentStatuses {
		switch {
		case code < 300 || code > 599:
			return nil, &ConfigError{Field: fmt.Sprintf("PermanentStatuses[%d]", i), Reason: fmt.Sprintf("%d is not a 3xx, 4xx or 5xx status", code)}
		case unavailableStatus(code):
			return nil, &ConfigError{Field: fmt.Sprintf("PermanentStatuses[%d]", i), Reason: fmt.Sprintf("%d means the receiver is unavailable, not that the message is refused", code)}
		}
	}
	for i, p := range c.AllowedPrefixes {
		if !p.IsValid() {
			return nil, &ConfigError{Field: fmt.Sprintf("AllowedPrefixes[%d]", i), Reason: "invalid prefix"}
		}
	}
	if p := headerValueProblem(c.ContentType); p != "" {
		return nil, &ConfigError{Field: "ContentType", Reason: p, Err: ErrInvalidHeader}
	}
	reserved := c.reservedHeaders()
	if c.Scheme == SchemeHMACSHA256 {
		ck := http.CanonicalHeaderKey(c.SignatureHeader)
		if !validHeaderName(c.SignatureHeader) {
			return nil, &ConfigError{Field: "SignatureHeader", Reason: "not a valid header name", Err: ErrInvalidHeader}
		}
		if transportHeaders[ck] || ck == "Content-Type" || ck == HeaderEventID || ck == HeaderTopic {
			return nil, &ConfigError{Field: "SignatureHeader", Reason: "collides with a header the publisher or transport sets"}
		}
	}
	for _, name := range slices.Sorted(maps.Keys(c.Headers)) {
		v := c.Headers[name]
		field := "Headers[" + name + "]"
		if err := checkHeader("config", name, v); err != nil {
			return nil, &ConfigError{Field: field, Reason: "invalid header", Err: err}
		}
		ck := http.CanonicalHeaderKey(name)
		if transportHeaders[ck] {
			return nil, &ConfigError{Field: field, Reason: "hop-by-hop or framing header is set by the transport"}
		}
		if reserved[ck] {
			return nil, &ConfigError{Field: field, Reason: "header is set by the publisher (use ContentType / SignatureHeader)"}
		}
	}
	switch {
	case c.URL != "" && c.Target != nil:
		return nil, &ConfigError{Field: "URL", Reason: "set either URL or Target, not both"}
	case c.URL == "" && c.Target == nil:
		return nil, &ConfigError{Field: "URL", Reason: "required when Target is nil"}
	}
	if _, err := signingKeys(c.Scheme, "Secret", c.Secret, c.Secrets); err != nil {
		return nil, err
	}
	if c.Target != nil {
		return nil, nil
	}
	if c.Scheme == SchemeStandardWebhooks && c.Secret == "" && len(c.Secrets) == 0 {
		return nil, &ConfigError{Field: "Secret", Reason: "required with SchemeStandardWebhooks", Err: ErrInvalidSecret}
	}
	u, err := parseTargetURL(c.URL)
	if err != nil {
		return nil, &ConfigError{Field: "URL", Reason: "invalid URL", Err: err}
	}
	if err := CheckURL(u, c.AllowedPrefixes); err != nil {
		return nil, &ConfigError{Field: "URL", Reason: "refused by the built-in guard", Err: err}
	}
	return u, nil
}

// reservedHeaders are the canonical names the publisher sets on every request.
func (c *Config) reservedHeaders() map[string]bool {
	r := map[string]bool{
		"Content-Type": true,
		HeaderEventID:  true,
		HeaderTopic:    true,
	}
	if c.Scheme == SchemeStandardWebhooks {
		r[HeaderWebhookID] = true
		r[HeaderWebhookTimestamp] = true
		r[HeaderWebhookSignature] = true
	} else {
		r[http.CanonicalHeaderKey(c.SignatureHeader)] = true
	}
	return r
}

// parseTargetURL parses an absolute http(s) URL with a host.
func parseTargetURL(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, err
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("webhook: URL scheme %q is not http or https", u.Scheme)
	}
	if u.Hostname() == "" {
		return nil, errors.New("webhook: URL has no host")
	}
	return u, nil
}
