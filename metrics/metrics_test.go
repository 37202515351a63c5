package metrics

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/health"
)

func TestConfigValidate(t *testing.T) {
	for _, c := range []struct {
		cfg   Config
		field string
	}{
		{Config{}, ""},
		{Config{TopicPatterns: []string{"orders.*", "*"}, MaxTopics: 3, BacklogInterval: time.Second}, ""},
		{Config{TopicPatterns: []string{"a*b"}}, "metrics.Config.TopicPatterns[0]"},
		{Config{MaxTopics: -1}, "metrics.Config.MaxTopics"},
		{Config{DestinationPatterns: []string{"webhook *", "kafka"}, MaxDestinations: 5}, ""},
		{Config{DestinationPatterns: []string{"kafka", "web*hook"}}, "metrics.Config.DestinationPatterns[1]"},
		{Config{MaxDestinations: -1}, "metrics.Config.MaxDestinations"},
		{Config{BacklogInterval: time.Millisecond}, "metrics.Config.BacklogInterval"},
		{Config{BacklogInterval: -time.Second}, "metrics.Config.BacklogInterval"},
	} {
		err := c.cfg.Validate()
		var ce *outbox.ConfigError
		if c.field == "" && err != nil || c.field != "" && (!errors.As(err, &ce) || ce.Field != c.field) {
			t.Errorf("%+v: Validate = %v, want field %q", c.cfg, err, c.field)
		}
	}
	if _, err := New(nil, Config{}); !errors.Is(err, outbox.ErrConfig) {
		t.Errorf("nil recorder: %v", err)
	}
}

func TestLabel(t *testing.T) {
	o, _ := New(Multi(), Config{TopicPatterns: []string{"orders.created", "orders.*"}})
	for topic, want := range map[string]string{"orders.created": "orders.created", "orders.x": "orders.*", "pay": OtherTopic} {
		if got := o.Label(topic); got != want {
			t.Errorf("Label(%q) = %q, want %q", topic, got, want)
		}
	}
	o, _ = New(Multi(), Config{MaxTopics: 2})
	for _, c := range [][2]string{{"a", "a"}, {"b", "b"}, {"c", OtherTopic}, {"a", "a"}} {
		if got := o.Label(c[0]); got != c[1] {
			t.Errorf("Label(%q) = %q, want %q", c[0], got, c[1])
		}
	}
}

func TestDestinationLabel(t *testing.T) {
	o, _ := New(Multi(), Config{DestinationPatterns: []string{"kafka", "webhook *"}, MaxDestinations: 1})
	for dest, want := range map[string]string{"kafka": "kafka", "webhook a:443": "webhook *", "redis x": OtherDestination, "": OtherDestination} {
		if got := o.DestinationLabel(dest); got != want {
			t.Errorf("DestinationLabel(%q) = %q, want %q", dest, got, want)
		}
	}
	o, _ = New(Multi(), Config{MaxDestinations: 2, MaxTopics: 1})
	for _, c := range [][2]string{{"webhook a", "webhook a"}, {"", ""}, {"webhook b", OtherDestination}, {"webhook a", "webhook a"}} {
		if got := o.DestinationLabel(c[0]); got != c[1] {
			t.Errorf("DestinationLabel(%q) = %q, want %q", c[0], got, c[1])
		}
	}
	if got := o.Label("t"); got != "t" { // topics have their own cap
		t.Errorf("Label(t) = %q after 3 destinations, want t", got)
	}
	o, _ = New(Multi(), Config{})
	for i := range DefaultMaxDestinations + 1 {
		want := fmt.Sprint(i)
		if i == DefaultMaxDestinations {
			want = OtherDestination
		}
		if got := o.DestinationLabel(fmt.Sprint(i)); got != want {
			t.Fatalf("DestinationLabel(%d) = %q with the default cap, want %q", i, got, want)
		}
	}
}

