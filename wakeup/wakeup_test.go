package wakeup

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/watermill-outbox/outbox"
)

func recv(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case _, ok := <-ch:
		if !ok {
			t.Fatalf("%s: channel closed", what)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("%s: no value within 5s", what)
	}
}

func empty(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
		t.Fatalf("%s: unexpected value", what)
	default:
	}
}

func TestHub(t *testing.T) {
	h := NewHub()
	ctx, cancel := context.WithCancel(context.Background())
	a := h.Listen(ctx, func(topic string) bool { return topic == "a" })
	all := h.Listen(ctx, nil)
	empty(t, a, "not subscribed yet")

	h.SetSubscribed(true)
	recv(t, a, "subscribed signal")
	recv(t, all, "subscribed signal")
	h.SetSubscribed(true) // no change: no signal
	empty(t, a, "subscribed twice")

	h.Dispatch("b")
	empty(t, a, "filtered topic")
	recv(t, all, "nil accept takes every topic")

	h.Dispatch("a")
	h.Dispatch("a")
	recv(t, a, "own topic")
	empty(t, a, "two signals coalesce into one value")

	h.Dispatch("")
	recv(t, a, "empty topic wakes everyone")
	recv(t, all, "empty topic wakes everyone")

	late := h.Listen(ctx, func(string) bool { return false })
	recv(t, late, "listener arriving while subscribed")
	h.DispatchAll()
	recv(t, late, "DispatchAll ignores accept")

	h.SetSubscribed(false)
	h.SetSubscribed(true)
	recv(t, a, "resubscribed signal")

	if n := h.Listeners(); n != 3 {
		t.Fatalf("Listeners = %d", n)
	}
	cancel()
	for _, ch := range []<-chan struct{}{a, all, late} {
		for range ch { // drain, then closed
		}
	}
	if n := h.Listeners(); n != 0 {
		t.Fatalf("Listeners after cancel = %d", n)
	}
	h.Dispatch("a") // no panic on closed channels

	done, c2 := context.WithCancel(context.Background())
	c2()
	if _, ok := <-h.Listen(done, nil); ok {
		t.Fatal("Listen with a done context returned an open channel")
	}
}

type sendRecorder struct {
	mu      sync.Mutex
	batches [][]string
	fail    int // fail this many sends first
	sent    chan struct{}
}

func (r *sendRecorder) send(_ context.Context, topics []string) error {
	r.mu.Lock()
	defer func() {
		r.mu.Unlock()
		r.sent <- struct{}{}
	}()
	if r.fail > 0 {
		r.fail--
		return errors.New("transport down")
	}
	r.batches = append(r.batches, slices.Clone(topics))
	return nil
}

func (r *sendRecorder) get() [][]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.batches)
}

func TestCoalescer(t *testing.T) {
	r := &sendRecorder{sent: make(chan struct{}, 100)}
	// A long window: the first signal goes out at once, the rest wait for the window's end.
	c := NewCoalescer(300*time.Millisecond, r.send, Reconnect{}, nil)
	start := time.Now()
	c.Signal("b", "a")
	recv(t, r.sent, "leading-edge send")
	if took := time.Since(start); took >= 300*time.Millisecond {
		t.Fatalf("first send took %s: it must not wait for the window", took)
	}
	c.Signal("a")
	c.Signal("c", "a")
	c.Signal()
	recv(t, r.sent, "trailing send")
	if took := time.Since(start); took < 300*time.Millisecond {
		t.Fatalf("second send after %s, within the window", took)
	}
	want := [][]string{{"a", "b"}, {"a", "c"}}
	if got := r.get(); !slices.EqualFunc(got, want, slices.Equal[[]string]) {
		t.Fatalf("batches = %v, want %v", got, want)
	}
	// Close sends what is pending, then drops later signals.
	c.Signal("d")
	c.Signal("e")
	_ = c.Close()
	_ = c.Close()
	c.Signal("f")
	got := r.get()
	if last := got[len(got)-1]; !slices.Contains(last, "e") || slices.Contains(last, "f") {
		t.Fatalf("batches after Close = %v", got)
	}
}

