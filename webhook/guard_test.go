package webhook

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
)

// Decision function only: nothing in this file dials a non-loopback address.
func TestCheckIPRefusesSpecialPurposeAddresses(t *testing.T) {
	cases := []struct {
		addr      string
		wantRange string // the refused range reported
	}{
		{"127.0.0.1", "127.0.0.0/8"},
		{"127.255.255.254", "127.0.0.0/8"},
		{"::1", "::1/128"},
		{"::ffff:127.0.0.1", "127.0.0.0/8"},
		{"::ffff:10.1.2.3", "10.0.0.0/8"},
		{"169.254.169.254", "169.254.169.254/32"},
		{"169.254.1.1", "169.254.0.0/16"},
		{"10.0.0.1", "10.0.0.0/8"},
		{"172.16.0.1", "172.16.0.0/12"},
		{"172.31.255.255", "172.16.0.0/12"},
		{"192.168.1.1", "192.168.0.0/16"},
		{"100.64.0.1", "100.64.0.0/10"},
		{"100.127.255.255", "100.64.0.0/10"},
		{"100.100.100.200", "100.100.100.200/32"},
		{"168.63.129.16", "168.63.129.16/32"},
		{"0.0.0.0", "0.0.0.0/8"},
		{"0.1.2.3", "0.0.0.0/8"},
		{"192.0.0.192", "192.0.0.0/24"},
		{"192.0.2.1", "192.0.2.0/24"},
		{"198.18.0.1", "198.18.0.0/15"},
		{"224.0.0.1", "224.0.0.0/4"},
		{"239.255.255.250", "224.0.0.0/4"},
		{"240.0.0.1", "240.0.0.0/4"},
		{"255.255.255.255", "255.255.255.255/32"},
		{"::", "::/128"},
		{"::127.0.0.1", "::/96"},
		{"::10.0.0.1", "::/96"},
		{"fe80::1", "fe80::/10"},
		{"fe80::1%eth0", "fe80::/10"},
		{"fc00::1", "fc00::/7"},
		{"fd12:3456::1", "fc00::/7"},
		{"fd00:ec2::254", "fd00:ec2::254/128"},
		{"fec0::1", "fec0::/10"},
		{"ff02::1", "ff00::/8"},
		{"64:ff9b::7f00:1", "127.0.0.0/8"},
		{"64:ff9b::a9fe:a9fe", "169.254.169.254/32"},
		{"64:ff9b:1::1", "64:ff9b:1::/48"},
		{"2002:7f00:1::1", "127.0.0.0/8"},
		{"2002:c0a8:101::1", "192.168.0.0/16"},
		{"2001::1", "2001::/23"},
		{"2001:db8::1", "2001:db8::/32"},
		{"100::1", "100::/64"},
	}
	for _, c := range cases {
		t.Run(c.addr, func(t *testing.T) {
			ip := netip.MustParseAddr(c.addr)
			err := CheckIP(ip, nil)
			var de *DeniedAddressError
			if !errors.As(err, &de) {
				t.Fatalf("CheckIP(%s) = %v, want *DeniedAddressError", c.addr, err)
			}
			if !errors.Is(err, ErrURLDenied) {
				t.Errorf("errors.Is(err, ErrURLDenied) = false")
			}
			if de.Range != netip.MustParsePrefix(c.wantRange) {
				t.Errorf("Range = %v, want %s (reason %q)", de.Range, c.wantRange, de.Reason)
			}
			if de.Addr != ip.WithZone("") {
				t.Errorf("Addr = %v, want %v", de.Addr, ip.WithZone(""))
			}
		})
	}

	// No single range: IPv6 outside 2000::/3, and the zero Addr.
	for _, ip := range []netip.Addr{netip.MustParseAddr("4000::1"), {}} {
		var de *DeniedAddressError
		if err := CheckIP(ip, nil); !errors.As(err, &de) || de.Range.IsValid() {
			t.Errorf("CheckIP(%v) = %v, want a *DeniedAddressError without a range", ip, err)
		}
	}
}

func TestCheckIPAllowsPublicAddresses(t *testing.T) {
	for _, s := range []string{
		"93.184.216.34", "8.8.8.8", "1.1.1.1", "100.63.255.255", "100.128.0.0", "172.32.0.1",
		"2606:4700::1111", "2a00:1450:4001:80b::200e",
		"::ffff:93.184.216.34", "64:ff9b::5db8:d822", "2002:5db8:d822::1",
	} {
		if err := CheckIP(netip.MustParseAddr(s), nil); err != nil {
			t.Errorf("CheckIP(%s) = %v, want nil", s, err)
		}
	}
}

