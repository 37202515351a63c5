package integration_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/forwarder"
	"github.com/watermill-outbox/outbox/webhook"
)

// TestWebhookPermanentDeadLettersAtFirstAttempt: the receiver answers 422 to events whose body
// says "reject", and the publisher's PermanentStatuses lists 422: such an event is
// dead-lettered at its first attempt (one request, no retries), its key's later events stay
// pending without an attempt and never reach the receiver, every other event is delivered
// once.
func TestWebhookPermanentDeadLettersAtFirstAttempt(t *testing.T) {
	e := fwdNewEnv(t)
	var mu sync.Mutex
	got := map[string]int{} // event id → requests
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		got[r.Header.Get(webhook.HeaderEventID)]++
		mu.Unlock()
		if strings.Contains(string(body), "reject") {
			http.Error(w, "unprocessable", http.StatusUnprocessableEntity)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	pub, err := webhook.NewPublisher(webhook.Config{URL: srv.URL, AllowedPrefixes: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")},
		PermanentStatuses: []int{422}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	others := e.seed(30, 6, func(int) string { return "fwd.webhook" })
	first := e.add("fwd.webhook", "key-x", nil)
	rejected := e.add("fwd.webhook", "key-x", map[string]any{"note": "reject"})
	later := []*fwdEvent{e.add("fwd.webhook", "key-x", nil)}
	e.run(e.subscriber(outbox.SubscriberConfig{}), pub, forwarder.Config{})

	e.waitSettled(30*time.Second, len(others)+1, 1)
	e.checkDeadAtFirstAttempt([]*fwdEvent{rejected}, webhook.ErrUnexpectedStatus)
	e.checkMarkedOnce(append(fwdIDs(others), first.id))
	e.checkUntouched(later)
	mu.Lock()
	defer mu.Unlock()
	if got[rejected.id] != 1 || got[later[0].id] != 0 {
		t.Errorf("requests: rejected event %d (want 1), the event after it %d (want 0)", got[rejected.id], got[later[0].id])
	}
}
