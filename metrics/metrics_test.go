package metrics

import (
	"errors"
	"testing"
	"time"

	"github.com/watermill-outbox/outbox"
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
