// Package wakeuptest is the shared test suite of the wakeup implementations: every
// implementation runs the same scenarios against real servers (PostgreSQL through
// internal/pgtest, plus its own broker).
package wakeuptest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/internal/pgtest"
	"github.com/watermill-outbox/outbox/wakeup"
)

// Case describes one implementation under test.
type Case struct {
	// New returns a fresh wakeup isolated from every other test (its own channel, exchange or
	// topic), with a reconnect backoff of about ReconnectBackoff. The suite closes it.
	New func(t *testing.T) wakeup.Wakeup
	// Kill, when set, drops the listener's connection from the server side and returns once
	// it is gone (the reconnect scenario runs only then).
	Kill func(t *testing.T, w wakeup.Wakeup)
	// KillLosesSignals says that signals sent right after Kill returns are lost (the transport
	// drops messages for absent subscribers, and Kill returns before the listener's backoff
	// ends): the reconnect scenario then also checks that the events were delivered by the
	// poll that follows the re-subscription, not by their signals.
	KillLosesSignals bool
}

// ReconnectBackoff is the initial reconnect backoff implementations should use in the suite:
// long enough that a commit right after a kill lands while the listener is away.
const ReconnectBackoff = 500 * time.Millisecond

// RelayPollInterval is the relays' poll interval in the suite: a delivery within a second can
// only come from a wakeup.
const RelayPollInterval = 60 * time.Second

// Run runs every scenario of the suite on c.
func Run(t *testing.T, c Case) {
	t.Run("CommitWakesRelay", func(t *testing.T) { testCommitWakesRelay(t, c) })
	t.Run("RollbackSendsNothing", func(t *testing.T) { testRollback(t, c) })
	t.Run("OneSignalPerTopicPerTransaction", func(t *testing.T) { testCoalesced(t, c) })
	t.Run("FilteredRelayIgnoresOtherTopics", func(t *testing.T) { testFilter(t, c) })
	if c.Kill != nil {
		t.Run("ReconnectThenPoll", func(t *testing.T) { testReconnect(t, c) })
	}
}

// RequireTCP skips the test (or fails it when CI=true) if nothing accepts TCP connections at
// addr (a loopback address).
func RequireTCP(tb testing.TB, name, addr string) {
	tb.Helper()
	conn, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		if os.Getenv("CI") == "true" {
			tb.Fatalf("%s at %s unreachable and CI=true: %v", name, addr, err)
		}
		tb.Skipf("%s at %s unreachable (in CI this fails): %v", name, addr, err)
	}
	_ = conn.Close()
}

// UniqueName returns a name unique to this run and test, for channels, exchanges and topics.
func UniqueName(t testing.TB, prefix string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(t.Name()) {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			b.WriteRune(r)
		}
	}
	s := b.String()
	if len(s) > 30 {
		s = s[len(s)-30:]
	}
	return fmt.Sprintf("%s_%d_%d_%s", prefix, os.Getpid(), counter.Add(1), s)
}

var counter atomic.Int64

// Env is one scenario's outbox table and wakeup.
type Env struct {
	// T is the scenario's test.
	T *testing.T
	// Ctx ends with the test (at most a minute).
	Ctx context.Context
	// W is the wakeup under test.
	W wakeup.Wakeup
	// Schema names the scenario's fresh outbox table.
	Schema outbox.SchemaConfig
}

// NewEnv makes a fresh outbox table and wakeup (c.New) for t; both are removed at its end.
func NewEnv(t *testing.T, c Case) *Env {
	pool := pgtest.Require(t)
	schema := outbox.SchemaConfig{Table: pgtest.Table(t)}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	if err := outbox.Migrate(ctx, pool, schema); err != nil {
		t.Fatal(err)
	}
	w := c.New(t)
	t.Cleanup(func() {
		if err := w.Close(); err != nil {
			t.Errorf("close wakeup: %v", err)
		}
	})
	return &Env{T: t, Ctx: ctx, W: w, Schema: schema}
}

