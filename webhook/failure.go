package webhook

import (
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/internal/netfail"
)

// unavailableStatus reports whether an HTTP status says the receiver cannot serve at all right
// now: 429 Too Many Requests (RFC 6585 §4), 502 Bad Gateway, 503 Service Unavailable, 504
// Gateway Timeout (RFC 9110 §15.6).
func unavailableStatus(code int) bool {
	switch code {
	case http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true
	}
	return false
}

// unreachable reports whether a transport error says that no connection could be made to the
// receiver (refused, DNS, host unreachable, connect timeout). Publisher.attempt also counts any
// failure before a connection was made (a dial ended by the attempt's deadline, which net/http
// reports as the bare context error, or a TLS handshake). A refusal by the address guard
// (ErrURLDenied) is not: it is the configuration's answer, not an outage.
func unreachable(err error) bool {
	return !errors.Is(err, ErrURLDenied) && netfail.Unreachable(err)
}

// parseRetryAfter reads a Retry-After header (RFC 9110 §10.2.3): delay-seconds or an
// HTTP-date, relative to now. A missing, malformed or past value is 0.
func parseRetryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if s, err := strconv.ParseInt(v, 10, 64); err == nil {
		if s <= 0 {
			return 0
		}
		if s > int64(time.Duration(1<<63-1)/time.Second) {
			return time.Duration(1<<63 - 1)
		}
		return time.Duration(s) * time.Second
	}
	t, err := http.ParseTime(v)
	if err != nil || !t.After(now) {
		return 0
	}
	return t.Sub(now)
}

// classified returns what Publish returns for derr: derr inside an *outbox.PermanentError when
// it is Permanent, inside an *outbox.UnavailableError (Destination "webhook <host>",
// RetryAfter from derr) when it is Unavailable, otherwise derr itself. errors.As finds the
// *DeliveryError in every case.
func classified(derr *DeliveryError) error {
	switch {
	case derr.Permanent:
		return &outbox.PermanentError{Err: derr}
	case derr.Unavailable:
		dest := "webhook"
		if u, err := url.Parse(derr.URL); err == nil && u.Host != "" {
			dest += " " + u.Host
		}
		return &outbox.UnavailableError{Destination: dest, RetryAfter: derr.RetryAfter, Err: derr}
	}
	return derr
}
