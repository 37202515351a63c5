// Package brokertest is the broker side of the integration-test harness: RabbitMQ and Redis on
// loopback, Kafka as an in-process kfake cluster, and an address where nothing listens.
//
// Like pgtest, a missing service skips the test with a message locally but fails it when the
// environment variable CI is "true", so a green CI never means "nothing ran".
package brokertest

import (
	"context"
	"io"
	"net"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Defaults used when the environment variables are unset.
const (
	DefaultAMQPURL   = "amqp://guest:guest@127.0.0.1:5672/"
	DefaultRedisAddr = "127.0.0.1:6379"
)

// AMQPURL returns OUTBOX_TEST_AMQP_URL or DefaultAMQPURL.
func AMQPURL() string {
	if v := os.Getenv("OUTBOX_TEST_AMQP_URL"); v != "" {
		return v
	}
	return DefaultAMQPURL
}

// RedisAddr returns OUTBOX_TEST_REDIS_ADDR or DefaultRedisAddr.
func RedisAddr() string {
	if v := os.Getenv("OUTBOX_TEST_REDIS_ADDR"); v != "" {
		return v
	}
	return DefaultRedisAddr
}

func unavailable(tb testing.TB, what, where string, err error) {
	tb.Helper()
	if os.Getenv("CI") == "true" {
		tb.Fatalf("%s at %s unreachable and CI=true: %v", what, where, err)
	}
	tb.Skipf("%s at %s unreachable (in CI this fails): %v", what, where, err)
}

var (
	amqpOnce sync.Once
	amqpErr  error
)

// RequireRabbitMQ returns the broker URL after checking once per binary that it accepts a
// connection; otherwise it skips tb (fails it when CI=true).
func RequireRabbitMQ(tb testing.TB) string {
	tb.Helper()
	amqpOnce.Do(func() {
		conn, err := amqp091.DialConfig(AMQPURL(), amqp091.Config{Dial: amqp091.DefaultDial(5 * time.Second)})
		if err != nil {
			amqpErr = err
			return
		}
		amqpErr = conn.Close()
	})
	if amqpErr != nil {
		unavailable(tb, "RabbitMQ", AMQPURL(), amqpErr)
	}
	return AMQPURL()
}

var (
	redisOnce sync.Once
	redisErr  error
)

// RequireRedis returns the Redis address after checking once per binary that it answers PING;
// otherwise it skips tb (fails it when CI=true).
func RequireRedis(tb testing.TB) string {
	tb.Helper()
	redisOnce.Do(func() {
		c := redis.NewClient(&redis.Options{Addr: RedisAddr(), MaxRetries: -1})
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		redisErr = c.Ping(ctx).Err()
	})
	if redisErr != nil {
		unavailable(tb, "Redis", RedisAddr(), redisErr)
	}
	return RedisAddr()
}

// Kafka starts an in-process kfake cluster listening on loopback with opts and closes it when
// tb ends. Topics are not auto-created unless opts include kfake.AllowAutoTopicCreation.
func Kafka(tb testing.TB, opts ...kfake.Opt) *kfake.Cluster {
	tb.Helper()
	c, err := kfake.NewCluster(opts...) // kfake listens on 127.0.0.1

	if err != nil {
		tb.Fatalf("kfake: %v", err)
	}
	tb.Cleanup(c.Close)
	return c
}

// ProduceRefusal is a kfake control answer to the produce request kreq: error code for every
// partition of every topic (by name and by topic id), nothing appended.
func ProduceRefusal(kreq kmsg.Request, code int16) *kmsg.ProduceResponse {
	req := kreq.(*kmsg.ProduceRequest)
	resp := req.ResponseKind().(*kmsg.ProduceResponse)
	for _, rt := range req.Topics {
		st := kmsg.NewProduceResponseTopic()
		st.Topic, st.TopicID = rt.Topic, rt.TopicID
		for _, rp := range rt.Partitions {
			sp := kmsg.NewProduceResponseTopicPartition()
			sp.Partition = rp.Partition
			sp.ErrorCode = code
			st.Partitions = append(st.Partitions, sp)
		}
		resp.Topics = append(resp.Topics, st)
	}
	return resp
}

// ClosedPort returns a loopback "host:port" where nothing listens (a port just released).
func ClosedPort(tb testing.TB) string {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		tb.Fatal(err)
	}
	return addr
}

// PrivateRedis prepares a redis-server of the test's own on a free loopback port (never the
// shared one: tests stop, kill or misconfigure it), started with the extra args (such as
// "--maxmemory", "1"), and returns its address and the function that starts it (again, on the
// same port, after a kill); each start waits until it answers PING and is killed at the end
// of the test. A missing redis-server skips the test, or fails it when CI is "true".
func PrivateRedis(tb testing.TB, args ...string) (addr string, start func() *exec.Cmd) {
	tb.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		unavailable(tb, "redis-server", "PATH", err)
	}
	addr = ClosedPort(tb)
	_, port, _ := net.SplitHostPort(addr)
	return addr, func() *exec.Cmd {
		tb.Helper()
		cmd := exec.Command(bin, append([]string{"--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", tb.TempDir()}, args...)...)
		if err := cmd.Start(); err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() {
			_ = cmd.Process.Signal(syscall.SIGCONT)
			_ = cmd.Process.Kill()
			_, _ = cmd.Process.Wait()
		})
		c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
		defer c.Close()
		deadline := time.Now().Add(10 * time.Second)
		for c.Ping(context.Background()).Err() != nil {
			if time.Now().After(deadline) {
				tb.Fatal("private redis-server did not answer within 10s")
			}
			time.Sleep(10 * time.Millisecond)
		}
		return cmd
	}
}

// Forward listens on the loopback address addr ("127.0.0.1:0" for a free port, or one
// ClosedPort returned, so that a client pointed at it found it refused until now) and
// forwards each connection to target. It returns the address it listens on and cut, which
// closes the listener (the port refuses again) and every connection it carries (the broker
// going away, as a client sees it); cut runs when tb ends too and is idempotent. It stands in
// for a broker that comes up or goes away, such as the shared RabbitMQ, which a test cannot
// start or stop itself.
func Forward(tb testing.TB, addr, target string) (listening string, cut func()) {
	tb.Helper()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		tb.Fatalf("forward %s: %v", addr, err)
	}
	var (
		mu    sync.Mutex
		conns []net.Conn
	)
	cut = func() {
		_ = l.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
		conns = nil
	}
	tb.Cleanup(cut)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				_ = c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, c, up)
			mu.Unlock()
			go func() { _, _ = io.Copy(up, c); _ = up.Close() }()
			go func() { _, _ = io.Copy(c, up); _ = c.Close() }()
		}
	}()
	return l.Addr().String(), cut
}
