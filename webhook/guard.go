package webhook

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// deniedRange is one refused address range and the reason reported for it.
type deniedRange struct {
	prefix netip.Prefix
	reason string
}

func denied(cidr, reason string) deniedRange {
	return deniedRange{prefix: netip.MustParsePrefix(cidr), reason: reason}
}

// Metadata endpoints are listed first so that the more precise reason wins.
var deniedV4 = []deniedRange{
	denied("169.254.169.254/32", "a cloud metadata endpoint (AWS, GCP, Azure, OCI, DigitalOcean)"),
	denied("169.254.170.2/32", "a cloud metadata endpoint (AWS ECS task metadata)"),
	denied("100.100.100.200/32", "a cloud metadata endpoint (Alibaba Cloud)"),
	denied("168.63.129.16/32", "a cloud platform endpoint (Azure WireServer)"),
	denied("0.0.0.0/8", `"this network" 0.0.0.0/8 (RFC 6890)`),
	denied("10.0.0.0/8", "private 10.0.0.0/8 (RFC 1918)"),
	denied("100.64.0.0/10", "shared address space (CGNAT) 100.64.0.0/10 (RFC 6598)"),
	denied("127.0.0.0/8", "loopback 127.0.0.0/8 (RFC 6890)"),
	denied("169.254.0.0/16", "link-local 169.254.0.0/16 (RFC 3927)"),
	denied("172.16.0.0/12", "private 172.16.0.0/12 (RFC 1918)"),
	denied("192.0.0.0/24", "IETF protocol assignments 192.0.0.0/24 (RFC 6890)"),
	denied("192.0.2.0/24", "documentation 192.0.2.0/24 (RFC 5737)"),
	denied("192.88.99.0/24", "6to4 relay anycast 192.88.99.0/24 (RFC 7526)"),
	denied("192.168.0.0/16", "private 192.168.0.0/16 (RFC 1918)"),
	denied("198.18.0.0/15", "benchmarking 198.18.0.0/15 (RFC 2544)"),
	denied("198.51.100.0/24", "documentation 198.51.100.0/24 (RFC 5737)"),
	denied("203.0.113.0/24", "documentation 203.0.113.0/24 (RFC 5737)"),
	denied("224.0.0.0/4", "multicast 224.0.0.0/4 (RFC 5771)"),
	denied("255.255.255.255/32", "limited broadcast 255.255.255.255 (RFC 919, RFC 6890)"),
	denied("240.0.0.0/4", "reserved 240.0.0.0/4 (RFC 1112, RFC 6890)"),
}

var deniedV6 = []deniedRange{
	denied("fd00:ec2::254/128", "a cloud metadata endpoint (AWS IMDS IPv6)"),
	denied("::/128", "unspecified :: (RFC 4291)"),
	denied("::1/128", "loopback ::1 (RFC 4291)"),
	denied("::/96", "IPv4-compatible IPv6 ::/96 (deprecated, RFC 4291)"),
	denied("64:ff9b:1::/48", "local-use NAT64 64:ff9b:1::/48 (RFC 8215)"),
	denied("100::/64", "discard-only 100::/64 (RFC 6666)"),
	denied("2001::/23", "IETF protocol assignments 2001::/23 incl. Teredo (RFC 2928, RFC 4380)"),
	denied("2001:db8::/32", "documentation 2001:db8::/32 (RFC 3849)"),
	denied("3fff::/20", "documentation 3fff::/20 (RFC 9637)"),
	denied("5f00::/16", "SRv6 SIDs 5f00::/16 (RFC 9602)"),
	denied("fc00::/7", "unique local fc00::/7 (RFC 4193)"),
	denied("fe80::/10", "link-local fe80::/10 (RFC 4291)"),
	denied("fec0::/10", "site-local fec0::/10 (deprecated, RFC 3879)"),
	denied("ff00::/8", "multicast ff00::/8 (RFC 4291)"),
}

var (
	nat64Prefix         = netip.MustParsePrefix("64:ff9b::/96") // RFC 6052 well-known prefix
	sixToFourPrefix     = netip.MustParsePrefix("2002::/16")    // RFC 3056
	globalUnicastPrefix = netip.MustParsePrefix("2000::/3")     // RFC 4291 §2.4
)

