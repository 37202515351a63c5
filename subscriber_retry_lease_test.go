package outbox_test

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/internal/pgtest"
)

// TestEveryRetryDueWakesRelay: two events fail in one batch with different backoffs
// (A has 2 earlier attempts: 4×RetryBase; B none: 1×RetryBase). Each must be tried again
// when its own backoff ends (README: "the relay wakes when the retry is due"), not at the
// next PollInterval (1 h here).
func TestEveryRetryDueWakesRelay(t *testing.T) {
	b := pgBackend(t)
	schema := b.table(t)
	b.publishKeys(t, schema, "t", 0, []string{"", ""})
	// A = the first event: two failures already, so its next backoff is 4×RetryBase.
	b.exec(t, fmt.Sprintf(`UPDATE %q SET attempts = 2 WHERE sequence = (SELECT min(sequence) FROM %q)`, schema.Table, schema.Table))
	cfg := fastCfg(schema)
	cfg.PollInterval, cfg.RetryBase, cfg.RetryMax = time.Hour, 300*time.Millisecond, 5*time.Second
	sub := b.newSub(t, cfg)
	ch := mustSubscribe(t, sub, "t")
	var mu sync.Mutex
	seen := map[string]int{}
	(&recorder{}).consume(ch, func(msg *message.Message) error {
		mu.Lock()
		seen[msg.UUID]++
		n := seen[msg.UUID]
		mu.Unlock()
		if n == 1 {
			return errors.New("first try fails")
		}
		return nil
	})
	// A is due ~1.2 s after its failure, B ~0.3 s after: both should be published within a few s.
	pgtest.Eventually(t, 8*time.Second, "both retried when due, with a 1 h PollInterval", func() bool {
		return b.count(t, fmt.Sprintf(`SELECT count(*) FROM %q WHERE published_at IS NOT NULL`, schema.Table)) == 2
	})
}

// TestLeaseLostReportedOnceWhenRenewalFindsIt: a lease taken over is reported once
// (Hooks.OnLeaseLost, the metrics' lease-lost count), by the renewal that finds it; the batch's
// refused mark reported the same events again.
func TestLeaseLostReportedOnceWhenRenewalFindsIt(t *testing.T) {
	b := pgBackend(t)
	schema := b.table(t)
	b.publishKeys(t, schema, "t", 0, []string{""})
	cfg := fastCfg(schema)
	cfg.LeaseDuration, cfg.DeliveryTimeout = time.Second, 900*time.Millisecond
	var mu sync.Mutex
	var lost []outbox.LeaseLostInfo
	cfg.Hooks.OnLeaseLost = func(i outbox.LeaseLostInfo) { mu.Lock(); lost = append(lost, i); mu.Unlock() }
	sub := b.newSub(t, cfg)
	ch := mustSubscribe(t, sub, "t")
	msg := <-ch
	b.exec(t, fmt.Sprintf(`UPDATE %q SET leased_by = 'other#0123456789ab#1', lease_until = now() + interval '1 minute'`, schema.Table))
	select {
	case <-msg.Context().Done(): // the renewal found the lease lost
	case <-time.After(3 * time.Second):
		t.Fatal("message context not canceled after the lease was lost")
	}
	outbox.SetNackError(msg, msg.Context().Err())
	msg.Nack()
	sub.Close() // waits for the batch's mark
	mu.Lock()
	defer mu.Unlock()
	total := 0
	for _, l := range lost {
		total += l.Events
	}
	if len(lost) != 1 || total != 1 {
		t.Fatalf("OnLeaseLost calls %+v (%d events), want one call with 1 event", lost, total)
	}
}

// TestRelayNameUnstorableIsConfigError: a RelayName leased_by cannot store (NUL, invalid UTF-8)
// is a configuration error; it was accepted, and every claim then failed.
func TestRelayNameUnstorableIsConfigError(t *testing.T) {
	for _, name := range []string{"relay\x00a", "relay\xff"} {
		cfg := outbox.SubscriberConfig{Schema: outbox.SchemaConfig{Table: "watermill_outbox"}, RelayName: name}
		if err := cfg.Validate(); err == nil {
			t.Errorf("RelayName %q: Validate() = nil, want a *ConfigError", name)
		}
	}
}
