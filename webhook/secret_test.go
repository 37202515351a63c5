package webhook

import (
	"bytes"
	"encoding/base64"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// whsec returns a Standard Webhooks secret of n key bytes 0, 1, 2, … and the key.
func whsec(n int) (string, []byte) {
	key := make([]byte, n)
	for i := range key {
		key[i] = byte(i*7 + 1)
	}
	return "whsec_" + base64.StdEncoding.EncodeToString(key), key
}

func TestStandardSecretsAcceptedAndRefused(t *testing.T) {
	s24, k24 := whsec(24)
	s32, k32 := whsec(32)
	s64, k64 := whsec(64)
	s23, _ := whsec(23)
	s65, _ := whsec(65)
	_, k3 := whsec(3)
	cases := []struct {
		name    string
		secret  string
		wantKey []byte // nil: refused
	}{
		{"24 bytes, the spec's minimum", s24, k24},
		{"32 bytes", s32, k32},
		{"64 bytes, the spec's maximum", s64, k64},
		{"the spec's example", testStandardSecret, []byte{0x31, 0xf2, 0x90, 0xf6, 0xbf, 0x06, 0x29, 0x8a, 0xab, 0x4f, 0x08, 0xd4, 0x3c, 0x3f, 0x08, 0x2c, 0xf6, 0x48, 0xa3, 0x62, 0xda, 0x2d, 0xa4, 0xb0}},
		{"empty", "", nil},
		{"prefix only", "whsec_", nil},
		{"3 bytes (whsec_AAAA)", "whsec_AAAA", nil},
		{"3 bytes of another value", "whsec_" + base64.StdEncoding.EncodeToString(k3), nil},
		{"23 bytes", s23, nil},
		{"65 bytes", s65, nil},
		{"no prefix, base64 of 32 bytes", strings.TrimPrefix(s32, "whsec_"), nil},
		{"no prefix, plain text", "a plain secret of enough length", nil},
		{"upper-case prefix", "WHSEC_" + strings.TrimPrefix(s32, "whsec_"), nil},
		{"URL-safe base64", "whsec_" + base64.URLEncoding.EncodeToString(bytes.Repeat([]byte{0xfb, 0xff}, 16)), nil},
		{"unpadded base64", "whsec_" + base64.RawStdEncoding.EncodeToString(k32[:31]), nil},
		{"not base64", "whsec_not base64 at all, really!!", nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			key, err := DecodeSecret(c.secret)
			cfgErr := Config{URL: "https://example.com/hook", Scheme: SchemeStandardWebhooks, Secret: c.secret}.Validate()
			if c.wantKey != nil {
				if err != nil || !bytes.Equal(key, c.wantKey) {
					t.Fatalf("DecodeSecret = %x, %v; want %x", key, err, c.wantKey)
				}
				if cfgErr != nil {
					t.Fatalf("Validate: %v", cfgErr)
				}
				return
			}
			if !errors.Is(err, ErrInvalidSecret) || key != nil {
				t.Fatalf("DecodeSecret = %x, %v; want ErrInvalidSecret", key, err)
			}
			if c.secret != "" && strings.Contains(err.Error(), c.secret) {
				t.Errorf("error %q contains the secret", err)
			}
			var ce *ConfigError
			if !errors.As(cfgErr, &ce) || ce.Field != "Secret" || !errors.Is(cfgErr, ErrInvalidSecret) {
				t.Fatalf("Validate = %v; want *ConfigError for Secret wrapping ErrInvalidSecret", cfgErr)
			}
		})
	}
}

func TestSeedSecretsAcceptedAndRefused(t *testing.T) {
	cases := []struct {
		secret string
		ok     bool
	}{
		{"", true}, // unsigned
		{strings.Repeat("k", MinSeedSecretBytes), true},
		{strings.Repeat("k", 200), true},
		{"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", true}, // used as its bytes, like any text
		{"k", false},
		{"s3cr3t", false},
		{strings.Repeat("k", MinSeedSecretBytes-1), false},
		{"日本語の鍵", false}, // 5 characters, 15 bytes
	}
	for _, c := range cases {
		err := Config{URL: "https://example.com/hook", Secret: c.secret}.Validate()
		if c.ok {
			if err != nil {
				t.Errorf("secret of %d bytes: %v", len(c.secret), err)
			}
			continue
		}
		var ce *ConfigError
		if !errors.As(err, &ce) || ce.Field != "Secret" || !errors.Is(err, ErrInvalidSecret) {
			t.Errorf("secret of %d bytes: Validate = %v; want *ConfigError for Secret wrapping ErrInvalidSecret", len(c.secret), err)
		}
	}
}

func TestSecretsConfigErrors(t *testing.T) {
	s24, _ := whsec(24)
	u := "https://example.com/hook"
	cases := []struct {
		name  string
		cfg   Config
		field string
	}{
		{"Secret and Secrets", Config{URL: u, Scheme: SchemeStandardWebhooks, Secret: s24, Secrets: []string{s24}}, "Secret"},
		{"one bad entry", Config{URL: u, Scheme: SchemeStandardWebhooks, Secrets: []string{s24, "whsec_AAAA"}}, "Secrets[1]"},
		{"seed scheme with two secrets", Config{URL: u, Secrets: []string{testSeedSecret, testSeedSecret + "2"}}, "Secrets"},
		{"short seed secret in Secrets", Config{URL: u, Secrets: []string{"short"}}, "Secrets[0]"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.cfg.Validate()
			var ce *ConfigError
			if !errors.As(err, &ce) || ce.Field != c.field {
				t.Fatalf("Validate = %v; want *ConfigError for %s", err, c.field)
			}
			if _, err := NewPublisher(c.cfg, nil); !errors.As(err, &ce) {
				t.Errorf("NewPublisher accepted it: %v", err)
			}
		})
	}
}

