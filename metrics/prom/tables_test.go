package prom_test

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/internal/pgtest"
	"github.com/watermill-outbox/outbox/metrics"
	"github.com/watermill-outbox/outbox/metrics/prom"
)

// TestMultiSubscriberTableLabels: per-table metrics of a MultiSubscriber, each table's
// Observer on a Recorder registered through prometheus.WrapRegistererWith with its table as a
// label, all in one registry: deliveries and backlog gauges come out per table.
func TestMultiSubscriberTableLabels(t *testing.T) {
	pool := pgtest.Require(t)
	ctx := t.Context()
	tables := []string{pgtest.Table(t), pgtest.Table(t)}
	for i, tb := range tables {
		schema := outbox.SchemaConfig{Table: tb}
		if err := outbox.Migrate(ctx, pool, schema); err != nil {
			t.Fatal(err)
		}
		pub, err := outbox.NewPublisher(pool, outbox.PublisherConfig{Schema: schema}, nil)
		if err != nil {
			t.Fatal(err)
		}
		for n := range 3 + i { // 3 events in the first table, 4 in the second
			if _, err := pub.Enqueue(ctx, outbox.EventInput{Topic: "orders.created", Payload: n}); err != nil {
				t.Fatal(err)
			}
		}
	}
	reg := prometheus.NewRegistry()
	observers := map[string]*metrics.Observer{}
	m, err := outbox.NewMultiSubscriber(pool, outbox.MultiSubscriberConfig{Tables: tables,
		Subscriber: outbox.SubscriberConfig{PollInterval: 20 * time.Millisecond},
		HooksFor: func(table string) outbox.Hooks {
			rec, err := prom.New(prometheus.WrapRegistererWith(prometheus.Labels{"table": table}, reg))
			if err != nil {
				t.Fatal(err)
			}
			obs, err := metrics.New(rec, metrics.Config{})
			if err != nil {
				t.Fatal(err)
			}
			observers[table] = obs
			return obs.Hooks()
		}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	value := func(name, table string) float64 {
		fams, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range fams {
			if f.GetName() != name {
				continue
			}
			for _, mt := range f.GetMetric() {
				for _, l := range mt.GetLabel() {
					if l.GetName() == "table" && l.GetValue() == table {
						if mt.Counter != nil {
							return mt.GetCounter().GetValue()
						}
						return mt.GetGauge().GetValue()
					}
				}
			}
		}
		return -1
	}
	sample := func(want ...float64) {
		t.Helper()
		for i, tb := range tables {
			if err := observers[tb].SampleOnce(ctx, m.Subscriber(tb)); err != nil {
				t.Fatal(err)
			}
			if v := value("outbox_pending_events", tb); v != want[i] {
				t.Fatalf("table %s: pending gauge %v, want %v", tb, v, want[i])
			}
		}
	}
	sample(3, 4)
	ch, err := m.Subscribe(ctx, "*")
	if err != nil {
		t.Fatal(err)
	}
	for range 7 {
		select {
		case msg := <-ch:
			msg.Ack()
		case <-time.After(30 * time.Second):
			t.Fatal("events not delivered within 30s")
		}
	}
	pgtest.Eventually(t, 10*time.Second, "deliveries counted per table", func() bool {
		return value("outbox_delivered_total", tables[0]) == 3 && value("outbox_delivered_total", tables[1]) == 4
	})
	sample(0, 0)
}
