package webhook

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

const eventID = "0190b6a8-3f5c-7cc0-8f1e-2a7f0d9c1b11"

func TestPublishSendsPayloadUnchangedWithSeedSignature(t *testing.T) {
	rcv := newReceiver(t, http.StatusNoContent, "", nil)
	secret := testSeedSecret
	p := newPub(t, Config{URL: rcv.URL() + "/hooks/orders", Secret: secret})

	msg := newMsg(eventID, testPayload, map[string]string{"traceparent": "00-abc-def-01", "Outbox-Ordering-Key": "order-7"})
	if err := p.Publish("orders.created", msg); err != nil {
		t.Fatalf("Publish: %v", err)
	}

	reqs := rcv.Requests()
	if len(reqs) != 1 {
		t.Fatalf("server saw %d requests, want 1", len(reqs))
	}
	got := reqs[0]
	if !bytes.Equal(got.Body, []byte(testPayload)) {
		t.Fatalf("body changed in transit:\n got %q\nwant %q", got.Body, testPayload)
	}
	want := map[string]string{
		"Content-Type":        "application/json",
		"Outbox-Event-Id":     eventID,
		"Outbox-Topic":        "orders.created",
		"Traceparent":         "00-abc-def-01",
		"Outbox-Ordering-Key": "order-7",
		"User-Agent":          DefaultUserAgent,
		"Outbox-Signature":    Sign([]byte(secret), []byte(testPayload)),
	}
	for k, v := range want {
		if g := got.Header.Values(k); len(g) != 1 || g[0] != v {
			t.Errorf("header %s = %q, want [%q]", k, g, v)
		}
	}
	if got.Method != http.MethodPost || got.Path != "/hooks/orders" {
		t.Errorf("request %s %s, want POST /hooks/orders", got.Method, got.Path)
	}

	sig := got.Header.Get("Outbox-Signature")
	if err := Verify([]byte(secret), got.Body, sig); err != nil {
		t.Fatalf("Verify on captured bytes: %v", err)
	}
	tampered := bytes.Clone(got.Body)
	tampered[len(tampered)-2] ^= 1
	if err := Verify([]byte(secret), tampered, sig); !errors.Is(err, ErrSignatureMismatch) {
		t.Errorf("tampered body: err = %v, want ErrSignatureMismatch", err)
	}
	if err := Verify([]byte("other"), got.Body, sig); !errors.Is(err, ErrSignatureMismatch) {
		t.Errorf("wrong secret: err = %v, want ErrSignatureMismatch", err)
	}
}

func TestPublishUnsignedWithoutSecretAndCustomHeaderNames(t *testing.T) {
	rcv := newReceiver(t, http.StatusOK, "", nil)
	p := newPub(t, Config{URL: rcv.URL(), ContentType: "application/cloudevents+json"})
	if err := p.Publish("t", newMsg(eventID, `{}`, nil)); err != nil {
		t.Fatal(err)
	}
	h := rcv.Requests()[0].Header
	if v := h.Values("Outbox-Signature"); len(v) != 0 {
		t.Errorf("unsigned request carries Outbox-Signature %q", v)
	}
	if ct := h.Get("Content-Type"); ct != "application/cloudevents+json" {
		t.Errorf("Content-Type = %q", ct)
	}

	rcv2 := newReceiver(t, http.StatusOK, "", nil)
	p2 := newPub(t, Config{URL: rcv2.URL(), Secret: testSeedSecret, SignatureHeader: "X-Hub-Signature-256"})
	if err := p2.Publish("t", newMsg(eventID, `{}`, nil)); err != nil {
		t.Fatal(err)
	}
	h2 := rcv2.Requests()[0].Header
	if err := Verify([]byte(testSeedSecret), []byte(`{}`), h2.Get("X-Hub-Signature-256")); err != nil {
		t.Errorf("custom signature header: %v", err)
	}
	if v := h2.Values("Outbox-Signature"); len(v) != 0 {
		t.Errorf("default signature header also sent: %q", v)
	}
}