// TestStandardWebhooksRotation signs with an old and a new key at once; a receiver holding
// either key (and only that key) verifies, through VerifyStandard and VerifyMiddleware, and a
// receiver holding another key refuses.
func TestStandardWebhooksRotation(t *testing.T) {
	oldSecret, oldKey := whsec(32)
	newSecret, newKey := whsec(48)
	_, otherKey := whsec(24)
	now := time.Unix(1_800_000_000, 0)
	rcv := newReceiver(t, http.StatusOK, "", nil)
	p := newPub(t, Config{URL: rcv.URL(), Scheme: SchemeStandardWebhooks, Secrets: []string{oldSecret, newSecret}, Now: func() time.Time { return now }})
	if err := p.Publish("orders", newMsg(eventID, testPayload, nil)); err != nil {
		t.Fatal(err)
	}
	reqs := rcv.Requests()
	if len(reqs) != 1 {
		t.Fatalf("got %d requests, want 1", len(reqs))
	}
	got := reqs[0]
	entries := strings.Split(got.Header.Get(HeaderWebhookSignature), " ")
	want := []string{SignStandard(oldKey, eventID, now, []byte(testPayload)), SignStandard(newKey, eventID, now, []byte(testPayload))}
	if len(entries) != 2 || entries[0] != want[0] || entries[1] != want[1] {
		t.Fatalf("webhook-signature entries = %q, want %q", entries, want)
	}
	for name, key := range map[string][]byte{"old key": oldKey, "new key": newKey} {
		if err := VerifyStandard([][]byte{key}, got.Header, got.Body, 0, now); err != nil {
			t.Errorf("receiver with the %s: %v", name, err)
		}
	}
	if err := VerifyStandard([][]byte{otherKey}, got.Header, got.Body, 0, now); !errors.Is(err, ErrSignatureMismatch) {
		t.Errorf("receiver with another key: err = %v, want ErrSignatureMismatch", err)
	}

	// The same through VerifyMiddleware, replaying the recorded request.
	for _, c := range []struct {
		key    []byte
		status int
	}{{oldKey, http.StatusNoContent}, {newKey, http.StatusNoContent}, {otherKey, http.StatusUnauthorized}} {
		h, err := VerifyMiddleware(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) }),
			VerifyOptions{Scheme: SchemeStandardWebhooks, Keys: [][]byte{c.key}, Now: func() time.Time { return now }})
		if err != nil {
			t.Fatal(err)
		}
		req, _ := http.NewRequest(http.MethodPost, "http://127.0.0.1/hook", bytes.NewReader(got.Body))
		req.Header = got.Header.Clone()
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		if w.Code != c.status {
			t.Errorf("middleware with key %x…: status %d, want %d", c.key[:2], w.Code, c.status)
		}
	}
}

// TestTargetSecretsRotation: a Target's own Secrets sign its requests, one entry per secret.
func TestTargetSecretsRotation(t *testing.T) {
	a, ka := whsec(24)
	b, kb := whsec(40)
	now := time.Unix(1_800_000_000, 0)
	rcv := newReceiver(t, http.StatusOK, "", nil)
	p := newPub(t, Config{Scheme: SchemeStandardWebhooks, Now: func() time.Time { return now },
		Target: func(string, *message.Message) (Target, error) {
			return Target{URL: rcv.URL(), Secrets: []string{a, b}}, nil
		}})
	if err := p.Publish("t", newMsg(eventID, `{}`, nil)); err != nil {
		t.Fatal(err)
	}
	got := rcv.Requests()[0]
	if n := len(strings.Fields(got.Header.Get(HeaderWebhookSignature))); n != 2 {
		t.Fatalf("%d signature entries, want 2", n)
	}
	for _, k := range [][]byte{ka, kb} {
		if err := VerifyStandard([][]byte{k}, got.Header, got.Body, 0, now); err != nil {
			t.Error(err)
		}
	}
	// A target with an invalid secret fails its message permanently, before any request.
	p2 := newPub(t, Config{Scheme: SchemeStandardWebhooks,
		Target: func(string, *message.Message) (Target, error) {
			return Target{URL: rcv.URL(), Secrets: []string{a, "whsec_AAAA"}}, nil
		}})
	err := p2.Publish("t", newMsg(eventID, `{}`, nil))
	var ce *ConfigError
	if de := asDelivery(t, err); !de.Permanent || !errors.As(err, &ce) || ce.Field != "Target.Secrets[1]" || !errors.Is(err, ErrInvalidSecret) {
		t.Errorf("err = %v, want a permanent *ConfigError for Target.Secrets[1]", err)
	}
	if n := len(rcv.Requests()); n != 1 {
		t.Errorf("receiver saw %d requests, want 1", n)
	}
}
