package netfail

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"
)

func TestClasses(t *testing.T) {
	timeout := &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}
	cases := []struct {
		name                 string
		err                  error
		unreachable, dropped bool
	}{
		{"nil", nil, false, false},
		{"dns", fmt.Errorf("x: %w", &net.DNSError{Err: "no such host", Name: "nowhere.invalid", IsNotFound: true}), true, false},
		{"dial refused", &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}, true, false},
		{"bare refused", fmt.Errorf("w: %w", syscall.ECONNREFUSED), true, false},
		{"host unreachable", syscall.EHOSTUNREACH, true, false},
		{"eof", fmt.Errorf("read: %w", io.EOF), false, true},
		{"unexpected eof", io.ErrUnexpectedEOF, false, true},
		{"reset", &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}, false, true},
		{"broken pipe", &net.OpError{Op: "write", Net: "tcp", Err: os.NewSyscallError("write", syscall.EPIPE)}, false, true},
		{"closed", net.ErrClosed, false, true},
		{"read timeout", timeout, false, true},
		{"context deadline", context.DeadlineExceeded, false, false},
		{"other", errors.New("WRONGTYPE"), false, false},
	}
	for _, c := range cases {
		if got := Unreachable(c.err); got != c.unreachable {
			t.Errorf("%s: Unreachable = %v", c.name, got)
		}
		if got := Dropped(c.err); got != c.dropped {
			t.Errorf("%s: Dropped = %v", c.name, got)
		}
	}
}

// TestRealDial: the errors the standard library really returns for a closed loopback port and
// for a peer that closes the connection.
func TestRealDial(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	go func() {
		c, err := l.Accept()
		if err == nil {
			_ = c.Close()
		}
	}()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err = c.Read(make([]byte, 1))
	_ = c.Close()
	if !Dropped(err) || Unreachable(err) {
		t.Errorf("read from a closed peer: %v: Dropped %v Unreachable %v", err, Dropped(err), Unreachable(err))
	}
	_ = l.Close()
	_, err = net.DialTimeout("tcp", addr, 5*time.Second)
	if !Unreachable(err) || Dropped(err) {
		t.Errorf("dial a closed port: %v: Unreachable %v Dropped %v", err, Unreachable(err), Dropped(err))
	}
}