func TestCheckIPAllowList(t *testing.T) {
	allow := []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("10.20.0.0/16")}
	for _, s := range []string{"127.0.0.1", "::ffff:127.0.0.1", "10.20.3.4"} {
		if err := CheckIP(netip.MustParseAddr(s), allow); err != nil {
			t.Errorf("allow-listed %s: %v", s, err)
		}
	}
	for _, s := range []string{"10.21.0.1", "169.254.169.254", "::1", "192.168.1.1"} {
		if err := CheckIP(netip.MustParseAddr(s), allow); !errors.Is(err, ErrURLDenied) {
			t.Errorf("%s outside the allow-list: %v, want ErrURLDenied", s, err)
		}
	}
}

func TestParseInetAton(t *testing.T) {
	valid := map[string]string{
		"2130706433":       "127.0.0.1",
		"0177.0.0.1":       "127.0.0.1",
		"0x7f.1":           "127.0.0.1",
		"0X7F.0.0.1":       "127.0.0.1",
		"127.1":            "127.0.0.1",
		"127.0.1":          "127.0.0.1",
		"0x7f000001":       "127.0.0.1",
		"017700000001":     "127.0.0.1",
		"127.000.000.001":  "127.0.0.1",
		"127.0.0.1.":       "127.0.0.1",
		"0":                "0.0.0.0",
		"10.1":             "10.0.0.1",
		"169.254.43518":    "169.254.169.254",
		"0xa9fea9fe":       "169.254.169.254",
		"4294967295":       "255.255.255.255",
		"1.2.3.4":          "1.2.3.4",
		"192.168.0x1.0377": "192.168.1.255",
	}
	for in, want := range valid {
		got, ok := parseInetAton(in)
		if !ok || got != netip.MustParseAddr(want) {
			t.Errorf("parseInetAton(%q) = %v, %v; want %s", in, got, ok, want)
		}
	}
	for _, in := range []string{
		"", ".", "1..2", "1.2.3.4.5", "256.1.1.1", "1.256.1.1", "1.2.3.256", "1.2.65536", "1.16777216",
		"4294967296", "0x", "08", "0x1g", "-1", "+1", "1_000", "example.com", "127.0.0.1x", "::1", "1.2.3.4..",
	} {
		if got, ok := parseInetAton(in); ok {
			t.Errorf("parseInetAton(%q) = %v, want invalid", in, got)
		}
	}
}

func TestCheckURL(t *testing.T) {
	denied := []string{
		"http://2130706433/",
		"http://0177.0.0.1/",
		"http://0x7f.1/",
		"http://127.1/",
		"http://127.0.0.1./",
		"http://127.0.0.1:8080/hook",
		"https://[::1]/",
		"http://[::ffff:127.0.0.1]:8080/",
		"http://[::ffff:7f00:1]/",
		"http://169.254.169.254/latest/meta-data/",
		"http://0xa9fea9fe/",
		"http://[fe80::1%25eth0]/",
		"http://[fd00:ec2::254]/",
		"http://10.0.0.1/",
	}
	for _, raw := range denied {
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatalf("url.Parse(%q): %v", raw, err)
		}
		if err := CheckURL(u, nil); !errors.Is(err, ErrURLDenied) {
			t.Errorf("CheckURL(%s) = %v, want ErrURLDenied", raw, err)
		}
	}
	for _, raw := range []string{"https://example.com/hook", "http://93.184.216.34/", "https://[2606:4700::1111]:8443/x", "http://1e100.net/"} {
		u, _ := url.Parse(raw)
		if err := CheckURL(u, nil); err != nil {
			t.Errorf("CheckURL(%s) = %v, want nil", raw, err)
		}
	}
	for _, raw := range []string{"ftp://example.com/", "file:///etc/passwd", "http:///path", "//example.com/"} {
		u, _ := url.Parse(raw)
		if err := CheckURL(u, nil); err == nil || errors.Is(err, ErrURLDenied) {
			t.Errorf("CheckURL(%s) = %v, want an unusable-URL error", raw, err)
		}
	}
	u, _ := url.Parse("http://127.1/")
	if err := CheckURL(u, loopbackOnly); err != nil {
		t.Errorf("allow-listed 127.1: %v", err)
	}
}