func TestPublishStandardWebhooks(t *testing.T) {
	rcv := newReceiver(t, http.StatusOK, "", nil)
	key := []byte("0123456789abcdef0123456789abcdef")
	secret := "whsec_" + base64.StdEncoding.EncodeToString(key)
	t0 := time.Unix(1_800_000_000, 0)
	clock := &fakeClock{now: t0}
	p := newPub(t, Config{URL: rcv.URL(), Secret: secret, Scheme: SchemeStandardWebhooks, Now: clock.Now})

	if err := p.Publish("orders.created", newMsg(eventID, testPayload, nil)); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	got := rcv.Requests()[0]
	if !bytes.Equal(got.Body, []byte(testPayload)) {
		t.Fatalf("body changed in transit")
	}
	if id := got.Header.Get("webhook-id"); id != eventID {
		t.Errorf("webhook-id = %q, want %q", id, eventID)
	}
	if ts := got.Header.Get("webhook-timestamp"); ts != "1800000000" {
		t.Errorf("webhook-timestamp = %q, want 1800000000", ts)
	}
	if sig := got.Header.Get("webhook-signature"); sig != SignStandard(key, eventID, t0, []byte(testPayload)) {
		t.Errorf("webhook-signature = %q", sig)
	}
	if v := got.Header.Values("Outbox-Signature"); len(v) != 0 {
		t.Errorf("seed signature also sent: %q", v)
	}

	keys := [][]byte{key}
	if err := VerifyStandard(keys, got.Header, got.Body, 0, t0); err != nil {
		t.Fatalf("VerifyStandard on captured request: %v", err)
	}
	if err := VerifyStandard(keys, got.Header, got.Body, 0, t0.Add(DefaultTolerance)); err != nil {
		t.Errorf("at the tolerance edge: %v", err)
	}
	if err := VerifyStandard([][]byte{[]byte("old-key"), key}, got.Header, got.Body, 0, t0); err != nil {
		t.Errorf("rotation, new key second: %v", err)
	}

	tampered := bytes.Clone(got.Body)
	tampered[0] = ' '
	cases := []struct {
		name string
		keys [][]byte
		body []byte
		now  time.Time
		want error
	}{
		{"tampered byte", keys, tampered, t0, ErrSignatureMismatch},
		{"wrong secret", [][]byte{[]byte("wrong")}, got.Body, t0, ErrSignatureMismatch},
		{"stale timestamp", keys, got.Body, t0.Add(DefaultTolerance + time.Second), ErrTimestampOutOfTolerance},
		{"future timestamp", keys, got.Body, t0.Add(-DefaultTolerance - time.Second), ErrTimestampOutOfTolerance},
	}
	for _, c := range cases {
		if err := VerifyStandard(c.keys, got.Header, c.body, 0, c.now); !errors.Is(err, c.want) {
			t.Errorf("%s: err = %v, want %v", c.name, err, c.want)
		}
	}
}

func TestStandardWebhooksFreshTimestampPerAttempt(t *testing.T) {
	rcv := newReceiver(t, http.StatusOK, "", nil)
	key, err := DecodeSecret(testStandardSecret)
	if err != nil {
		t.Fatal(err)
	}
	clock := &fakeClock{}
	p := newPub(t, Config{URL: rcv.URL(), Secret: testStandardSecret, Scheme: SchemeStandardWebhooks, Now: clock.Now})

	t1 := time.Unix(1_800_000_000, 0)
	t2 := t1.Add(90 * time.Second)
	msg := newMsg(eventID, `{"n":1}`, nil)
	clock.Set(t1)
	if err := p.Publish("t", msg); err != nil {
		t.Fatal(err)
	}
	clock.Set(t2)
	if err := p.Publish("t", msg); err != nil { // a retry of the same event
		t.Fatal(err)
	}

	reqs := rcv.Requests()
	if len(reqs) != 2 {
		t.Fatalf("got %d requests, want 2", len(reqs))
	}
	for i, want := range []time.Time{t1, t2} {
		h := reqs[i].Header
		if ts := h.Get("webhook-timestamp"); ts != strconv.FormatInt(want.Unix(), 10) {
			t.Errorf("attempt %d: webhook-timestamp = %q, want %d", i+1, ts, want.Unix())
		}
		if id := h.Get("webhook-id"); id != eventID {
			t.Errorf("attempt %d: webhook-id = %q, want the event id", i+1, id)
		}
		if err := VerifyStandard([][]byte{key}, h, reqs[i].Body, 0, want); err != nil {
			t.Errorf("attempt %d: %v", i+1, err)
		}
	}
	if reqs[0].Header.Get("webhook-signature") == reqs[1].Header.Get("webhook-signature") {
		t.Error("the retry reused the first attempt's signature")
	}
	// The first attempt, replayed at the time of the second, is already stale.
	if err := VerifyStandard([][]byte{key}, reqs[0].Header, reqs[0].Body, time.Minute, t2); !errors.Is(err, ErrTimestampOutOfTolerance) {
		t.Errorf("replayed first attempt: err = %v, want ErrTimestampOutOfTolerance", err)
	}
}

