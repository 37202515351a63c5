package webhook_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/forwarder"
	"github.com/watermill-outbox/outbox/internal/pgtest"
	"github.com/watermill-outbox/outbox/webhook"
)

// tenantReceiver is one tenant's webhook endpoint: it records the events it accepted (in
// arrival order, per key) and answers 503 while down.
type tenantReceiver struct {
	srv     *httptest.Server
	down    atomic.Bool
	refused atomic.Int64

	mu    sync.Mutex
	seen  map[string]bool
	order map[string][]string // ordering key → "n" metadata in arrival order
}

func newTenantReceiver(t *testing.T) *tenantReceiver {
	r := &tenantReceiver{seen: map[string]bool{}, order: map[string][]string{}}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if r.down.Load() {
			r.refused.Add(1)
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		id := req.Header.Get(webhook.HeaderEventID)
		r.mu.Lock()
		if !r.seen[id] {
			r.seen[id] = true
			k := req.Header.Get(http.CanonicalHeaderKey(outbox.MetadataOrderingKey))
			r.order[k] = append(r.order[k], req.Header.Get("N"))
		}
		r.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *tenantReceiver) accepted() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.seen)
}

// TestOneTenantDownOthersFlow: one topic fanned out to 50 tenants' webhooks (Config.Target per
// message) through a real relay on PostgreSQL, with SubscriberConfig.Destination =
// Publisher.Destination. While one tenant answers 503, the other 49 receive every event; the
// down tenant's events are held (its receiver sees only probes, no attempt is counted) and
// arrive in key order once it answers again. Without per-destination outages the topic pauses
// and the others get one probe event per backoff.
func TestOneTenantDownOthersFlow(t *testing.T) {
	pool := pgtest.Require(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	schema := outbox.SchemaConfig{Table: pgtest.Table(t)}
	if err := outbox.Migrate(ctx, pool, schema); err != nil {
		t.Fatal(err)
	}
	const tenants, perTenant = 50, 40
	rcv := make([]*tenantReceiver, tenants)
	for i := range rcv {
		rcv[i] = newTenantReceiver(t)
	}
	rcv[0].down.Store(true)
	pub, err := webhook.NewPublisher(webhook.Config{
		AllowedPrefixes: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")},
		Target: func(_ string, msg *message.Message) (webhook.Target, error) {
			var i int
			if _, err := fmt.Sscan(msg.Metadata.Get("tenant"), &i); err != nil || i < 0 || i >= tenants {
				return webhook.Target{}, fmt.Errorf("no tenant %q", msg.Metadata.Get("tenant"))
			}
			return webhook.Target{URL: rcv[i].srv.URL + "/hook"}, nil
		},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	writer, err := outbox.NewPublisher(pool, outbox.PublisherConfig{Schema: schema}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var msgs []*message.Message
	for n := range perTenant {
		for i := range tenants {
			m := outbox.NewMessage([]byte(`{}`))
			m.Metadata.Set("tenant", fmt.Sprint(i))
			m.Metadata.Set("N", fmt.Sprintf("%03d", n))
			outbox.SetOrderingKey(m, fmt.Sprintf("t%02d-k%d", i, n%3))
			msgs = append(msgs, m)
		}
	}
	if err := writer.Publish("tenants", msgs...); err != nil {
		t.Fatal(err)
	}
	sub, err := outbox.NewSubscriber(pool, outbox.SubscriberConfig{Schema: schema, Destination: pub.Destination, PollInterval: 50 * time.Millisecond,
		BatchSize: 200, UnavailableBackoff: 100 * time.Millisecond, UnavailableBackoffMax: time.Second}, nil)
	if err != nil {
		t.Fatal(err)
	}
	fwd, err := forwarder.New(sub, pub, forwarder.Config{SubscribeTopic: "tenants"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- fwd.Run(ctx) }()
	defer func() {
		_ = fwd.Close()
		<-done
	}()

	pgtest.Eventually(t, time.Minute, "the 49 healthy tenants' events delivered while tenant 0 is down", func() bool {
		for _, r := range rcv[1:] {
			if r.accepted() != perTenant {
				return false
			}
		}
		return true
	})
	if n := rcv[0].accepted(); n != 0 {
		t.Fatalf("tenant 0 accepted %d events while answering 503", n)
	}
	probes := rcv[0].refused.Load()
	rcv[0].down.Store(false)
	pgtest.Eventually(t, time.Minute, "tenant 0's events delivered after it is back", func() bool { return rcv[0].accepted() == perTenant })
	t.Logf("tenant 0 refused %d requests (probes) for its %d events while down", probes, perTenant)
	if probes >= perTenant {
		t.Errorf("tenant 0 got %d requests while down, want fewer than its %d events (held, probed)", probes, perTenant)
	}
	for i, r := range rcv {
		r.mu.Lock()
		for k, ns := range r.order {
			if len(ns) != perTenant/3 && len(ns) != perTenant/3+1 || !slices.IsSorted(ns) {
				t.Errorf("tenant %d key %s: %v, want its events once each in order", i, k, ns)
			}
		}
		r.mu.Unlock()
	}
	var attempts int
	if err := pool.QueryRow(ctx, fmt.Sprintf(`SELECT coalesce(sum(attempts), 0) FROM %q`, schema.Table)).Scan(&attempts); err != nil {
		t.Fatal(err)
	}
	if attempts != 0 {
		t.Errorf("%d attempts counted, want 0 (an unavailable tenant's events are held, not failed)", attempts)
	}
}