// Commit writes one event per topic in one transaction (RunInTx) and returns when COMMIT
// returned.
func (e *Env) Commit(topics ...string) {
	e.T.Helper()
	err := wakeup.RunInTx(e.Ctx, pgtest.Require(e.T), e.W, outbox.PublisherConfig{Schema: e.Schema}, func(tx pgx.Tx, pub *outbox.Publisher) error {
		for _, topic := range topics {
			if err := pub.Publish(topic, outbox.NewMessage([]byte(`{"topic":"`+topic+`"}`))); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		e.T.Fatal(err)
	}
}

// Observer is a Listen registration that records the topic of every signal it is offered.
type Observer struct {
	C      <-chan struct{}
	mu     sync.Mutex
	seen   map[string]int
	accept func(string) bool
}

// Observe registers a listener on w that accepts topics for which accept is true (nil: all)
// and records every topic offered; it waits for the listener's "subscribed" value.
func (e *Env) Observe(accept func(string) bool) *Observer {
	e.T.Helper()
	o := &Observer{seen: map[string]int{}, accept: accept}
	o.C = e.W.Listen(e.Ctx, func(topic string) bool {
		o.mu.Lock()
		o.seen[topic]++
		o.mu.Unlock()
		return accept == nil || accept(topic)
	})
	select {
	case <-o.C:
	case <-time.After(10 * time.Second):
		e.T.Fatal("listener not subscribed within 10s")
	}
	return o
}

// Seen returns how many signals of topic o was offered.
func (o *Observer) Seen(topic string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.seen[topic]
}

// Topics returns a copy of the offered topic counts.
func (o *Observer) Topics() map[string]int {
	o.mu.Lock()
	defer o.mu.Unlock()
	m := make(map[string]int, len(o.seen))
	for k, v := range o.seen {
		m[k] = v
	}
	return m
}

// Relay is a Subscriber subscribed to one topic pattern with a 60 s poll interval, its claims
// counted through its logger and the topics its Listen filter was offered recorded.
type Relay struct {
	Msgs    <-chan *message.Message
	claims  atomic.Int64
	mu      sync.Mutex
	offered map[string][]bool // topic → accept results
	probe   chan chan int64   // asks the forwarder for Signals
	lastErr atomic.Value      // string: the subscriber's last logged error
}

// Signals returns how many values the wakeup has put on the relay's Listen channel so far:
// those the forwarder took plus one still buffered, counted by the forwarder itself (the only
// receiver of that channel), so nothing is in flight while it counts. Called after a Barrier
// it counts every signal dispatched before it.
func (r *Relay) Signals() int64 {
	reply := make(chan int64)
	r.probe <- reply
	return <-reply
}

// Claims returns how many claims (polls) the relay has run.
func (r *Relay) Claims() int64 { return r.claims.Load() }

// Offered returns the results of the relay's Listen filter for topic, in call order.
func (r *Relay) Offered(topic string) []bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]bool(nil), r.offered[topic]...)
}

// countingWakeup wraps a Wakeup to record the relay's filter results.
type countingWakeup struct {
	wakeup.Wakeup
	r *Relay
}

func (c countingWakeup) Listen(ctx context.Context, accept func(string) bool) <-chan struct{} {
	inner := c.Wakeup.Listen(ctx, func(topic string) bool {
		ok := accept(topic)
		c.r.mu.Lock()
		c.r.offered[topic] = append(c.r.offered[topic], ok)
		c.r.mu.Unlock()
		return ok
	})
	out := make(chan struct{}, 1)
	go func() {
		defer close(out)
		var taken int64
		for {
			select {
			case _, ok := <-inner:
				if !ok {
					return
				}
				taken++
				select {
				case out <- struct{}{}:
				default: // one already pending: coalesce, as the wakeup's own channel does
				}
			case reply := <-c.r.probe:
				reply <- taken + int64(len(inner))
			}
		}
	}()
	return out
}

// Barrier returns once every Hub dispatch that had started has finished (it takes the Hub's
// lock), for wakeups that expose their Hub.
func (e *Env) Barrier() {
	if h, ok := e.W.(interface{ Hub() *wakeup.Hub }); ok {
		h.Hub().Listeners()
	}
}