func TestPublishNon2xxIsDeliveryError(t *testing.T) {
	for _, status := range []int{301, 302, 303, 307, 308, 400, 404, 410, 429, 500, 502, 503} {
		t.Run(strconv.Itoa(status), func(t *testing.T) {
			elsewhere := newReceiver(t, http.StatusOK, "", nil)
			location := elsewhere.URL() + "/moved"
			rcv := newReceiver(t, status, "nope: <b>"+strconv.Itoa(status)+"</b>", http.Header{"Location": {location}})
			p := newPub(t, Config{URL: rcv.URL(), Secret: testSeedSecret})

			err := p.Publish("orders", newMsg(eventID, `{"a":1}`, nil))
			de := asDelivery(t, err)
			if !errors.Is(err, ErrUnexpectedStatus) {
				t.Errorf("errors.Is(err, ErrUnexpectedStatus) = false; err = %v", err)
			}
			if de.StatusCode != status {
				t.Errorf("StatusCode = %d, want %d", de.StatusCode, status)
			}
			wantLoc := ""
			if status >= 300 && status < 400 {
				wantLoc = location
			}
			if de.Location != wantLoc {
				t.Errorf("Location = %q, want %q", de.Location, wantLoc)
			}
			if want := "nope: <b>" + strconv.Itoa(status) + "</b>"; de.Body != want {
				t.Errorf("Body = %q, want %q", de.Body, want)
			}
			if de.Index != 0 || de.EventID != eventID || de.Topic != "orders" || de.URL != rcv.URL() || de.Permanent {
				t.Errorf("DeliveryError = %+v", de)
			}
			if n := rcv.Count(); n != 1 {
				t.Errorf("receiver saw %d requests, want exactly 1", n)
			}
			if n := elsewhere.Count(); n != 0 {
				t.Errorf("redirect target saw %d requests, want 0 (redirects are never followed)", n)
			}
		})
	}
}

func TestPublishTimeout(t *testing.T) {
	release := make(chan struct{})
	entered := make(chan struct{}, 1)
	rcv := newReceiverFunc(t, func(w http.ResponseWriter, r *http.Request) {
		entered <- struct{}{}
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	t.Cleanup(func() { close(release) }) // runs before the server's Close (LIFO)
	p := newPub(t, Config{URL: rcv.URL(), Timeout: 200 * time.Millisecond})

	start := time.Now()
	err := p.Publish("t", newMsg(eventID, `{}`, nil))
	elapsed := time.Since(start)
	de := asDelivery(t, err)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("errors.Is(err, context.DeadlineExceeded) = false; err = %v", err)
	}
	if de.StatusCode != 0 || de.Permanent {
		t.Errorf("DeliveryError = %+v", de)
	}
	if elapsed > 5*time.Second {
		t.Errorf("Publish took %v with a 200ms timeout", elapsed)
	}
	wait(t, entered, "the request to reach the handler")
	if n := rcv.Count(); n != 1 {
		t.Errorf("receiver saw %d requests, want exactly 1", n)
	}
}

func TestPublishHonoursMessageContext(t *testing.T) {
	rcv := newReceiver(t, http.StatusOK, "", nil)
	p := newPub(t, Config{URL: rcv.URL()})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	msg := newMsg(eventID, `{}`, nil)
	msg.SetContext(ctx)
	err := p.Publish("t", msg)
	asDelivery(t, err)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("err = %v, want context.Canceled", err)
	}
	if n := rcv.conns.Load(); n != 0 {
		t.Errorf("receiver saw %d connections, want 0", n)
	}
}

func TestPublishStopsAtFirstFailure(t *testing.T) {
	rcv := newReceiverFunc(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(HeaderEventID) == "bad" {
			w.WriteHeader(http.StatusInternalServerError)
		}
	})
	p := newPub(t, Config{URL: rcv.URL()})
	err := p.Publish("t", newMsg("m0", `0`, nil), newMsg("bad", `1`, nil), newMsg("m2", `2`, nil))
	de := asDelivery(t, err)
	if de.Index != 1 || de.EventID != "bad" || de.StatusCode != 500 {
		t.Errorf("DeliveryError = %+v, want message 1 (bad) with status 500", de)
	}
	var ids []string
	for _, r := range rcv.Requests() {
		ids = append(ids, r.Header.Get(HeaderEventID))
	}
	if strings.Join(ids, ",") != "m0,bad" {
		t.Errorf("delivered %v, want [m0 bad]", ids)
	}
}