// TestOutageFoldedIntoOther: destinations past MaxDestinations share the label "other", which
// is down while any of them is (each counted across subscriptions), up when all are.
func TestOutageFoldedIntoOther(t *testing.T) {
	r := &outageRec{Recorder: Multi(), down: map[string]bool{}}
	o, _ := New(r, Config{MaxDestinations: 1})
	h := o.Hooks()
	start := time.Now()
	step := func(dest string, up bool, want string) {
		t.Helper()
		i := outbox.OutageInfo{Destination: dest, Since: start}
		if up {
			i.Ended = time.Now()
		}
		h.OnOutage(i)
		if got := fmt.Sprint(r.down); got != want {
			t.Fatalf("after %s up=%v: %s, want %s", dest, up, got, want)
		}
	}
	step("a", false, "map[a:true]")
	step("b", false, "map[a:true other:true]")
	step("c", false, "map[a:true other:true]")
	step("c", false, "map[a:true other:true]") // a second subscription sees c down
	step("b", true, "map[a:true other:true]")
	step("c", true, "map[a:true other:true]")
	step("b", true, "map[a:true other:true]") // an end without a start changes nothing
	step("c", true, "map[a:true other:false]")
	step("a", true, "map[a:false other:false]")
	if len(o.outages) != 0 || len(o.down) != 0 {
		t.Errorf("state kept after every outage ended: outages %v, down %v", o.outages, o.down)
	}
}

func TestComposeHooks(t *testing.T) {
	var order []string
	h := ComposeHooks(
		outbox.Hooks{OnFailed: func(outbox.FailedInfo) { order = append(order, "a") }},
		outbox.Hooks{},
		outbox.Hooks{OnFailed: func(outbox.FailedInfo) { order = append(order, "b") }, OnMark: func(outbox.MarkInfo) { order = append(order, "m") }},
	)
	h.OnFailed(outbox.FailedInfo{})
	h.OnMark(outbox.MarkInfo{})
	if h.OnDelivered != nil || len(order) != 3 || order[0] != "a" || order[1] != "b" || order[2] != "m" {
		t.Errorf("calls %v, OnDelivered nil: %v", order, h.OnDelivered == nil)
	}
}

type outageRec struct {
	Recorder
	down map[string]bool
}

func (r *outageRec) DestinationUnavailable(d string, down bool) { r.down[d] = down }

func TestOutageAcrossSubscriptions(t *testing.T) {
	r := &outageRec{Recorder: Multi(), down: map[string]bool{}}
	o, _ := New(r, Config{})
	h := o.Hooks()
	start := time.Now()
	h.OnOutage(outbox.OutageInfo{Destination: "kafka", Since: start})
	h.OnOutage(outbox.OutageInfo{Destination: "kafka", Since: start})
	h.OnOutage(outbox.OutageInfo{Destination: "kafka", Since: start, Ended: time.Now()})
	if !r.down["kafka"] {
		t.Fatal("destination up while one subscription still sees it down")
	}
	h.OnOutage(outbox.OutageInfo{Destination: "kafka", Since: start, Ended: time.Now()})
	if r.down["kafka"] {
		t.Fatal("destination down after every outage ended")
	}
}

type writeRec struct {
	Recorder
	mu       sync.Mutex
	written  []string // topic, or "dup:"+topic
	invalid  []string
	outcomes []string
	subs     [][2]int
}

func (r *writeRec) Written(topic string, dup bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if dup {
		topic = "dup:" + topic
	}
	r.written = append(r.written, topic)
}
func (r *writeRec) WriteInvalid(field string) {
	r.mu.Lock()
	r.invalid = append(r.invalid, field)
	r.mu.Unlock()
}
func (r *writeRec) WriteCall(_ time.Duration, outcome string) {
	r.mu.Lock()
	r.outcomes = append(r.outcomes, outcome)
	r.mu.Unlock()
}
func (r *writeRec) Subscriptions(running, total int) {
	r.mu.Lock()
	r.subs = append(r.subs, [2]int{running, total})
	r.mu.Unlock()
}