func TestGuardControlChecksTheDialedAddress(t *testing.T) {
	control := guardControl(nil)
	for _, addr := range []string{"127.0.0.1:80", "[::1]:443", "[::ffff:127.0.0.1]:80", "169.254.169.254:80", "[fe80::1%eth0]:80"} {
		if err := control("tcp", addr, nil); !errors.Is(err, ErrURLDenied) {
			t.Errorf("control(%s) = %v, want ErrURLDenied", addr, err)
		}
	}
	if err := control("tcp", "93.184.216.34:443", nil); err != nil {
		t.Errorf("control(public) = %v, want nil", err)
	}
	if err := control("tcp", "not-an-address", nil); !errors.Is(err, ErrURLDenied) {
		t.Errorf("control(garbage) = %v, want ErrURLDenied", err)
	}
	if err := guardControl(loopbackOnly)("tcp", "127.0.0.1:80", nil); err != nil {
		t.Errorf("allow-listed control: %v", err)
	}
}

func TestBuiltinGuardRefusesLoopbackLiteral(t *testing.T) {
	rcv := newReceiver(t, http.StatusOK, "", nil)

	// A fixed URL is checked at construction.
	_, err := NewPublisher(Config{URL: rcv.URL()}, nil)
	var ce *ConfigError
	if !errors.As(err, &ce) || ce.Field != "URL" || !errors.Is(err, ErrURLDenied) {
		t.Fatalf("NewPublisher(loopback URL) = %v, want *ConfigError for URL wrapping ErrURLDenied", err)
	}

	// A target URL is checked before every request.
	p, err := NewPublisher(Config{Target: func(string, *message.Message) (Target, error) {
		return Target{URL: rcv.URL()}, nil
	}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	err = p.Publish("t", newMsg(eventID, `{}`, nil))
	de := asDelivery(t, err)
	var dae *DeniedAddressError
	if !errors.As(err, &dae) || dae.Addr != netip.MustParseAddr("127.0.0.1") || de.Permanent {
		t.Errorf("err = %v, want a retryable denial of 127.0.0.1", err)
	}
	if n := rcv.conns.Load(); n != 0 {
		t.Errorf("listener saw %d connections, want 0", n)
	}
}

// A host name that resolves to loopback passes the URL check and must be stopped by the
// Control hook at connect time.
func TestBuiltinGuardRefusesResolvedLoopbackAtDialTime(t *testing.T) {
	for _, resolved := range [][]netip.Addr{
		{netip.MustParseAddr("127.0.0.1")},
		{netip.MustParseAddr("::ffff:127.0.0.1")},
		{netip.MustParseAddr("127.0.0.2"), netip.MustParseAddr("127.0.0.1")},
	} {
		t.Run(resolved[0].String(), func(t *testing.T) {
			rcv := newReceiver(t, http.StatusOK, "", nil)
			port := rcv.srv.Listener.Addr().(*net.TCPAddr).Port
			target := "http://rebind.test:" + strconv.Itoa(port) + "/hook"
			lookup := &staticLookup{m: map[string][]netip.Addr{"rebind.test": resolved}}

			p, err := NewPublisher(Config{URL: target, LookupIP: lookup.LookupIP}, nil)
			if err != nil {
				t.Fatalf("NewPublisher: %v (a host name must pass construction)", err)
			}
			defer p.Close()
			err = p.Publish("t", newMsg(eventID, `{}`, nil))
			asDelivery(t, err)
			var dae *DeniedAddressError
			if !errors.As(err, &dae) || !errors.Is(err, ErrURLDenied) {
				t.Fatalf("err = %v, want *DeniedAddressError", err)
			}
			if n := lookup.calls.Load(); n != 1 {
				t.Errorf("resolver called %d times, want 1 (refusal must come after resolution)", n)
			}
			if n := rcv.conns.Load(); n != 0 {
				t.Errorf("listener saw %d connections, want 0", n)
			}
		})
	}
}

func TestAllowListLetsNamedLoopbackTargetThrough(t *testing.T) {
	rcv := newReceiver(t, http.StatusOK, "", nil)
	port := rcv.srv.Listener.Addr().(*net.TCPAddr).Port
	lookup := &staticLookup{m: map[string][]netip.Addr{"rebind.test": {netip.MustParseAddr("127.0.0.1")}}}
	p := newPub(t, Config{
		URL:             "http://rebind.test:" + strconv.Itoa(port) + "/hook",
		Secret:          testSeedSecret,
		LookupIP:        lookup.LookupIP,
		AllowedPrefixes: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")},
	})
	if err := p.Publish("t", newMsg(eventID, testPayload, nil)); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	reqs := rcv.Requests()
	if len(reqs) != 1 || string(reqs[0].Body) != testPayload || reqs[0].Path != "/hook" {
		t.Fatalf("requests = %+v", reqs)
	}
	if err := Verify([]byte(testSeedSecret), reqs[0].Body, reqs[0].Header.Get("Outbox-Signature")); err != nil {
		t.Error(err)
	}
	if n := rcv.conns.Load(); n != 1 {
		t.Errorf("listener saw %d connections, want 1", n)
	}
}

func TestURLGuardRunsBeforeEveryRequest(t *testing.T) {
	rcv := newReceiver(t, http.StatusOK, "", nil)
	errBlocked := errors.New("tenant blocked")
	var seen []string
	p := newPub(t, Config{
		URL: rcv.URL() + "/x?tenant=7",
		URLGuard: func(ctx context.Context, u *url.URL) error {
			if ctx == nil {
				t.Error("URLGuard got a nil context")
			}
			seen = append(seen, u.String())
			if len(seen) == 2 {
				return errBlocked
			}
			return nil
		},
	})
	if err := p.Publish("t", newMsg("1", `{}`, nil)); err != nil {
		t.Fatal(err)
	}
	err := p.Publish("t", newMsg("2", `{}`, nil))
	de := asDelivery(t, err)
	if !errors.Is(err, ErrURLDenied) || !errors.Is(err, errBlocked) || de.Permanent {
		t.Errorf("err = %v, want retryable ErrURLDenied wrapping the guard's error", err)
	}
	if len(seen) != 2 || seen[0] != rcv.URL()+"/x?tenant=7" {
		t.Errorf("guard saw %q", seen)
	}
	if n := rcv.Count(); n != 1 {
		t.Errorf("receiver saw %d requests, want 1", n)
	}
}

// With a proxy configured, the dial goes to the proxy and the guard checks the proxy's address.
func TestProxyDialIsGuarded(t *testing.T) {
	proxy := newReceiver(t, http.StatusOK, "", nil)
	proxyURL, _ := url.Parse(proxy.URL())
	lookup := &staticLookup{m: map[string][]netip.Addr{}}
	p, err := NewPublisher(Config{
		URL:      "http://hooks.example.test/x",
		Proxy:    http.ProxyURL(proxyURL),
		LookupIP: lookup.LookupIP,
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	err = p.Publish("t", newMsg(eventID, `{}`, nil))
	var dae *DeniedAddressError
	if !errors.As(err, &dae) || dae.Addr != netip.MustParseAddr("127.0.0.1") {
		t.Errorf("err = %v, want the loopback proxy address denied", err)
	}
	if n := proxy.conns.Load(); n != 0 {
		t.Errorf("proxy saw %d connections, want 0", n)
	}

	// Allow-listed, the proxy receives the request for the real destination.
	p2 := newPub(t, Config{URL: "http://hooks.example.test/x", Proxy: http.ProxyURL(proxyURL), LookupIP: lookup.LookupIP})
	if err := p2.Publish("t", newMsg(eventID, `{}`, nil)); err != nil {
		t.Fatal(err)
	}
	if reqs := proxy.Requests(); len(reqs) != 1 {
		t.Errorf("proxy saw %d requests, want 1", len(reqs))
	}
	if n := lookup.calls.Load(); n != 0 {
		t.Errorf("destination resolved %d times locally; the proxy resolves it", n)
	}
}

func TestEnvironmentProxiesAreIgnoredByDefault(t *testing.T) {
	p := newPub(t, Config{URL: "https://example.com/x"})
	tr, ok := p.client.Transport.(*http.Transport)
	if !ok || tr.Proxy != nil {
		t.Fatalf("transport proxy is set by default")
	}
	if p.client.CheckRedirect == nil || !errors.Is(p.client.CheckRedirect(nil, nil), http.ErrUseLastResponse) {
		t.Error("redirects are not refused")
	}
}