func TestHeaderPrecedence(t *testing.T) {
	rcv := newReceiver(t, http.StatusOK, "", nil)
	p := newPub(t, Config{
		Headers: map[string]string{"X-A": "config", "X-B": "config", "X-C": "config", "User-Agent": "config-agent"},
		Target: func(topic string, msg *message.Message) (Target, error) {
			return Target{URL: rcv.URL(), Headers: map[string]string{
				"x-b": "target", "X-C": "target",
				"Connection": "close", "Host": "evil.example", // transport-owned: skipped
			}}, nil
		},
		Secret: testSeedSecret,
	})
	msg := newMsg(eventID, `{}`, map[string]string{
		"x-c":              "event",
		"outbox-event-id":  "spoofed-id", // publisher's own headers win
		"Outbox-Topic":     "spoofed-topic",
		"Outbox-Signature": "sha256=spoofed",
		"Content-Type":     "text/plain",
	})
	if err := p.Publish("real-topic", msg); err != nil {
		t.Fatal(err)
	}
	h := rcv.Requests()[0].Header
	want := map[string]string{
		"X-A":              "config",
		"X-B":              "target",
		"X-C":              "event",
		"User-Agent":       "config-agent",
		"Outbox-Event-Id":  eventID,
		"Outbox-Topic":     "real-topic",
		"Content-Type":     "application/json",
		"Outbox-Signature": Sign([]byte(testSeedSecret), []byte(`{}`)),
	}
	for k, v := range want {
		if g := h.Values(k); len(g) != 1 || g[0] != v {
			t.Errorf("header %s = %q, want [%q]", k, g, v)
		}
	}
	if v := h.Values("Connection"); len(v) != 0 {
		t.Errorf("Connection header forwarded from target: %q", v)
	}
}

func TestInvalidHeadersAreRefusedBeforeSending(t *testing.T) {
	cases := []struct {
		name     string
		md       map[string]string
		target   map[string]string
		id       string
		topic    string
		wantName string
	}{
		{name: "CRLF in metadata value", md: map[string]string{"X-Trace": "a\r\nX-Injected: 1"}, wantName: "X-Trace"},
		{name: "LF in metadata value", md: map[string]string{"X-Trace": "a\nb"}, wantName: "X-Trace"},
		{name: "CR in metadata name", md: map[string]string{"X-Trace\r": "a"}, wantName: "X-Trace\r"},
		{name: "space in metadata name", md: map[string]string{"X Trace": "a"}, wantName: "X Trace"},
		{name: "colon in metadata name", md: map[string]string{"X-A: b": "a"}, wantName: "X-A: b"},
		{name: "empty metadata name", md: map[string]string{"": "a"}, wantName: ""},
		{name: "NUL in metadata value", md: map[string]string{"X-Trace": "a\x00b"}, wantName: "X-Trace"},
		{name: "invalid UTF-8 in metadata value", md: map[string]string{"X-Trace": "caf\xe9"}, wantName: "X-Trace"},
		{name: "CRLF in target header", target: map[string]string{"X-Tenant": "t\r\nHost: x"}, wantName: "X-Tenant"},
		{name: "LF in event id", id: "abc\nX-Evil: 1", wantName: HeaderEventID},
		{name: "CR in topic", topic: "orders\r", wantName: HeaderTopic},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rcv := newReceiver(t, http.StatusOK, "", nil)
			var results []Result
			p := newPub(t, Config{
				Target: func(string, *message.Message) (Target, error) {
					return Target{URL: rcv.URL(), Headers: c.target}, nil
				},
				OnResult: func(_ context.Context, r Result) { results = append(results, r) },
			})
			id, topic := eventID, "t"
			if c.id != "" {
				id = c.id
			}
			if c.topic != "" {
				topic = c.topic
			}
			err := p.Publish(topic, newMsg(id, `{}`, c.md))
			de := asDelivery(t, err)
			if !errors.Is(err, ErrInvalidHeader) {
				t.Fatalf("err = %v, want ErrInvalidHeader", err)
			}
			var he *HeaderError
			if !errors.As(err, &he) || he.Name != c.wantName {
				t.Errorf("HeaderError = %+v, want name %q", he, c.wantName)
			}
			if !de.Permanent {
				t.Error("an invalid header must be a permanent failure")
			}
			if n := rcv.conns.Load(); n != 0 {
				t.Errorf("receiver saw %d connections, want 0", n)
			}
			if len(results) != 1 || results[0].Err == "" || results[0].StatusCode != 0 {
				t.Errorf("results = %+v, want one failed attempt", results)
			}
		})
	}
}