func TestCoalescerBoundsPending(t *testing.T) {
	r := &sendRecorder{sent: make(chan struct{}, 100)}
	block, entered := make(chan struct{}), make(chan struct{}, 10)
	c := NewCoalescer(time.Millisecond, func(ctx context.Context, topics []string) error {
		entered <- struct{}{}
		<-block
		return r.send(ctx, topics)
	}, Reconnect{}, nil)
	c.Signal("first")
	recv(t, entered, "send of the first signal") // the goroutine now blocks in send
	for i := range MaxPendingTopics + 1 {
		c.Signal(strconv.Itoa(i))
	}
	close(block)
	recv(t, r.sent, "first")
	recv(t, r.sent, "collapsed")
	_ = c.Close()
	if got := r.get(); len(got) != 2 || !slices.Equal(got[1], []string{""}) {
		t.Fatalf("batches = %d, last %v; want the overflow collapsed to the empty topic", len(got), got[len(got)-1])
	}
}

func TestCoalescerBacksOffAfterFailure(t *testing.T) {
	r := &sendRecorder{sent: make(chan struct{}, 100), fail: 1}
	logs := &captureLogger{}
	c := NewCoalescer(time.Millisecond, r.send, Reconnect{InitialBackoff: 200 * time.Millisecond}, logs)
	defer c.Close()
	c.Signal("lost")
	recv(t, r.sent, "failed send")
	failedAt := time.Now()
	c.Signal("next")
	recv(t, r.sent, "send after backoff")
	if took := time.Since(failedAt); took < 150*time.Millisecond {
		t.Fatalf("retried after %s, before the backoff", took)
	}
	if got := r.get(); len(got) != 1 || !slices.Equal(got[0], []string{"next"}) {
		t.Fatalf("batches = %v: a failed batch is dropped, not resent", got)
	}
	if n := logs.count("wakeup: signals lost (relays will find the events at their next poll)", false); n != 1 {
		t.Fatalf("WARN logs of the failure = %d", n)
	}
}

func TestRunListenerLogsErrorAfterFiveFailures(t *testing.T) {
	logs := &captureLogger{}
	hub := NewHub()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	attempts := make(chan int, 100)
	n := 0
	done := make(chan struct{})
	go func() {
		defer close(done)
		RunListener(ctx, hub, Reconnect{InitialBackoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond}, logs, "test",
			func(ctx context.Context, subscribed func()) error {
				n++
				attempts <- n
				if n == 1 {
					subscribed() // one good session that then drops
					if !hub.Subscribed() {
						t.Error("hub not subscribed inside the session")
					}
				}
				if n == 8 {
					<-ctx.Done() // connected for good
					return ctx.Err()
				}
				return errors.New("connection refused")
			})
	}()
	for a := range attempts {
		if a == 8 {
			break
		}
	}
	cancel()
	<-done
	if hub.Subscribed() {
		t.Fatal("hub still subscribed after the listener stopped")
	}
	// Attempts 1..7 failed (the first after subscribing): failures 1-4 at WARN, 5-7 at ERROR.
	if w, e := logs.count("wakeup: listener disconnected, reconnecting", false), logs.count("wakeup: listener disconnected, reconnecting", true); w != 4 || e != 3 {
		t.Fatalf("WARN logs %d, ERROR logs %d; want 4 and 3", w, e)
	}
}

func TestReconnect(t *testing.T) {
	r := Reconnect{InitialBackoff: 100 * time.Millisecond, MaxBackoff: time.Second}
	for _, tc := range []struct {
		failures int
		want     time.Duration
	}{{1, 100 * time.Millisecond}, {2, 200 * time.Millisecond}, {4, 800 * time.Millisecond}, {5, time.Second}, {50, time.Second}} {
		if got := r.backoff(tc.failures, 0.5); got != tc.want {
			t.Errorf("backoff(%d) = %s, want %s", tc.failures, got, tc.want)
		}
		if lo, hi := r.backoff(tc.failures, 0), r.backoff(tc.failures, 1); lo != tc.want*8/10 || hi != tc.want*12/10 {
			t.Errorf("backoff(%d) jitter range %s..%s", tc.failures, lo, hi)
		}
	}
	if d := (Reconnect{}).WithDefaults(); d.InitialBackoff != DefaultInitialBackoff || d.MaxBackoff != DefaultMaxBackoff {
		t.Errorf("defaults = %+v", d)
	}
	if d := (Reconnect{InitialBackoff: time.Minute}).WithDefaults(); d.MaxBackoff != time.Minute {
		t.Errorf("MaxBackoff default below InitialBackoff: %+v", d)
	}
	for _, tc := range []struct {
		r     Reconnect
		field string
	}{
		{Reconnect{}, ""},
		{Reconnect{InitialBackoff: -1}, "x.InitialBackoff"},
		{Reconnect{MaxBackoff: -1}, "x.MaxBackoff"},
		{Reconnect{InitialBackoff: time.Second, MaxBackoff: time.Millisecond}, "x.MaxBackoff"},
	} {
		err := tc.r.Validate("x")
		var ce *outbox.ConfigError
		if tc.field == "" && err != nil || tc.field != "" && (!errors.As(err, &ce) || ce.Field != tc.field) {
			t.Errorf("%+v: Validate = %v, want field %q", tc.r, err, tc.field)
		}
	}
}

