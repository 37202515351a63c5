package prom_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/watermill-outbox/outbox/metrics/prom"
)

// TestNewFailureRegistersNothing: when New fails because reg already holds one of the
// outbox names (another library's outbox_pending_events, a half-migrated setup), the
// collectors registered before the failing one stay in reg: the process then exports
// outbox_relay_up 0 (and empty outbox_* series) that nothing ever updates, and
// `min(outbox_relay_up) == 0` (README's OutboxRelayNotReady) fires for good.
// TestNewFailureRegistersNothing: a New that fails on a name already taken registers none of its
// collectors; it left 8 behind, outbox_relay_up 0 among them, that nothing updates.
func TestNewFailureRegistersNothing(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(prometheus.NewGauge(prometheus.GaugeOpts{Name: "outbox_pending_events", Help: "someone else's"}))
	if _, err := prom.New(reg); err == nil {
		t.Fatal("New succeeded with outbox_pending_events taken")
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, mf := range mfs {
		if mf.GetName() != "outbox_pending_events" {
			left = append(left, mf.GetName())
		}
	}
	if len(left) != 0 {
		t.Errorf("after a failed New, reg exports %d outbox series nothing updates: %v", len(left), left)
	}
}
