package webhook

import (
	"context"
	"errors"
	"net/netip"
	"net/url"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
)

func TestConfigValidate(t *testing.T) {
	target := func(string, *message.Message) (Target, error) { return Target{}, nil }
	const u = "https://hooks.example.com/x"
	cases := []struct {
		name    string
		cfg     Config
		field   string
		wantErr error
	}{
		{"neither URL nor Target", Config{}, "URL", nil},
		{"both URL and Target", Config{URL: u, Target: target}, "URL", nil},
		{"relative URL", Config{URL: "/hook"}, "URL", nil},
		{"ftp URL", Config{URL: "ftp://example.com/"}, "URL", nil},
		{"unparsable URL", Config{URL: "http://[::1"}, "URL", nil},
		{"loopback URL", Config{URL: "http://127.0.0.1:8080/"}, "URL", ErrURLDenied},
		{"metadata URL", Config{URL: "http://169.254.169.254/latest"}, "URL", ErrURLDenied},
		{"decimal loopback URL", Config{URL: "http://2130706433/"}, "URL", ErrURLDenied},
		{"negative timeout", Config{URL: u, Timeout: -1}, "Timeout", nil},
		{"negative body limit", Config{URL: u, MaxResponseBodyBytes: -1}, "MaxResponseBodyBytes", nil},
		{"unknown scheme", Config{URL: u, Scheme: 9}, "Scheme", nil},
		{"standard without secret", Config{URL: u, Scheme: SchemeStandardWebhooks}, "Secret", ErrInvalidSecret},
		{"standard with bad whsec", Config{URL: u, Scheme: SchemeStandardWebhooks, Secret: "whsec_***"}, "Secret", ErrInvalidSecret},
		{"signature header with standard", Config{URL: u, Scheme: SchemeStandardWebhooks, Secret: "k", SignatureHeader: "X-Sig"}, "SignatureHeader", nil},
		{"signature header not a token", Config{URL: u, SignatureHeader: "X Sig"}, "SignatureHeader", ErrInvalidHeader},
		{"signature header collides", Config{URL: u, SignatureHeader: "content-type"}, "SignatureHeader", nil},
		{"header with CRLF", Config{URL: u, Headers: map[string]string{"X-A": "a\r\nB: c"}}, "Headers[X-A]", ErrInvalidHeader},
		{"header name invalid", Config{URL: u, Headers: map[string]string{"X A": "a"}}, "Headers[X A]", ErrInvalidHeader},
		{"header reserved", Config{URL: u, Headers: map[string]string{"outbox-signature": "x"}}, "Headers[outbox-signature]", nil},
		{"header content-type", Config{URL: u, Headers: map[string]string{"Content-Type": "text/plain"}}, "Headers[Content-Type]", nil},
		{"header hop-by-hop", Config{URL: u, Headers: map[string]string{"Connection": "close"}}, "Headers[Connection]", nil},
		{"standard reserved header", Config{URL: u, Scheme: SchemeStandardWebhooks, Secret: "k", Headers: map[string]string{"webhook-timestamp": "1"}}, "Headers[webhook-timestamp]", nil},
		{"content type with LF", Config{URL: u, ContentType: "application/json\n"}, "ContentType", ErrInvalidHeader},
		{"invalid allowed prefix", Config{URL: u, AllowedPrefixes: []netip.Prefix{{}}}, "AllowedPrefixes[0]", nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.cfg.Validate()
			var ce *ConfigError
			if !errors.As(err, &ce) || ce.Field != c.field {
				t.Fatalf("Validate() = %v, want *ConfigError for %s", err, c.field)
			}
			if c.wantErr != nil && !errors.Is(err, c.wantErr) {
				t.Errorf("Validate() = %v, want it to wrap %v", err, c.wantErr)
			}
			if _, err := NewPublisher(c.cfg, nil); !errors.As(err, &ce) {
				t.Errorf("NewPublisher accepted an invalid config: %v", err)
			}
		})
	}

	valid := []Config{
		{URL: u},
		{URL: u, Secret: testSeedSecret, Headers: map[string]string{"X-Tenant": "7", "Authorization": "Bearer t"}},
		{URL: u, Scheme: SchemeStandardWebhooks, Secret: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"},
		{Target: target},
		{Target: target, Secret: testStandardSecret, Scheme: SchemeStandardWebhooks},
		{URL: "http://10.20.0.5/h", AllowedPrefixes: []netip.Prefix{netip.MustParsePrefix("10.20.0.0/16")}},
		{URL: u, URLGuard: func(context.Context, *url.URL) error { return nil }},
	}
	for i, cfg := range valid {
		if err := cfg.Validate(); err != nil {
			t.Errorf("valid config %d: %v", i, err)
		}
	}
}

func TestValidateDoesNotChangeConfig(t *testing.T) {
	cfg := Config{URL: "https://example.com/"}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	if cfg.Timeout != 0 || cfg.ContentType != "" || cfg.SignatureHeader != "" || cfg.Now != nil {
		t.Errorf("Validate changed the caller's config: %+v", cfg)
	}
}
