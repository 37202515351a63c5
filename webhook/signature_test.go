package webhook

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// RFC 4231 test case 2 (HMAC-SHA256 as defined by RFC 2104).
func TestSignRFC4231Vector(t *testing.T) {
	got := Sign([]byte("Jefe"), []byte("what do ya want for nothing?"))
	want := "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
	if got != want {
		t.Fatalf("Sign = %s, want %s", got, want)
	}
	if err := Verify([]byte("Jefe"), []byte("what do ya want for nothing?"), strings.ToUpper(want[:7])+want[7:]); !errors.Is(err, ErrMalformedSignature) {
		t.Errorf("upper-case scheme prefix: %v, want ErrMalformedSignature", err)
	}
}

// The published Standard Webhooks test vector: a receiver library must accept what we send.
func TestSignStandardReferenceVector(t *testing.T) {
	key, err := DecodeSecret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
	if err != nil {
		t.Fatal(err)
	}
	ts := time.Unix(1614265330, 0)
	body := []byte(`{"test": 2432232314}`)
	const want = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
	if got := SignStandard(key, "msg_p5jXN8AQM9LWM0D4loKWxJek", ts, body); got != want {
		t.Fatalf("SignStandard = %s, want %s", got, want)
	}
	h := http.Header{}
	h.Set("webhook-id", "msg_p5jXN8AQM9LWM0D4loKWxJek")
	h.Set("webhook-timestamp", "1614265330")
	h.Set("webhook-signature", "v1,bm9wZQ== v2,whatever "+want) // other entries are ignored
	if err := VerifyStandard([][]byte{key}, h, body, 0, ts); err != nil {
		t.Errorf("VerifyStandard(reference vector) = %v", err)
	}
}

func TestVerifyRejectsMalformed(t *testing.T) {
	secret := []byte("k")
	body := []byte(`{"a":1}`)
	good := Sign(secret, body)
	cases := map[string]struct {
		header string
		want   error
	}{
		"empty":            {"", ErrMalformedSignature},
		"no prefix":        {good[len("sha256="):], ErrMalformedSignature},
		"other algorithm":  {"sha1=" + good[len("sha256="):], ErrMalformedSignature},
		"prefix only":      {"sha256=", ErrMalformedSignature},
		"short":            {good[:len(good)-2], ErrMalformedSignature},
		"long":             {good + "00", ErrMalformedSignature},
		"not hex":          {good[:len(good)-1] + "g", ErrMalformedSignature},
		"trailing space":   {good + " ", ErrMalformedSignature},
		"leading space":    {" " + good, ErrMalformedSignature},
		"flipped digit":    {good[:len(good)-1] + flipHex(good[len(good)-1]), ErrSignatureMismatch},
		"other body's sig": {Sign(secret, []byte(`{"a":2}`)), ErrSignatureMismatch},
	}
	for name, c := range cases {
		if err := Verify(secret, body, c.header); !errors.Is(err, c.want) {
			t.Errorf("%s: Verify = %v, want %v", name, err, c.want)
		}
	}
	if err := Verify(nil, body, good); !errors.Is(err, ErrInvalidSecret) {
		t.Errorf("empty secret: %v, want ErrInvalidSecret", err)
	}
	if err := Verify(secret, body, "sha256="+strings.ToUpper(good[7:])); err != nil {
		t.Errorf("upper-case hex digits: %v", err)
	}
}

func flipHex(c byte) string {
	if c == '0' {
		return "1"
	}
	return "0"
}

