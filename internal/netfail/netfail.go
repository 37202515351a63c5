// Package netfail tells the forwarder's destinations whether a client error is about the
// network path to the destination rather than about the message: a connection that could not
// be made (Unreachable) or an established connection that broke or stopped answering
// (Dropped). The destinations turn the first into outbox.Unavailable at once and check the
// destination's health before they do the same with the second (a connection the broker drops
// because of one message must not make that message's failures free of attempts).
package netfail

import (
	"context"
	"errors"
	"io"
	"net"
	"syscall"
)

// Unreachable reports whether err says that no connection could be made: a DNS failure
// (*net.DNSError), a failed dial (*net.OpError with Op "dial", which includes a connect
// timeout), or ECONNREFUSED, EHOSTUNREACH, ENETUNREACH anywhere in the chain.
func Unreachable(err error) bool {
	if err == nil {
		return false
	}
	var dns *net.DNSError
	if errors.As(err, &dns) {
		return true
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return true
	}
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EHOSTUNREACH) ||
		errors.Is(err, syscall.ENETUNREACH)
}

// Dropped reports whether err says that an established connection broke or stopped
// answering: EOF (io.EOF, io.ErrUnexpectedEOF), ECONNRESET, EPIPE, ECONNABORTED, a closed
// connection (net.ErrClosed) or a network timeout (a net.Error whose Timeout is true; context
// deadlines are not network errors and do not count).
func Dropped(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNABORTED) {
		return true
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return false // the caller's own deadline (it is a net.Error too), not the network's
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