// CheckIP is the built-in guard's decision for one destination address. It returns nil when a
// webhook may connect to ip, and otherwise a *DeniedAddressError (which unwraps to
// ErrURLDenied) naming the refused range.
//
// An address inside any prefix of allow is accepted without further checks (the IPv4 form of
// an IPv4-mapped address is matched too); list only the narrow ranges you mean, such as the
// one private subnet that hosts your receivers. Otherwise refused are the ranges of the IANA
// special-purpose address registries (RFC 6890 and updates) that are not globally reachable:
//
//   - IPv4: 0.0.0.0/8, private 10/8, 172.16/12, 192.168/16 (RFC 1918), shared/CGNAT
//     100.64.0.0/10 (RFC 6598), loopback 127/8, link-local 169.254/16, 192.0.0.0/24,
//     documentation and benchmarking ranges, 6to4 relay anycast, multicast 224/4, reserved
//     240/4 and broadcast 255.255.255.255;
//   - IPv6: unspecified ::, loopback ::1, IPv4-compatible ::/96, discard 100::/64,
//     2001::/23 (incl. Teredo), documentation, unique local fc00::/7 (RFC 4193), link-local
//     fe80::/10, site-local fec0::/10, multicast ff00::/8, and anything else outside the
//     global unicast space 2000::/3;
//   - IPv6 forms that embed an IPv4 address are judged by that address: IPv4-mapped
//     ::ffff:a.b.c.d, NAT64 64:ff9b::/96 (RFC 6052) and 6to4 2002::/16 (RFC 3056);
//   - cloud metadata endpoints: 169.254.169.254, 169.254.170.2, 100.100.100.200,
//     168.63.129.16 (Azure WireServer, a public address) and fd00:ec2::254.
//
// An invalid (zero) Addr is refused. A zone (fe80::1%eth0) is ignored. CheckIP is a pure
// function, safe for concurrent use.
func CheckIP(ip netip.Addr, allow []netip.Prefix) error {
	if !ip.IsValid() {
		return &DeniedAddressError{Addr: ip, Reason: "not a valid IP address"}
	}
	ip = ip.WithZone("")
	for _, p := range allow {
		if p.Contains(ip) || p.Contains(ip.Unmap()) {
			return nil
		}
	}
	if d, ok := deniedRangeOf(ip); ok {
		return &DeniedAddressError{Addr: ip, Range: d.prefix, Reason: d.reason}
	}
	return nil
}

// deniedRangeOf returns the refused range ip falls in, and whether there is one. For IPv6
// forms that embed an IPv4 address, the returned range is the IPv4 range and the reason says
// how the address was embedded.
func deniedRangeOf(ip netip.Addr) (deniedRange, bool) {
	embedded := func(how string, v4 netip.Addr) (deniedRange, bool) {
		d, ok := deniedRangeOf(v4)
		if ok {
			d.reason = how + " " + v4.String() + ": " + d.reason
		}
		return d, ok
	}
	if ip.Is4In6() {
		return embedded("IPv4-mapped", ip.Unmap())
	}
	if ip.Is4() {
		for _, d := range deniedV4 {
			if d.prefix.Contains(ip) {
				return d, true
			}
		}
		return deniedRange{}, false
	}
	b := ip.As16()
	if nat64Prefix.Contains(ip) {
		return embedded("NAT64 (RFC 6052) for", netip.AddrFrom4([4]byte(b[12:16])))
	}
	if sixToFourPrefix.Contains(ip) {
		return embedded("6to4 (RFC 3056) for", netip.AddrFrom4([4]byte(b[2:6])))
	}
	for _, d := range deniedV6 {
		if d.prefix.Contains(ip) {
			return d, true
		}
	}
	if !globalUnicastPrefix.Contains(ip) {
		return deniedRange{reason: "outside the IPv6 global unicast space 2000::/3 (RFC 4291)"}, true
	}
	return deniedRange{}, false
}

// CheckURL is the static part of the built-in guard, run before every request and on
// Config.URL at construction. It refuses a URL whose scheme is not http or https or whose host
// is empty, and — when the host is an IP literal, including the legacy numeric forms that
// inet_aton and some resolvers accept (decimal "2130706433", octal "0177.0.0.1", hex
// "0x7f.1", short "127.1") — applies CheckIP to that address. A host name passes: it is
// checked after resolution, at dial time. Errors are *DeniedAddressError (ErrURLDenied) for
// refused addresses and a plain error for an unusable URL. Safe for concurrent use.
func CheckURL(u *url.URL, allow []netip.Prefix) error {
	if u == nil {
		return errors.New("webhook: nil URL")
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("webhook: URL scheme %q is not http or https", u.Scheme)
	}
	host := u.Hostname()
	if host == "" {
		return errors.New("webhook: URL has no host")
	}
	if ip, ok := parseHostIP(host); ok {
		return CheckIP(ip, allow)
	}
	return nil
}

// parseHostIP parses a URL host (brackets already removed) as an IP address: the standard
// textual forms, and for IPv4 also the inet_aton forms.
func parseHostIP(host string) (netip.Addr, bool) {
	if ip, err := netip.ParseAddr(host); err == nil {
		return ip, true
	}
	return parseInetAton(host)
}

