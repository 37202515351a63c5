package webhook

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"
)

// blackholeLoopback returns a port of 127.0.0.2 whose listener's accept queue is full, so the
// kernel drops further SYNs to it (as a dead node behind a dropping firewall does): a connect
// there ends only by timeout. Loopback only.
func blackholeLoopback(t *testing.T) int {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 2}}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	addr := "127.0.0.2:" + strconv.Itoa(sa.(*syscall.SockaddrInet4).Port)
	c, err := net.DialTimeout("tcp", addr, time.Second) // fills the queue (backlog 0: one entry)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if c2, err := net.DialTimeout("tcp", addr, 300*time.Millisecond); err == nil {
		c2.Close()
		t.Fatal("a connect to a full accept queue succeeded: this kernel does not drop SYNs there, the test cannot make a connect timeout")
	}
	return sa.(*syscall.SockaddrInet4).Port
}

// TestConnectTimeoutIsUnavailable: a receiver whose SYNs are dropped is unavailable (no
// attempt counted), as the package doc says of a connect timeout. net/http reports a dial
// ended by the attempt's deadline as the bare context error, without the dial's
// *net.OpError: it was an ordinary failure, and every event burnt its attempts.
func TestConnectTimeoutIsUnavailable(t *testing.T) {
	port := blackholeLoopback(t)
	p := newPub(t, Config{URL: "http://127.0.0.2:" + strconv.Itoa(port) + "/h", Timeout: 500 * time.Millisecond})
	de := asDelivery(t, p.Publish("t", newMsg("ev-1", `{}`, nil)))
	if !de.Unavailable || de.Permanent {
		t.Fatalf("connect timeout: Unavailable %v, Permanent %v, want true, false: %v", de.Unavailable, de.Permanent, de)
	}
}

// TestDeadFirstAddressLeavesTimeForTheNext: a name resolving to a dead address (SYNs dropped)
// and then a live one is delivered to the live one within the attempt's Timeout: each address
// gets its share (at least 2s), as net.Dialer shares a deadline. The first address took the
// whole Timeout before, and the attempt failed without trying the second (or, in a race of
// the two timers, reached it only as the attempt's deadline fired).
func TestDeadFirstAddressLeavesTimeForTheNext(t *testing.T) {
	port := blackholeLoopback(t)
	l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		t.Fatalf("listen on 127.0.0.1 at the blackholed port of 127.0.0.2: %v", err)
	}
	rcv := newReceiver(t, http.StatusOK, "", nil)
	srv := &http.Server{Handler: rcv.srv.Config.Handler}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	lookup := &staticLookup{m: map[string][]netip.Addr{"hooks.test": {netip.MustParseAddr("127.0.0.2"), netip.MustParseAddr("127.0.0.1")}}}
	p := newPub(t, Config{URL: "http://hooks.test:" + strconv.Itoa(port) + "/h", Timeout: 6 * time.Second, LookupIP: lookup.LookupIP})
	start := time.Now()
	if err := p.Publish("t", newMsg("ev-1", `{}`, nil)); err != nil {
		t.Fatalf("after %s: %v", time.Since(start).Round(time.Millisecond), err)
	}
	// The dead address's share is half the Timeout (3s); it had the whole 6s, and the live
	// one was reached, if at all, only as the attempt's deadline fired.
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("delivered after %s: the dead first address held the dial for more than its share (3s of 6s)", took.Round(time.Millisecond))
	}
	if got := rcv.Count(); got != 1 {
		t.Fatalf("the live address received %d requests, want 1", got)
	}
}

// TestTLSHandshakeFailureIsUnavailable: a receiver whose certificate does not verify fails
// every event alike before anything is sent (an expired or wrong certificate is an outage of
// that receiver, "could not be reached"): unavailable, not an attempt per event.
func TestTLSHandshakeFailureIsUnavailable(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	t.Cleanup(srv.Close)
	p := newPub(t, Config{URL: srv.URL + "/h"})
	de := asDelivery(t, p.Publish("t", newMsg("ev-1", `{}`, nil)))
	if !de.Unavailable || de.Permanent {
		t.Fatalf("TLS handshake failure: Unavailable %v, Permanent %v, want true, false: %v", de.Unavailable, de.Permanent, de)
	}
}

// TestNoRequestStartsAfterClose: Close called between two messages of one Publish (from the
// first one's OnResult) keeps the second from being sent. context.AfterFunc on an already
// closed publisher cancels in a goroutine of its own, later: the second request reached the
// receiver in 17-31 of 200 runs.
func TestNoRequestStartsAfterClose(t *testing.T) {
	sent := 0
	for range 200 {
		var mu sync.Mutex
		closing, after := false, 0
		rcv := newReceiverFunc(t, func(http.ResponseWriter, *http.Request) {
			mu.Lock()
			if closing {
				after++
			}
			mu.Unlock()
		})
		var p *Publisher
		closed := make(chan struct{})
		p = newPub(t, Config{URL: rcv.URL(), OnResult: func(_ context.Context, r Result) {
			if r.EventID == "m0" {
				mu.Lock()
				closing = true
				mu.Unlock()
				go func() { p.Close(); close(closed) }()
				// Close cancels the publisher's context first, then waits for this Publish.
				for p.closeCtx.Err() == nil {
					time.Sleep(100 * time.Microsecond)
				}
			}
		}})
		_ = p.Publish("t", newMsg("m0", `0`, nil), newMsg("m1", `1`, nil))
		<-closed
		mu.Lock()
		sent += after
		mu.Unlock()
	}
	if sent > 0 {
		t.Fatalf("%d of 200 runs sent the second message after Close had begun", sent)
	}
}
