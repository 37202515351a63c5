package redisstream

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/internal/brokertest"
)

// privateRedis starts a redis-server of this test's own on a free loopback port (never the
// shared one: it is stopped and killed) and returns its address and a function that starts it
// again on the same port after a kill.
func privateRedis(t *testing.T) (string, *exec.Cmd, func() *exec.Cmd) {
	t.Helper()
	addr, start := brokertest.PrivateRedis(t)
	return addr, start(), start
}

// TestOutageIsUnavailable: a private redis-server stopped (SIGSTOP: connections accepted, never
// answered), terminated (SIGTERM), and killed (SIGKILL) while the Publisher holds pooled
// connections: every message of a batch fails with an *outbox.UnavailableError, never an
// ordinary failure; after SIGCONT or a restart the same Publisher appends again.
func TestOutageIsUnavailable(t *testing.T) {
	addr, cmd, restart := privateRedis(t)
	p, err := NewPublisher(Config{Options: &redis.Options{Addr: addr, DialTimeout: time.Second, ReadTimeout: 500 * time.Millisecond, WriteTimeout: 500 * time.Millisecond}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ok := func(what string) {
		t.Helper()
		for i, err := range p.PublishBatch(context.Background(), outgoing("s", "a", "a", "b", "")) {
			if err != nil {
				t.Fatalf("%s: message %d: %v", what, i, err)
			}
		}
	}
	down := func(what string) {
		t.Helper()
		for i, err := range p.PublishBatch(context.Background(), outgoing("s", "a", "a", "b", "")) {
			var ue *outbox.UnavailableError
			if !errors.As(err, &ue) || ue.Destination != "redis "+addr {
				t.Errorf("%s: message %d: %v, want unavailable", what, i, err)
			}
		}
	}
	ok("before")
	for _, sig := range []syscall.Signal{syscall.SIGSTOP, syscall.SIGTERM, syscall.SIGKILL} {
		t.Run(fmt.Sprint(sig), func(t *testing.T) {
			if err := cmd.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			if sig != syscall.SIGSTOP {
				_, _ = cmd.Process.Wait()
			}
			down("down")
			if sig == syscall.SIGSTOP {
				if err := cmd.Process.Signal(syscall.SIGCONT); err != nil {
					t.Fatal(err)
				}
			} else {
				cmd = restart()
			}
			ok("back")
		})
	}
}
