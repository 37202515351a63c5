package prom_test

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/metrics/prom"
	"github.com/watermill-outbox/outbox/webhook"
)

// TestDestinationCallBucketsCoverTimeouts: outbox_destination_call_duration_seconds uses
// DurationBuckets (largest finite bound 4.77s), but a destination call legitimately lasts up
// to webhook.DefaultTimeout (10s) or the Subscriber's DeliveryTimeout (30s). Every slower call
// lands in +Inf, and histogram_quantile (the dashboard's "Destination call latency (p99)")
// then reports 4.77s: a webhook answering in 9s, or every call timing out at 30s, reads as
// "p99 4.8s".
// TestDestinationCallBucketsCoverTimeouts: the destination-call histogram has buckets up to the
// documented call timeouts (webhook 10 s, DeliveryTimeout 30 s); its largest bound was 4.8 s, so
// histogram_quantile reported 4.8 s for every slower call.
func TestDestinationCallBucketsCoverTimeouts(t *testing.T) {
	reg := prometheus.NewRegistry()
	rec, err := prom.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []time.Duration{webhook.DefaultTimeout - time.Second, outbox.DefaultDeliveryTimeout - time.Second} {
		rec.DestinationCall("webhook", d, false)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "outbox_destination_call_duration_seconds" {
			continue
		}
		h := mf.GetMetric()[0].GetHistogram()
		b := h.GetBucket()
		top := b[len(b)-1] // largest finite bound
		if top.GetUpperBound() < outbox.DefaultDeliveryTimeout.Seconds() || top.GetCumulativeCount() != h.GetSampleCount() {
			t.Errorf("largest finite bucket le=%gs holds %d of %d calls (9s and 29s): histogram_quantile(0.99) reports %gs for them",
				top.GetUpperBound(), top.GetCumulativeCount(), h.GetSampleCount(), top.GetUpperBound())
		}
		return
	}
	t.Fatal("no outbox_destination_call_duration_seconds")
}