func TestSecretInConfigAndTargetIsConfigError(t *testing.T) {
	rcv := newReceiver(t, http.StatusOK, "", nil)
	p := newPub(t, Config{
		Secret: testSeedSecret,
		Target: func(string, *message.Message) (Target, error) {
			return Target{URL: rcv.URL(), Secret: "target-secret-0123456789"}, nil
		},
	})
	err := p.Publish("t", newMsg(eventID, `{}`, nil))
	de := asDelivery(t, err)
	var ce *ConfigError
	if !errors.As(err, &ce) || ce.Field != "Target.Secret" {
		t.Fatalf("err = %v, want *ConfigError for Target.Secret", err)
	}
	if !errors.Is(err, ErrSecretConflict) || !de.Permanent {
		t.Errorf("err = %v (permanent %v), want permanent ErrSecretConflict", err, de.Permanent)
	}
	if n := rcv.conns.Load(); n != 0 {
		t.Errorf("receiver saw %d connections, want 0", n)
	}
}

func TestTargetRoutesAndSignsPerMessage(t *testing.T) {
	a := newReceiver(t, http.StatusOK, "", nil)
	b := newReceiver(t, http.StatusAccepted, "", nil)
	p := newPub(t, Config{
		Target: func(topic string, msg *message.Message) (Target, error) {
			switch topic {
			case "a":
				return Target{URL: a.URL(), Secret: "secret-a-0123456789", Headers: map[string]string{"X-Dest": "a"}}, nil
			case "b":
				return Target{URL: b.URL(), Secret: "secret-b-0123456789"}, nil
			}
			return Target{}, errors.New("no route")
		},
	})
	if err := p.Publish("a", newMsg("1", `"a"`, nil)); err != nil {
		t.Fatal(err)
	}
	if err := p.Publish("b", newMsg("2", `"b"`, nil)); err != nil {
		t.Fatal(err)
	}
	ra, rb := a.Requests(), b.Requests()
	if len(ra) != 1 || len(rb) != 1 {
		t.Fatalf("requests a=%d b=%d, want 1 each", len(ra), len(rb))
	}
	if err := Verify([]byte("secret-a-0123456789"), ra[0].Body, ra[0].Header.Get("Outbox-Signature")); err != nil || ra[0].Header.Get("X-Dest") != "a" {
		t.Errorf("a: verify %v, X-Dest %q", err, ra[0].Header.Get("X-Dest"))
	}
	if err := Verify([]byte("secret-b-0123456789"), rb[0].Body, rb[0].Header.Get("Outbox-Signature")); err != nil {
		t.Errorf("b: %v", err)
	}

	err := p.Publish("c", newMsg("3", `"c"`, nil))
	de := asDelivery(t, err)
	if de.Permanent || de.URL != "" || de.EventID != "3" {
		t.Errorf("target error: %+v", de)
	}

	p2 := newPub(t, Config{Target: func(string, *message.Message) (Target, error) {
		return Target{URL: "ftp://example.com/x"}, nil
	}})
	err = p2.Publish("t", newMsg("4", `{}`, nil))
	var ce *ConfigError
	if !errors.As(err, &ce) || ce.Field != "Target.URL" || !asDelivery(t, err).Permanent {
		t.Errorf("bad target URL: err = %v", err)
	}
}

func TestMissingEventIDIsPermanent(t *testing.T) {
	rcv := newReceiver(t, http.StatusOK, "", nil)
	p := newPub(t, Config{URL: rcv.URL()})
	err := p.Publish("t", newMsg("", `{}`, nil))
	if !errors.Is(err, ErrMissingEventID) || !asDelivery(t, err).Permanent {
		t.Errorf("err = %v, want permanent ErrMissingEventID", err)
	}
	if n := rcv.conns.Load(); n != 0 {
		t.Errorf("receiver saw %d connections, want 0", n)
	}
}

func TestCloseIsIdempotentAndRefusesPublish(t *testing.T) {
	rcv := newReceiver(t, http.StatusOK, "", nil)
	p := newPub(t, Config{URL: rcv.URL()})
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := p.Publish("t", newMsg(eventID, `{}`, nil)); !errors.Is(err, ErrPublisherClosed) {
		t.Errorf("Publish after Close: %v, want ErrPublisherClosed", err)
	}
	if n := rcv.Count(); n != 0 {
		t.Errorf("receiver saw %d requests", n)
	}
}