// parseInetAton parses s the way BSD inet_aton (and the WHATWG URL host parser) does: one to
// four dot-separated parts, each decimal, octal (leading 0) or hexadecimal (leading 0x); the
// last part fills all remaining bytes ("127.1" = 127.0.0.1, "2130706433" = 127.0.0.1). One
// trailing dot is accepted, as in a fully qualified name.
func parseInetAton(s string) (netip.Addr, bool) {
	s = strings.TrimSuffix(s, ".")
	if s == "" {
		return netip.Addr{}, false
	}
	parts := strings.Split(s, ".")
	if len(parts) > 4 {
		return netip.Addr{}, false
	}
	vals := make([]uint64, len(parts))
	for i, p := range parts {
		v, ok := parseInetAtonPart(p)
		if !ok {
			return netip.Addr{}, false
		}
		vals[i] = v
	}
	var n uint64
	for i, v := range vals[:len(vals)-1] {
		if v > 0xff {
			return netip.Addr{}, false
		}
		n |= v << (24 - 8*uint(i))
	}
	last := vals[len(vals)-1]
	if last >= 1<<(8*uint(5-len(vals))) {
		return netip.Addr{}, false
	}
	n |= last
	return netip.AddrFrom4([4]byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}), true
}

func parseInetAtonPart(p string) (uint64, bool) {
	base := 10
	switch {
	case len(p) > 2 && (p[:2] == "0x" || p[:2] == "0X"):
		base, p = 16, p[2:]
	case len(p) > 1 && p[0] == '0':
		base, p = 8, p[1:]
	}
	if p == "" || p[0] == '+' || p[0] == '-' || strings.Contains(p, "_") {
		return 0, false
	}
	v, err := strconv.ParseUint(p, base, 32)
	if err != nil {
		return 0, false
	}
	return v, true
}

// guardControl returns a net.Dialer.Control hook that applies CheckIP to the address the socket
// is about to connect to: "ip:port" after name resolution, so DNS rebinding cannot pass.
func guardControl(allow []netip.Prefix) func(network, address string, c syscall.RawConn) error {
	return func(network, address string, _ syscall.RawConn) error {
		ap, err := netip.ParseAddrPort(address)
		if err != nil {
			return &DeniedAddressError{Reason: fmt.Sprintf("unparsable dial address %q", address)}
		}
		return CheckIP(ap.Addr(), allow)
	}
}

// lookupFunc resolves a host name to addresses.
type lookupFunc func(ctx context.Context, host string) ([]netip.Addr, error)

func defaultLookup(ctx context.Context, host string) ([]netip.Addr, error) {
	return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
}

// guardedDialer resolves names with lookup and dials each address in turn through a dialer
// whose Control hook runs the built-in guard, so only the checked address is ever connected.
type guardedDialer struct {
	dialer *net.Dialer
	lookup lookupFunc
}

func (d *guardedDialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	port, err := strconv.ParseUint(portStr, 10, 16)
	if err != nil {
		return nil, fmt.Errorf("webhook: dial %s: invalid port %q", addr, portStr)
	}
	var ips []netip.Addr
	if ip, err := netip.ParseAddr(host); err == nil {
		ips = []netip.Addr{ip}
	} else {
		ips, err = d.lookup(ctx, host)
		if err != nil {
			return nil, fmt.Errorf("webhook: resolve %q: %w", host, err)
		}
		if len(ips) == 0 {
			return nil, fmt.Errorf("webhook: resolve %q: no addresses", host)
		}
	}
	var errs dialErrors
	// net/http dials with a context detached from the request's deadline, so the budget is
	// the dialer's Timeout (and a deadline of ctx, if any), shared among the addresses.
	deadline := time.Now().Add(d.dialer.Timeout)
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	for i, ip := range ips {
		dctx, cancel := partialDeadline(ctx, deadline, len(ips)-i)
		conn, err := d.dialer.DialContext(dctx, network, netip.AddrPortFrom(ip, uint16(port)).String())
		cancel()
		if err == nil {
			return conn, nil
		}
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
	}
	return nil, errs
}

// dialErrors holds the failure of each address tried, on one line, and unwraps to all of them.
type dialErrors []error

func (e dialErrors) Error() string {
	parts := make([]string, len(e))
	for i, err := range e {
		parts[i] = err.Error()
	}
	return strings.Join(parts, "; ")
}

func (e dialErrors) Unwrap() []error { return e }

// partialDeadline gives one of left remaining addresses its share of ctx's deadline, at least
// 2s (or what remains), as net.Dialer does (dialSerial), so a dead first address cannot use
// up the whole attempt.
func partialDeadline(ctx context.Context, deadline time.Time, left int) (context.Context, context.CancelFunc) {
	remaining := time.Until(deadline)
	share := remaining / time.Duration(left)
	if sane := 2 * time.Second; share < sane {
		share = min(sane, remaining)
	}
	return context.WithTimeout(ctx, share)
}
