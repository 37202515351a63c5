package prom_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/metrics"
	"github.com/watermill-outbox/outbox/metrics/prom"
)

// failingPublisher answers every Publish with an error.
type failingPublisher struct{}

func (failingPublisher) Publish(string, ...*message.Message) error { return errors.New("down") }
func (failingPublisher) Close() error                              { return nil }

// TestDestinationSeriesBounded: 1,000 webhook hosts give MaxDestinations+1 series of
// outbox_destination_unavailable and of the destination-call histogram (the first hosts, then
// "other"), and the "other" gauge is 1 while any host folded into it is down.
func TestDestinationSeriesBounded(t *testing.T) {
	const hosts, limit = 1000, 10
	reg := prometheus.NewRegistry()
	rec, err := prom.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	obs, err := metrics.New(rec, metrics.Config{MaxDestinations: limit})
	if err != nil {
		t.Fatal(err)
	}
	h := obs.Hooks()
	host := func(i int) string { return fmt.Sprintf("webhook host%d.example:443", i) }
	since := time.Now()
	outage := func(i int, up bool) {
		info := outbox.OutageInfo{Destination: host(i), Since: since}
		if up {
			info.Ended = time.Now()
		}
		h.OnOutage(info)
	}
	for i := range hosts {
		outage(i, false)
		if err := obs.Publisher(failingPublisher{}, host(i)).Publish("t", message.NewMessage("1", nil)); err == nil {
			t.Fatal("Publish succeeded")
		}
	}
	// series returns the named metric's series: label values joined → gauge value or
	// histogram count.
	series := func(name string) map[string]float64 {
		t.Helper()
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]float64{}
		for _, mf := range mfs {
			if mf.GetName() != name {
				continue
			}
			for _, m := range mf.GetMetric() {
				var k string
				for _, lp := range m.GetLabel() {
					k += lp.GetValue() + ";"
				}
				if m.GetHistogram() != nil {
					out[k] = float64(m.GetHistogram().GetSampleCount())
				} else {
					out[k] = m.GetGauge().GetValue()
				}
			}
		}
		return out
	}
	check := func(down map[string]float64) {
		t.Helper()
		got := series("outbox_destination_unavailable")
		if len(got) != limit+1 {
			t.Fatalf("outbox_destination_unavailable: %d series, want %d", len(got), limit+1)
		}
		for k, v := range down {
			if got[k] != v {
				t.Fatalf("outbox_destination_unavailable{%s} = %v, want %v", k, got[k], v)
			}
		}
	}
	calls := series("outbox_destination_call_duration_seconds")
	if len(calls) != limit+1 || calls["other;error;"] != hosts-limit || calls[host(0)+";error;"] != 1 || calls[host(limit-1)+";error;"] != 1 {
		t.Fatalf("destination calls: %d series (want %d), other %v (want %d), first %v, last own %v (want 1)",
			len(calls), limit+1, calls["other;error;"], hosts-limit, calls[host(0)+";error;"], calls[host(limit-1)+";error;"])
	}
	check(map[string]float64{host(0) + ";": 1, host(limit-1) + ";": 1, "other;": 1})
	for i := limit; i < hosts-1; i++ {
		outage(i, true)
	}
	check(map[string]float64{"other;": 1}) // host 999 is still down
	outage(hosts-1, true)
	check(map[string]float64{"other;": 0, host(0) + ";": 1})
	outage(limit+5, false)
	check(map[string]float64{"other;": 1})
	outage(0, true)
	check(map[string]float64{"other;": 1, host(0) + ";": 0})
	outage(limit+5, true)
	check(map[string]float64{"other;": 0, host(0) + ";": 0, host(1) + ";": 1})
}