func TestCloseCancelsInFlightAndWaits(t *testing.T) {
	entered := make(chan struct{})
	release := make(chan struct{})
	rcv := newReceiverFunc(t, func(w http.ResponseWriter, r *http.Request) {
		close(entered)
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	t.Cleanup(func() { close(release) })
	// OnResult runs inside Publish, after the attempt ends and before Publish returns, so it
	// tells whether the in-flight Publish had finished when Close returned. (The goroutine's
	// send on published happens after Publish returns and cannot tell that without racing.)
	attemptEnded := make(chan Result, 1)
	p := newPub(t, Config{URL: rcv.URL(), Timeout: time.Minute,
		OnResult: func(_ context.Context, r Result) { attemptEnded <- r }})

	published := make(chan error, 1)
	go func() { published <- p.Publish("t", newMsg(eventID, `{}`, nil)) }()
	wait(t, entered, "the request to reach the handler")
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-attemptEnded:
		if r.EventID != eventID || r.Err == "" {
			t.Errorf("attempt result = %+v, want a failed attempt of %s", r, eventID)
		}
	default:
		t.Fatal("Close returned before the in-flight Publish did")
	}
	select {
	case err := <-published:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("in-flight Publish: %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("in-flight Publish did not return")
	}
}

func TestConcurrentPublish(t *testing.T) {
	rcv := newReceiver(t, http.StatusOK, "", nil)
	p := newPub(t, Config{URL: rcv.URL(), Secret: testSeedSecret})
	const workers, each = 8, 10
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				body := fmt.Sprintf(`{"w":%d,"i":%d}`, w, i)
				if err := p.Publish("t", newMsg(fmt.Sprintf("%d-%d", w, i), body, nil)); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	reqs := rcv.Requests()
	if len(reqs) != workers*each {
		t.Fatalf("got %d requests, want %d", len(reqs), workers*each)
	}
	for _, r := range reqs {
		if err := Verify([]byte(testSeedSecret), r.Body, r.Header.Get("Outbox-Signature")); err != nil {
			t.Errorf("%s: %v", r.Header.Get(HeaderEventID), err)
		}
	}
}

func TestOnResultRecordsEachAttempt(t *testing.T) {
	long := strings.Repeat("é", 5000) + "\x00tail"
	rcv := newReceiverFunc(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(HeaderEventID) == "fail" {
			w.WriteHeader(http.StatusBadGateway)
			fmt.Fprint(w, "bad\x00gateway")
			return
		}
		if r.Header.Get(HeaderEventID) == "long" {
			w.WriteHeader(http.StatusInternalServerError)
			fmt.Fprint(w, long)
			return
		}
		fmt.Fprint(w, "ok")
	})
	var mu sync.Mutex
	var results []Result
	at := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	p := newPub(t, Config{
		URL: rcv.URL(),
		Now: func() time.Time { return at },
		OnResult: func(ctx context.Context, r Result) {
			if ctx.Err() != nil {
				t.Errorf("OnResult context already done: %v", ctx.Err())
			}
			mu.Lock()
			results = append(results, r)
			mu.Unlock()
		},
	})
	if err := p.Publish("t", newMsg("good", `{}`, nil)); err != nil {
		t.Fatal(err)
	}
	_ = p.Publish("t", newMsg("fail", `{}`, nil))
	_ = p.Publish("t", newMsg("long", `{}`, nil))

	if len(results) != 3 {
		t.Fatalf("got %d results, want 3", len(results))
	}
	good, fail, lng := results[0], results[1], results[2]
	if !good.OK() || good.StatusCode != 200 || good.Body != "ok" || good.Err != "" || good.EventID != "good" ||
		good.Topic != "t" || good.URL != rcv.URL() || !good.Attempt.Equal(at) || good.Duration <= 0 {
		t.Errorf("success result = %+v", good)
	}
	if fail.OK() || fail.StatusCode != 502 || fail.Body != "bad\uFFFDgateway" || fail.Err == "" {
		t.Errorf("failure result = %+v", fail)
	}
	if n := len([]rune(lng.Body)); n != RecordLimit {
		t.Errorf("long body kept %d runes, want %d", n, RecordLimit)
	}
	if lng.Body != strings.Repeat("é", RecordLimit) {
		t.Error("long body is not the first 4000 characters")
	}
	if n := len([]rune(lng.Err)); n > RecordLimit {
		t.Errorf("error text has %d runes, more than %d", n, RecordLimit)
	}
}
