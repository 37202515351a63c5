package webhook

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// testPayload proves the body is not re-encoded: HTML characters, a literal JSON escape,
// non-ASCII text, U+2028, and numbers no float64 can hold.
const testPayload = `{"html":"<b>a & b</b> \u003c","name":"Zoë — 日本語 😀` + "\u2028" + `","big":123456789012345678901234567890,"exp":1.0e400,"neg":-0.0}`

// Test secrets: a seed-scheme secret of MinSeedSecretBytes or more, and a Standard Webhooks
// secret of 24 key bytes (the spec's example length).
const (
	testSeedSecret     = "seed-secret-0123456789"
	testStandardSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
)

// loopbackOnly lets the built-in guard reach httptest servers; nothing else is allowed.
var loopbackOnly = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}

// request is one request as a test server saw it.
type request struct {
	Method string
	Path   string
	Header http.Header
	Body   []byte
}

// receiver is a test HTTP server that records every request and answers with a fixed status.
type receiver struct {
	srv   *httptest.Server
	conns atomic.Int64 // new TCP connections accepted

	mu       sync.Mutex
	requests []request
}

// newReceiver starts a loopback server answering status with body and extra headers.
func newReceiver(t *testing.T, status int, body string, header http.Header) *receiver {
	t.Helper()
	r := &receiver{}
	r.start(t, http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.record(req)
		for k, v := range header {
			w.Header()[k] = v
		}
		w.WriteHeader(status)
		io.WriteString(w, body)
	}))
	return r
}

// newReceiverFunc starts a loopback server that records each request, then runs h.
func newReceiverFunc(t *testing.T, h http.HandlerFunc) *receiver {
	t.Helper()
	r := &receiver{}
	r.start(t, http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.record(req)
		h(w, req)
	}))
	return r
}

func (r *receiver) start(t *testing.T, h http.Handler) {
	r.srv = httptest.NewUnstartedServer(h)
	r.srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			r.conns.Add(1)
		}
	}
	r.srv.Start()
	t.Cleanup(r.srv.Close)
}

func (r *receiver) record(req *http.Request) {
	body, err := io.ReadAll(req.Body)
	if err != nil {
		panic(err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.requests = append(r.requests, request{Method: req.Method, Path: req.URL.Path, Header: req.Header.Clone(), Body: body})
}

func (r *receiver) URL() string { return r.srv.URL }

func (r *receiver) Requests() []request {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]request(nil), r.requests...)
}

func (r *receiver) Count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.requests)
}

// newPub builds a publisher that may reach loopback; cfg.AllowedPrefixes is set when empty.
func newPub(t *testing.T, cfg Config) *Publisher {
	t.Helper()
	if cfg.AllowedPrefixes == nil {
		cfg.AllowedPrefixes = loopbackOnly
	}
	p, err := NewPublisher(cfg, nil)
	if err != nil {
		t.Fatalf("NewPublisher: %v", err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func newMsg(id string, payload string, md map[string]string) *message.Message {
	m := message.NewMessage(id, []byte(payload))
	for k, v := range md {
		m.Metadata.Set(k, v)
	}
	return m
}

// asDelivery asserts err is a *DeliveryError and returns it.
func asDelivery(t *testing.T, err error) *DeliveryError {
	t.Helper()
	var de *DeliveryError
	if !errors.As(err, &de) {
		t.Fatalf("error %v (%T) is not a *DeliveryError", err, err)
	}
	return de
}

// fakeClock is a settable clock for Config.Now.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
}

// staticLookup resolves only the names in m and counts lookups; it never touches DNS.
type staticLookup struct {
	m     map[string][]netip.Addr
	calls atomic.Int64
}

func (l *staticLookup) LookupIP(_ context.Context, host string) ([]netip.Addr, error) {
	l.calls.Add(1)
	if a, ok := l.m[host]; ok {
		return a, nil
	}
	return nil, &net.DNSError{Err: "no such host (test resolver)", Name: host, IsNotFound: true}
}

// wait blocks until ch is closed or fails the test after a generous bound (not a sleep: it
// returns as soon as the event happens).
func wait(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
}