// StartRelay subscribes a relay to topic and waits until it is idle: its first poll done,
// the listener's "subscribed" value consumed by a second poll, and nothing else pending.
func (e *Env) StartRelay(topic string) *Relay {
	e.T.Helper()
	r := &Relay{offered: map[string][]bool{}, probe: make(chan chan int64)}
	sub, err := outbox.NewSubscriber(pgtest.Require(e.T), outbox.SubscriberConfig{
		Schema:       e.Schema,
		PollInterval: RelayPollInterval,
		Wakeup:       countingWakeup{Wakeup: e.W, r: r},
		// Only the wakeup under test may wake the relay (the probe wakes every subscription).
		DisableWakeProbe: true,
	}, claimLogger{n: &r.claims, lastErr: &r.lastErr})
	if err != nil {
		e.T.Fatal(err)
	}
	e.T.Cleanup(func() { _ = sub.Close() })
	msgs, err := sub.Subscribe(e.Ctx, topic)
	if err != nil {
		e.T.Fatal(err)
	}
	r.Msgs = msgs
	// Poll 1 at start, poll 2 for the "subscribed" signal; then the relay waits 60 s.
	deadline := time.Now().Add(10 * time.Second)
	for r.Claims() < 2 {
		if time.Now().After(deadline) {
			e.T.Fatalf("relay ran %d polls in 10s, want 2 (last subscriber error: %v)", r.Claims(), r.lastErr.Load())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if n := r.Claims(); n != 2 {
		e.T.Fatalf("relay ran %d polls before any commit, want 2", n)
	}
	return r
}

// Receive waits up to within for the relay's next message, acks it and returns it with the
// time it took.
func (r *Relay) Receive(t *testing.T, within time.Duration) (*message.Message, time.Duration) {
	t.Helper()
	start := time.Now()
	select {
	case m, ok := <-r.Msgs:
		if !ok {
			t.Fatal("relay channel closed")
		}
		m.Ack()
		return m, time.Since(start)
	case <-time.After(within):
		t.Fatalf("no delivery within %s (poll interval %s): the wakeup did not wake the relay", within, RelayPollInterval)
	}
	return nil, 0
}

func testCommitWakesRelay(t *testing.T, c Case) {
	e := NewEnv(t, c)
	relay := e.StartRelay("orders.created")
	start := time.Now()
	e.Commit("orders.created")
	m, _ := relay.Receive(t, time.Second)
	took := time.Since(start)
	if got := m.Metadata.Get(outbox.MetadataTopic); got != "orders.created" {
		t.Fatalf("delivered topic %q", got)
	}
	if took >= time.Second {
		t.Fatalf("commit → delivery took %s, want < 1s", took)
	}
	t.Logf("commit → delivery: %s", took)
}

var errRollback = errors.New("roll back on purpose")

func testRollback(t *testing.T, c Case) {
	e := NewEnv(t, c)
	all := e.Observe(nil)
	rolled := e.Observe(func(topic string) bool { return topic == "rolled.back" })
	err := wakeup.RunInTx(e.Ctx, pgtest.Require(t), e.W, outbox.PublisherConfig{Schema: e.Schema}, func(tx pgx.Tx, pub *outbox.Publisher) error {
		if err := pub.Publish("rolled.back", outbox.NewMessage([]byte(`{}`))); err != nil {
			return err
		}
		return errRollback
	})
	if !errors.Is(err, errRollback) {
		t.Fatalf("RunInTx = %v, want errRollback", err)
	}
	// A sentinel committed afterwards travels the same path: once it arrived, a signal of the
	// rolled-back transaction would have arrived before it.
	e.Commit("sentinel")
	pgtest.Eventually(t, 5*time.Second, "sentinel signal", func() bool { return all.Seen("sentinel") == 1 })
	if n := all.Seen("rolled.back"); n != 0 {
		t.Fatalf("rolled-back transaction sent %d signals", n)
	}
	select {
	case <-rolled.C:
		t.Fatal("a listener of the rolled-back topic was signalled")
	default:
	}
	var count int
	if err := pgtest.Require(t).QueryRow(e.Ctx, fmt.Sprintf(`SELECT count(*) FROM %q WHERE topic = 'rolled.back'`, e.Schema.Table)).Scan(&count); err != nil || count != 0 {
		t.Fatalf("rolled-back events stored: %d, %v", count, err)
	}
}

func testCoalesced(t *testing.T, c Case) {
	e := NewEnv(t, c)
	all := e.Observe(nil)
	topics := []string{"coalesce.a", "coalesce.b", "coalesce.c"}
	err := wakeup.RunInTx(e.Ctx, pgtest.Require(t), e.W, outbox.PublisherConfig{Schema: e.Schema}, func(tx pgx.Tx, pub *outbox.Publisher) error {
		// 100 events of 3 topics: 40 one statement at a time, 60 in multi-row statements.
		for i := range 40 {
			if err := pub.Publish(topics[i%3], outbox.NewMessage([]byte(`{}`))); err != nil {
				return err
			}
		}
		for _, topic := range topics {
			msgs := make([]*message.Message, 20)
			for i := range msgs {
				msgs[i] = outbox.NewMessage([]byte(`{}`))
			}
			if err := pub.Publish(topic, msgs...); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	e.Commit("sentinel")
	pgtest.Eventually(t, 5*time.Second, "sentinel signal", func() bool { return all.Seen("sentinel") == 1 })
	want := map[string]int{"coalesce.a": 1, "coalesce.b": 1, "coalesce.c": 1, "sentinel": 1}
	got := all.Topics()
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("signals per topic = %v, want %v", got, want)
	}
}

func testFilter(t *testing.T, c Case) {
	e := NewEnv(t, c)
	all := e.Observe(nil)
	relay := e.StartRelay("topic.a")
	e.Commit("topic.b")
	pgtest.Eventually(t, 5*time.Second, "signal of topic.b", func() bool { return all.Seen("topic.b") == 1 })
	// One Hub dispatch offers a signal to every listener: wait for the relay's filter call.
	pgtest.Eventually(t, 5*time.Second, "relay offered topic.b", func() bool { return len(relay.Offered("topic.b")) == 1 })
	if got := relay.Offered("topic.b"); got[0] {
		t.Fatal("relay of topic.a accepted a signal of topic.b")
	}
	e.Barrier()
	if n := relay.Signals(); n != 1 {
		t.Fatalf("relay's channel received %d values, want 1 (the subscribed signal only)", n)
	}
	// A signal of its own topic: exactly one more poll, which claims the event. A poll caused
	// by topic.b would have run before it (the relay was idle) and shows as a fourth. The
	// count is read before the ack: until then the relay cannot poll again.
	e.Commit("topic.a")
	select {
	case m := <-relay.Msgs:
		n := relay.Claims()
		m.Ack()
		if got := m.Metadata.Get(outbox.MetadataTopic); got != "topic.a" {
			t.Fatalf("delivered %q", got)
		}
		if n != 3 {
			t.Fatalf("relay polled %d times by the delivery of topic.a, want 3", n)
		}
	case <-time.After(time.Second):
		t.Fatal("topic.a not delivered within 1s")
	}
	if got := relay.Offered("topic.a"); len(got) != 1 || !got[0] {
		t.Fatalf("relay filter results for topic.a = %v", got)
	}
}

func testReconnect(t *testing.T, c Case) {
	e := NewEnv(t, c)
	relay := e.StartRelay("reconnect.events")
	c.Kill(t, e.W)
	start := time.Now()
	// Committed while the listener is away (it waits ReconnectBackoff before reconnecting):
	// the signal is lost; the relay polls once the listener subscribed again.
	e.Commit("reconnect.events")
	e.Commit("reconnect.events")
	for range 2 {
		relay.Receive(t, 5*time.Second)
	}
	took := time.Since(start)
	if took >= 5*time.Second {
		t.Fatalf("delivery after the kill took %s", took)
	}
	if c.KillLosesSignals {
		if got := relay.Offered("reconnect.events"); len(got) != 0 {
			t.Fatalf("the relay's listener received %d signals of the events committed while it was away; want them lost (the scenario needs the commit to land during the backoff)", len(got))
		}
	}
	t.Logf("kill → both events delivered: %s (reconnect backoff %s, poll interval %s)", took, ReconnectBackoff, RelayPollInterval)
}

// claimLogger counts the subscriber's claims (its Trace "outbox: claimed" lines) and keeps
// its last error.
type claimLogger struct {
	n       *atomic.Int64
	lastErr *atomic.Value
}

func (l claimLogger) Error(msg string, err error, _ watermill.LogFields) {
	l.lastErr.Store(fmt.Sprintf("%s: %v", msg, err))
}
func (l claimLogger) Info(string, watermill.LogFields)  {}
func (l claimLogger) Debug(string, watermill.LogFields) {}
func (l claimLogger) Trace(msg string, _ watermill.LogFields) {
	if msg == "outbox: claimed" {
		l.n.Add(1)
	}
}
func (l claimLogger) With(watermill.LogFields) watermill.LoggerAdapter { return l }