func TestVerifyStandardRejectsMalformed(t *testing.T) {
	key := []byte("key")
	body := []byte(`{}`)
	now := time.Unix(1_800_000_000, 0)
	sig := SignStandard(key, "evt", now, body)
	base := func() http.Header {
		h := http.Header{}
		h.Set("webhook-id", "evt")
		h.Set("webhook-timestamp", "1800000000")
		h.Set("webhook-signature", sig)
		return h
	}
	if err := VerifyStandard([][]byte{key}, base(), body, 0, now); err != nil {
		t.Fatalf("baseline: %v", err)
	}
	cases := []struct {
		name string
		edit func(http.Header)
		want error
	}{
		{"missing id", func(h http.Header) { h.Del("webhook-id") }, ErrMalformedSignature},
		{"empty id", func(h http.Header) { h.Set("webhook-id", "") }, ErrMalformedSignature},
		{"repeated id", func(h http.Header) { h.Add("webhook-id", "evt") }, ErrMalformedSignature},
		{"missing timestamp", func(h http.Header) { h.Del("webhook-timestamp") }, ErrMalformedSignature},
		{"negative timestamp", func(h http.Header) { h.Set("webhook-timestamp", "-1800000000") }, ErrMalformedSignature},
		{"signed timestamp", func(h http.Header) { h.Set("webhook-timestamp", "+1800000000") }, ErrMalformedSignature},
		{"fractional timestamp", func(h http.Header) { h.Set("webhook-timestamp", "1800000000.5") }, ErrMalformedSignature},
		{"hex timestamp", func(h http.Header) { h.Set("webhook-timestamp", "0x6B49D200") }, ErrMalformedSignature},
		{"huge timestamp", func(h http.Header) { h.Set("webhook-timestamp", "99999999999999999999") }, ErrMalformedSignature},
		{"missing signature", func(h http.Header) { h.Del("webhook-signature") }, ErrMalformedSignature},
		{"repeated signature", func(h http.Header) { h.Add("webhook-signature", sig) }, ErrMalformedSignature},
		{"no comma", func(h http.Header) { h.Set("webhook-signature", "v1"+sig[3:]) }, ErrMalformedSignature},
		{"empty version", func(h http.Header) { h.Set("webhook-signature", sig[2:]) }, ErrMalformedSignature},
		{"not base64", func(h http.Header) { h.Set("webhook-signature", "v1,!!!!") }, ErrMalformedSignature},
		{"no v1 entry", func(h http.Header) { h.Set("webhook-signature", "v1a,"+sig[3:]) }, ErrMalformedSignature},
		{"other id", func(h http.Header) { h.Set("webhook-id", "evt2") }, ErrSignatureMismatch},
		{"other timestamp", func(h http.Header) { h.Set("webhook-timestamp", "1800000001") }, ErrSignatureMismatch},
		{"stale", func(h http.Header) { h.Set("webhook-timestamp", "1799999699") }, ErrTimestampOutOfTolerance},
		{"future", func(h http.Header) { h.Set("webhook-timestamp", "1800000301") }, ErrTimestampOutOfTolerance},
	}
	for _, c := range cases {
		h := base()
		c.edit(h)
		if err := VerifyStandard([][]byte{key}, h, body, 0, now); !errors.Is(err, c.want) {
			t.Errorf("%s: err = %v, want %v", c.name, err, c.want)
		}
	}
	if err := VerifyStandard(nil, base(), body, 0, now); !errors.Is(err, ErrInvalidSecret) {
		t.Errorf("no keys: %v", err)
	}
	if err := VerifyStandard([][]byte{key, {}}, base(), body, 0, now); !errors.Is(err, ErrInvalidSecret) {
		t.Errorf("an empty key: %v", err)
	}
	var ce *ConfigError
	if err := VerifyStandard([][]byte{key}, base(), body, -time.Second, now); !errors.As(err, &ce) {
		t.Errorf("negative tolerance: %v", err)
	}
	// A custom tolerance applies in both directions.
	if err := VerifyStandard([][]byte{key}, base(), body, 10*time.Second, now.Add(11*time.Second)); !errors.Is(err, ErrTimestampOutOfTolerance) {
		t.Errorf("custom tolerance, past: %v", err)
	}
	if err := VerifyStandard([][]byte{key}, base(), body, 10*time.Second, now.Add(-10*time.Second)); err != nil {
		t.Errorf("custom tolerance edge, future: %v", err)
	}
	// Rotation: the sender may list signatures from two keys.
	h := base()
	h.Set("webhook-signature", SignStandard([]byte("old"), "evt", now, body)+" "+sig)
	if err := VerifyStandard([][]byte{key}, h, body, 0, now); err != nil {
		t.Errorf("two signatures, second matches: %v", err)
	}
}

