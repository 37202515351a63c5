package wal

import "github.com/prometheus/client_golang/prometheus"

// Collector exports a Source's Stats to Prometheus, read at each scrape, labelled by slot:
//
//   - outbox_wal_slot_lag_bytes: pg_current_wal_lsn() - confirmed_flush_lsn (the log not yet
//     delivered or parked), as of the last StatusInterval.
//   - outbox_wal_slot_lag_seconds: age of the oldest committed change not yet delivered or
//     parked (0 when none is pending).
//   - outbox_wal_retained_bytes: pg_current_wal_lsn() - restart_lsn, the WAL the slot keeps.
//   - outbox_wal_safe_wal_bytes: bytes that can still be written before max_slot_wal_keep_size
//     invalidates the slot (-1: unbounded).
//   - outbox_wal_over_bound: 1 while the retained WAL is over MaxRetainedWAL (changes are
//     parked without trying the destination).
//   - outbox_wal_connected: 1 while a replication session streams.
//   - outbox_wal_delivered_total, outbox_wal_parked_total, outbox_wal_retries_total (for an
//     OutboxRelay's Source, "parked" counts the events it left to the polling relay).
//   - outbox_wal_fallbacks_total: lost slots after which an OutboxRelay polled the outbox
//     table; outbox_wal_from_table: 1 while it does.
//
// Register it with prometheus.Register(wal.NewCollector(src)). Safe for concurrent use.
type Collector struct {
	src   *Source
	descs map[string]*prometheus.Desc
}

// NewCollector returns the Collector of src.
func NewCollector(src *Source) *Collector {
	help := map[string]string{
		"outbox_wal_slot_lag_bytes":   "Log not yet delivered or parked: pg_current_wal_lsn() - confirmed_flush_lsn.",
		"outbox_wal_slot_lag_seconds": "Age of the oldest committed change not yet delivered or parked.",
		"outbox_wal_retained_bytes":   "WAL retained by the slot: pg_current_wal_lsn() - restart_lsn.",
		"outbox_wal_safe_wal_bytes":   "Bytes that can be written before max_slot_wal_keep_size invalidates the slot (-1: unbounded).",
		"outbox_wal_over_bound":       "1 while the retained WAL is over MaxRetainedWAL and changes are parked.",
		"outbox_wal_connected":        "1 while a replication session streams the slot.",
		"outbox_wal_delivered_total":  "Changes published to the destination.",
		"outbox_wal_parked_total":     "Changes parked in the outbox table.",
		"outbox_wal_retries_total":    "Failed Publish calls that were retried.",
		"outbox_wal_fallbacks_total":  "Lost slots after which the outbox-table mode delivered from the table by polling.",
		"outbox_wal_from_table":       "1 while the outbox-table mode delivers from the table by polling (its slot lost).",
	}
	c := &Collector{src: src, descs: map[string]*prometheus.Desc{}}
	for name, h := range help {
		c.descs[name] = prometheus.NewDesc(name, h, nil, prometheus.Labels{"slot": src.cfg.Slot})
	}
	return c
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	st := c.src.Stats()
	b := func(v bool) float64 {
		if v {
			return 1
		}
		return 0
	}
	gauge := func(name string, v float64) {
		ch <- prometheus.MustNewConstMetric(c.descs[name], prometheus.GaugeValue, v)
	}
	counter := func(name string, v uint64) {
		ch <- prometheus.MustNewConstMetric(c.descs[name], prometheus.CounterValue, float64(v))
	}
	gauge("outbox_wal_slot_lag_bytes", float64(st.Slot.LagBytes))
	gauge("outbox_wal_slot_lag_seconds", st.LagSeconds)
	gauge("outbox_wal_retained_bytes", float64(st.Slot.RetainedBytes))
	gauge("outbox_wal_safe_wal_bytes", float64(st.Slot.SafeWALSize))
	gauge("outbox_wal_over_bound", b(st.OverBound))
	gauge("outbox_wal_connected", b(st.Connected))
	counter("outbox_wal_delivered_total", st.Delivered)
	counter("outbox_wal_parked_total", st.Parked)
	counter("outbox_wal_retries_total", st.Retries)
	counter("outbox_wal_fallbacks_total", st.Fallbacks)
	gauge("outbox_wal_from_table", b(st.FromTable))
}