// TestOnWrite: each call's events under their topic label (duplicates apart), the field of a
// validation error, and the outcome of every call.
func TestOnWrite(t *testing.T) {
	r := &writeRec{Recorder: Multi()}
	o, _ := New(r, Config{TopicPatterns: []string{"orders.*"}})
	o.OnWrite(outbox.WriteInfo{Events: []outbox.Event{{Topic: "orders.a"}, {Topic: "x"}, {Topic: "orders.b", Duplicate: true}}})
	o.OnWrite(outbox.WriteInfo{Err: fmt.Errorf("wrapped: %w", &outbox.ValidationError{Field: "headers"})})
	o.OnWrite(outbox.WriteInfo{Err: errors.New("connection refused")})
	if got, want := fmt.Sprint(r.written, r.invalid, r.outcomes), "[orders.* other dup:orders.*] [headers] [ok invalid error]"; got != want {
		t.Errorf("recorded %s, want %s", got, want)
	}
}

// TestWatchSubscriptions: 0 of 2 at once, then each start and stop in order; it returns when
// both stopped.
func TestWatchSubscriptions(t *testing.T) {
	r := &writeRec{Recorder: Multi()}
	o, _ := New(r, Config{})
	run1, done1, run2, done2 := make(chan struct{}), make(chan struct{}), make(chan struct{}), make(chan struct{})
	returned := make(chan struct{})
	go func() {
		defer close(returned)
		o.WatchSubscriptions(t.Context(), health.Runner{Running: run1, Done: done1}, health.Runner{Running: run2, Done: done2})
	}()
	step := func(ch chan struct{}, want string) {
		t.Helper()
		if ch != nil {
			close(ch)
		}
		deadline := time.Now().Add(5 * time.Second)
		for {
			r.mu.Lock()
			got := fmt.Sprint(r.subs)
			r.mu.Unlock()
			if got == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("subscriptions %s, want %s", got, want)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	step(nil, "[[0 2]]")
	step(run1, "[[0 2] [1 2]]")
	step(run2, "[[0 2] [1 2] [2 2]]")
	step(done1, "[[0 2] [1 2] [2 2] [1 2]]")
	step(done2, "[[0 2] [1 2] [2 2] [1 2] [0 2]]")
	select {
	case <-returned:
	case <-time.After(5 * time.Second):
		t.Fatal("WatchSubscriptions did not return after both runners stopped")
	}
}

// heldRec records Held calls (a HeldRecorder).
type heldRec struct {
	Recorder
	held []string
}

func (r *heldRec) Held(destination, reason string) { r.held = append(r.held, destination+"/"+reason) }

// TestHeldCountedUnderBoundedLabel: OnHeld reaches a HeldRecorder under the destination's
// bounded label (past MaxDestinations: other), through Multi too; a Recorder without Held is
// skipped.
func TestHeldCountedUnderBoundedLabel(t *testing.T) {
	r := &heldRec{Recorder: Multi()}
	o, _ := New(Multi(r), Config{MaxDestinations: 1})
	h := o.Hooks()
	h.OnHeld(outbox.HeldInfo{Destination: "webhook a", Reason: outbox.HeldRate})
	h.OnHeld(outbox.HeldInfo{Destination: "webhook b", Reason: outbox.HeldOutage})
	h.OnHeld(outbox.HeldInfo{Destination: "webhook a", Reason: outbox.HeldInFlight})
	if got, want := fmt.Sprint(r.held), "[webhook a/rate other/outage webhook a/in_flight]"; got != want {
		t.Errorf("held %s, want %s", got, want)
	}
	plain, _ := New(Multi(), Config{})
	plain.Hooks().OnHeld(outbox.HeldInfo{Destination: "x", Reason: outbox.HeldRate}) // no HeldRecorder: nothing to call
}