func TestVerifyMiddleware(t *testing.T) {
	var mu sync.Mutex
	var seen [][]byte
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			t.Error(err)
		}
		mu.Lock()
		seen = append(seen, b)
		mu.Unlock()
		w.WriteHeader(http.StatusAccepted)
	})
	var rejections []error
	onReject := func(_ *http.Request, err error) { rejections = append(rejections, err) }

	oldKey, newKey := []byte("old"), []byte("new")
	h, err := VerifyMiddleware(next, VerifyOptions{Keys: [][]byte{oldKey, newKey}, MaxBodyBytes: 64, OnReject: onReject})
	if err != nil {
		t.Fatal(err)
	}
	send := func(h http.Handler, body string, header http.Header) int {
		req := httptest.NewRequest(http.MethodPost, "/hook", strings.NewReader(body))
		for k, v := range header {
			req.Header[k] = v
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Code
	}
	body := `{"x":"<&>"}`
	for _, k := range [][]byte{oldKey, newKey} {
		if code := send(h, body, http.Header{"Outbox-Signature": {Sign(k, []byte(body))}}); code != http.StatusAccepted {
			t.Errorf("signed with %q: status %d, want 202", k, code)
		}
	}
	if len(seen) != 2 || string(seen[0]) != body || string(seen[1]) != body {
		t.Errorf("next saw bodies %q", seen)
	}

	rejected := []struct {
		name   string
		body   string
		header http.Header
		code   int
		want   error
	}{
		{"unknown key", body, http.Header{"Outbox-Signature": {Sign([]byte("other"), []byte(body))}}, 401, ErrSignatureMismatch},
		{"tampered", body + " ", http.Header{"Outbox-Signature": {Sign(newKey, []byte(body))}}, 401, ErrSignatureMismatch},
		{"missing", body, nil, 401, ErrMalformedSignature},
		{"malformed", body, http.Header{"Outbox-Signature": {"sha256=xyz"}}, 401, ErrMalformedSignature},
		{"repeated", body, http.Header{"Outbox-Signature": {Sign(newKey, []byte(body)), Sign(newKey, []byte(body))}}, 401, ErrMalformedSignature},
		{"too large", strings.Repeat("a", 65), http.Header{"Outbox-Signature": {Sign(newKey, bytes.Repeat([]byte("a"), 65))}}, 413, ErrBodyTooLarge},
	}
	for _, c := range rejected {
		rejections = nil
		if code := send(h, c.body, c.header); code != c.code {
			t.Errorf("%s: status %d, want %d", c.name, code, c.code)
		}
		if len(rejections) != 1 || !errors.Is(rejections[0], c.want) {
			t.Errorf("%s: rejections %v, want %v", c.name, rejections, c.want)
		}
	}
	if len(seen) != 2 {
		t.Errorf("next was called for a rejected request (%d calls)", len(seen))
	}

	// Standard Webhooks scheme with an injected clock.
	now := time.Unix(1_800_000_000, 0)
	sh, err := VerifyMiddleware(next, VerifyOptions{Scheme: SchemeStandardWebhooks, Keys: [][]byte{newKey}, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	std := http.Header{
		"Webhook-Id":        {"evt"},
		"Webhook-Timestamp": {"1800000000"},
		"Webhook-Signature": {SignStandard(newKey, "evt", now, []byte(body))},
	}
	if code := send(sh, body, std); code != http.StatusAccepted {
		t.Errorf("standard: status %d", code)
	}
	stale := std.Clone()
	stale.Set("Webhook-Timestamp", "1799999000")
	stale.Set("Webhook-Signature", SignStandard(newKey, "evt", time.Unix(1799999000, 0), []byte(body)))
	if code := send(sh, body, stale); code != http.StatusUnauthorized {
		t.Errorf("standard, stale: status %d, want 401", code)
	}
}

func TestVerifyMiddlewareOptions(t *testing.T) {
	next := http.NotFoundHandler()
	cases := map[string]struct {
		opts  VerifyOptions
		field string
	}{
		"no keys":                {VerifyOptions{}, "Keys"},
		"empty key":              {VerifyOptions{Keys: [][]byte{[]byte("a"), nil}}, "Keys[1]"},
		"unknown scheme":         {VerifyOptions{Keys: [][]byte{[]byte("a")}, Scheme: 7}, "Scheme"},
		"header with standard":   {VerifyOptions{Keys: [][]byte{[]byte("a")}, Scheme: SchemeStandardWebhooks, SignatureHeader: "X"}, "SignatureHeader"},
		"bad header name":        {VerifyOptions{Keys: [][]byte{[]byte("a")}, SignatureHeader: "X Sig"}, "SignatureHeader"},
		"negative body limit":    {VerifyOptions{Keys: [][]byte{[]byte("a")}, MaxBodyBytes: -1}, "MaxBodyBytes"},
		"negative tolerance":     {VerifyOptions{Keys: [][]byte{[]byte("a")}, Scheme: SchemeStandardWebhooks, Tolerance: -1}, "Tolerance"},
		"tolerance on seed":      {VerifyOptions{Keys: [][]byte{[]byte("a")}, Tolerance: time.Minute}, "Tolerance"},
		"nil next (checked 1st)": {VerifyOptions{Keys: [][]byte{[]byte("a")}}, "next"},
	}
	for name, c := range cases {
		n := http.Handler(next)
		if c.field == "next" {
			n = nil
		}
		_, err := VerifyMiddleware(n, c.opts)
		var ce *ConfigError
		if !errors.As(err, &ce) || ce.Field != c.field {
			t.Errorf("%s: err = %v, want *ConfigError for %s", name, err, c.field)
		}
	}
}
