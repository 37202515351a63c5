package webhook

import (
	"errors"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-outbox/outbox"
)

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	cases := []struct {
		in   string
		want time.Duration
	}{
		{"", 0},
		{"120", 120 * time.Second},
		{" 7 ", 7 * time.Second},
		{"0", 0},
		{"-5", 0},
		{"soon", 0},
		{now.Add(30 * time.Second).Format(http.TimeFormat), 30 * time.Second},
		{now.Add(-time.Minute).Format(http.TimeFormat), 0},
	}
	for _, c := range cases {
		if got := parseRetryAfter(c.in, now); got != c.want {
			t.Errorf("parseRetryAfter(%q) = %s, want %s", c.in, got, c.want)
		}
	}
}

func TestPermanentStatusesValidate(t *testing.T) {
	for _, c := range []struct {
		codes []int
		ok    bool
	}{
		{[]int{400, 410, 422}, true},
		{[]int{301}, true},
		{[]int{200}, false},
		{[]int{600}, false},
		{[]int{410, 503}, false},
		{[]int{429}, false},
	} {
		err := Config{URL: "https://example.com/h", PermanentStatuses: c.codes}.Validate()
		var ce *ConfigError
		if c.ok != (err == nil) || (!c.ok && (!errors.As(err, &ce) || !strings.HasPrefix(ce.Field, "PermanentStatuses["))) {
			t.Errorf("PermanentStatuses %v: %v", c.codes, err)
		}
	}
}

// TestFailureClasses: what Publish returns for each kind of answer from a real loopback
// receiver, and for a closed port: unavailable (with Retry-After and the host named),
// permanent, or ordinary; the *DeliveryError is found with errors.As every time.
func TestFailureClasses(t *testing.T) {
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedURL := "http://" + closed.Addr().String() + "/h"
	closed.Close()
	const (
		ordinary    = "ordinary"
		permanent   = "permanent"
		unavailable = "unavailable"
	)
	cases := []struct {
		name       string
		status     int
		header     http.Header
		permanents []int
		meta       map[string]string
		url        string // instead of the receiver's
		guard      bool   // keep the built-in guard's defaults (loopback refused)
		class      string
		retryAfter time.Duration
	}{
		{name: "503 with Retry-After", status: 503, header: http.Header{"Retry-After": {"7"}}, class: unavailable, retryAfter: 7 * time.Second},
		{name: "429", status: 429, class: unavailable},
		{name: "502", status: 502, class: unavailable},
		{name: "504", status: 504, class: unavailable},
		{name: "500", status: 500, class: ordinary},
		{name: "410 listed permanent", status: 410, permanents: []int{410}, class: permanent},
		{name: "410 not listed", status: 410, class: ordinary},
		{name: "connection refused", url: closedURL, class: unavailable},
		{name: "guard refusal", status: 200, guard: true, class: ordinary},
		{name: "header with LF", status: 200, meta: map[string]string{"h": "a\nb"}, class: permanent},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rcv := newReceiver(t, c.status, "no", c.header)
			cfg := Config{URL: rcv.URL() + "/h", PermanentStatuses: c.permanents}
			if c.url != "" {
				cfg.URL = c.url
			}
			var p *Publisher
			if c.guard {
				// Loopback is refused by default; a Target gets past construction.
				url := cfg.URL
				var err error
				p, err = NewPublisher(Config{Target: func(string, *message.Message) (Target, error) { return Target{URL: url}, nil }}, nil)
				if err != nil {
					t.Fatal(err)
				}
				defer p.Close()
			} else {
				p = newPub(t, cfg)
			}
			err := p.Publish("orders", newMsg("ev-1", `{}`, c.meta))
			de := asDelivery(t, err)
			var ue *outbox.UnavailableError
			switch c.class {
			case unavailable:
				wantDest := "webhook " + strings.TrimPrefix(strings.TrimSuffix(cfg.URL, "/h"), "http://")
				if !de.Unavailable || !errors.As(err, &ue) || ue.Destination != wantDest || ue.RetryAfter != c.retryAfter || errors.Is(err, outbox.ErrPermanent) {
					t.Fatalf("%v: want unavailable of %q with Retry-After %s (got %+v)", err, wantDest, c.retryAfter, ue)
				}
			case permanent:
				if !de.Permanent || !errors.Is(err, outbox.ErrPermanent) || errors.Is(err, outbox.ErrUnavailable) {
					t.Fatalf("%v: want permanent", err)
				}
			default:
				if de.Permanent || de.Unavailable || errors.Is(err, outbox.ErrPermanent) || errors.Is(err, outbox.ErrUnavailable) {
					t.Fatalf("%v: want an ordinary failure", err)
				}
			}
		})
	}
}