type recordingWakeup struct {
	*InProcess
	mu      sync.Mutex
	signals [][]string
}

func (w *recordingWakeup) Signal(topics ...string) {
	w.mu.Lock()
	w.signals = append(w.signals, topics)
	w.mu.Unlock()
}

func (w *recordingWakeup) PublisherConfig(cfg outbox.PublisherConfig) outbox.PublisherConfig {
	cfg.NotifyChannel = "configured"
	return cfg
}

func TestCollector(t *testing.T) {
	w := &recordingWakeup{InProcess: NewInProcess()}
	c := NewCollector(w)
	var userCalls [][]string
	cfg := c.PublisherConfig(outbox.PublisherConfig{OnInserted: func(topics []string) { userCalls = append(userCalls, topics) }})
	if cfg.NotifyChannel != "configured" {
		t.Fatalf("PublisherConfigurer not applied: %+v", cfg)
	}
	cfg.OnInserted([]string{"a", "b"})
	cfg.OnInserted([]string{"b", "c"})
	if len(userCalls) != 2 {
		t.Fatalf("user OnInserted called %d times", len(userCalls))
	}
	if got := c.Topics(); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Fatalf("Topics = %v", got)
	}
	c.Discard()
	c.Committed()
	if len(w.signals) != 0 {
		t.Fatalf("signals after Discard: %v", w.signals)
	}
	cfg.OnInserted([]string{"x", "x", "y"})
	c.Committed()
	c.Committed()
	if len(w.signals) != 1 || !slices.Equal(w.signals[0], []string{"x", "y"}) {
		t.Fatalf("signals = %v, want one [x y]", w.signals)
	}
}

func TestInProcessClose(t *testing.T) {
	w := NewInProcess()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch := w.Listen(ctx, nil)
	recv(t, ch, "subscribed signal")
	_ = w.Close()
	w.Signal("a")
	empty(t, ch, "signal after Close")
	cancel()
	if _, ok := <-ch; ok {
		t.Fatal("channel not closed when its context ended")
	}
}

func TestTransportWakeupLifecycle(t *testing.T) {
	started := make(chan struct{}, 10)
	closed := 0
	w := FromTransport(Transport{
		Name: "test",
		Send: func(context.Context, []string) error { return nil },
		Listen: func(ctx context.Context, hub *Hub, subscribed func()) error {
			started <- struct{}{}
			subscribed()
			<-ctx.Done()
			return ctx.Err()
		},
		Close: func() error { closed++; return nil },
	})
	select {
	case <-started:
		t.Fatal("listener started before any Listen call")
	default:
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch1 := w.Listen(ctx, nil)
	ch2 := w.Listen(ctx, nil)
	recv(t, ch1, "subscribed")
	recv(t, ch2, "subscribed")
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	_ = w.Close()
	if len(started) != 1 || closed != 1 {
		t.Fatalf("sessions started %d, Transport.Close called %d; want 1 and 1", len(started), closed)
	}
	// After Close, Listen still returns a channel that stays open until its context ends.
	ch3 := w.Listen(ctx, nil)
	empty(t, ch3, "after Close")
	cancel()
	for range ch3 {
	}
}

// captureLogger records messages with whether they were logged at ERROR.
type captureLogger struct {
	mu   sync.Mutex
	msgs []logged
}

type logged struct {
	msg   string
	error bool
}

func (l *captureLogger) add(msg string, isErr bool) {
	l.mu.Lock()
	l.msgs = append(l.msgs, logged{msg, isErr})
	l.mu.Unlock()
}

func (l *captureLogger) count(msg string, isErr bool) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, m := range l.msgs {
		if m.msg == msg && m.error == isErr {
			n++
		}
	}
	return n
}

func (l *captureLogger) Error(msg string, _ error, _ watermill.LogFields) { l.add(msg, true) }
func (l *captureLogger) Info(msg string, _ watermill.LogFields)           { l.add(msg, false) }
func (l *captureLogger) Debug(string, watermill.LogFields)                {}
func (l *captureLogger) Trace(string, watermill.LogFields)                {}
func (l *captureLogger) With(watermill.LogFields) watermill.LoggerAdapter { return l }
