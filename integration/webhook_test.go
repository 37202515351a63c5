package integration_test

// End-to-end tests of webhook delivery through the forwarder: outbox → relay → signed HTTP
// POST to an httptest receiver on 127.0.0.1 (the built-in guard allows loopback only because
// the test lists 127.0.0.0/8). Names here start with "wh".

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/forwarder"
	"github.com/watermill-outbox/outbox/internal/pgtest"
	"github.com/watermill-outbox/outbox/webhook"
)

var whCtx = context.Background()

// whReceiver records every request it accepts, verifying the signature on the captured bytes.
type whReceiver struct {
	secret   []byte
	failKey  atomic.Value // string: answer 500 for this ordering key
	mu       sync.Mutex
	seqByKey map[string][]int64
	bodies   map[string]string // event id -> body
	bad      []string
	requests atomic.Int64
}

func (r *whReceiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	r.requests.Add(1)
	body, _ := io.ReadAll(req.Body)
	key := req.Header.Get(outbox.MetadataOrderingKey)
	if fk, _ := r.failKey.Load().(string); fk != "" && key == fk {
		http.Error(w, "receiver down for "+key, http.StatusInternalServerError)
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := webhook.Verify(r.secret, body, req.Header.Get("Outbox-Signature")); err != nil {
		r.bad = append(r.bad, fmt.Sprintf("%s: %v", req.Header.Get(webhook.HeaderEventID), err))
	}
	seq, _ := strconv.ParseInt(req.Header.Get(outbox.MetadataSequence), 10, 64)
	r.seqByKey[key] = append(r.seqByKey[key], seq)
	r.bodies[req.Header.Get(webhook.HeaderEventID)] = string(body)
	w.WriteHeader(http.StatusNoContent)
}

func whPublisher(t *testing.T, url string, secret []byte, onResult func(context.Context, webhook.Result)) *webhook.Publisher {
	t.Helper()
	pub, err := webhook.NewPublisher(webhook.Config{
		URL:             url,
		Secret:          string(secret),
		AllowedPrefixes: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")},
		Timeout:         5 * time.Second,
		OnResult:        onResult,
	}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	return pub
}

func whSubscriber(t *testing.T, schema outbox.SchemaConfig) *outbox.Subscriber {
	t.Helper()
	sub, err := outbox.NewSubscriber(pgtest.Require(t), outbox.SubscriberConfig{
		Schema: schema, PollInterval: 20 * time.Millisecond, BatchSize: 100, MaxRunPerKey: 10,
		RetryBase: 20 * time.Millisecond, RetryMax: 100 * time.Millisecond, MaxAttempts: 1000,
		LeaseDuration: 10 * time.Second, DeliveryTimeout: 6 * time.Second,
	}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Close() })
	return sub
}

func whCount(t *testing.T, q string, args ...any) int {
	t.Helper()
	var n int
	if err := pgtest.Require(t).QueryRow(whCtx, q, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestWebhookEndToEnd: 500 events over 20 keys reach the receiver in per-key order with valid
// signatures over byte-identical bodies; a receiver failing one key holds only that key until
// it recovers.
func TestWebhookEndToEnd(t *testing.T) {
	pool := pgtest.Require(t)
	schema := outbox.SchemaConfig{Table: pgtest.Table(t)}
	if err := outbox.Migrate(whCtx, pool, schema); err != nil {
		t.Fatal(err)
	}
	secret := []byte("integration-s3cr3t-key")
	rcv := &whReceiver{secret: secret, seqByKey: map[string][]int64{}, bodies: map[string]string{}}
	rcv.failKey.Store("k07")
	srv := httptest.NewServer(rcv)
	defer srv.Close()

	pub := mustOutboxPublisher(t, schema)
	const n, keys = 500, 20
	payloads := map[string]string{}
	for i := range n {
		body := fmt.Sprintf(`{"i": %d, "html": "<a href='x'>&amp;</a>", "big": 123456789012345678901234567890, "ü": "ü"}`, i)
		m := outbox.NewMessage([]byte(body))
		outbox.SetOrderingKey(m, fmt.Sprintf("k%02d", i%keys))
		m.Metadata.Set("Trace-Id", "t-"+strconv.Itoa(i))
		if err := pub.Publish("orders", m); err != nil {
			t.Fatal(err)
		}
		payloads[m.UUID] = body
	}
	fwd, err := forwarder.New(whSubscriber(t, schema), whPublisher(t, srv.URL, secret, nil), forwarder.Config{}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	go fwd.Run(whCtx)
	defer fwd.Close()

	// Every key but k07 completes while the receiver refuses k07.
	pgtest.Eventually(t, 60*time.Second, "other keys published", func() bool {
		return whCount(t, fmt.Sprintf(`SELECT count(*) FROM %q WHERE published_at IS NOT NULL`, schema.Table)) == n-n/keys
	})
	if got := whCount(t, fmt.Sprintf(`SELECT count(*) FROM %q WHERE ordering_key = 'k07' AND published_at IS NOT NULL`, schema.Table)); got != 0 {
		t.Fatalf("%d events of the failing key published", got)
	}
	if got := whCount(t, fmt.Sprintf(`SELECT count(*) FROM %q WHERE ordering_key = 'k07' AND attempts > 0`, schema.Table)); got != 1 {
		t.Fatalf("%d events of the failing key attempted; only its head may be", got)
	}
	rcv.failKey.Store("")
	pgtest.Eventually(t, 60*time.Second, "all published after recovery", func() bool {
		return whCount(t, fmt.Sprintf(`SELECT count(*) FROM %q WHERE published_at IS NOT NULL`, schema.Table)) == n
	})

	rcv.mu.Lock()
	defer rcv.mu.Unlock()
	if len(rcv.bad) > 0 {
		t.Fatalf("%d signatures failed verification, first: %s", len(rcv.bad), rcv.bad[0])
	}
	if len(rcv.bodies) != n {
		t.Fatalf("receiver accepted %d distinct events, want %d", len(rcv.bodies), n)
	}
	// The receiver gets exactly the stored payload (the default JSON column keeps the bytes
	// written; nothing re-encodes them on the way out, so no HTML escaping and big numbers
	// intact).
	rows, err := pool.Query(whCtx, fmt.Sprintf(`SELECT id::text, payload::text FROM %q`, schema.Table))
	if err != nil {
		t.Fatal(err)
	}
	stored := map[string]string{}
	for rows.Next() {
		var id, p string
		rows.Scan(&id, &p)
		stored[id] = p
	}
	rows.Close()
	for id := range payloads {
		if rcv.bodies[id] != stored[id] || !strings.Contains(stored[id], "<a href='x'>&amp;</a>") || !strings.Contains(stored[id], "123456789012345678901234567890") {
			t.Fatalf("event %s: body %q, want byte-identical stored payload %q", id, rcv.bodies[id], stored[id])
		}
	}
	for key, seqs := range rcv.seqByKey {
		if len(seqs) != n/keys {
			t.Fatalf("key %s: %d accepted deliveries, want %d", key, len(seqs), n/keys)
		}
		for i := 1; i < len(seqs); i++ {
			if seqs[i] <= seqs[i-1] {
				t.Fatalf("key %s out of order: %v", key, seqs)
			}
		}
	}
}

// TestWebhookResultColumn records every attempt's result in a jsonb column of the outbox row:
// an over-long body is cut to 4000 characters and a NUL becomes U+FFFD.
func TestWebhookResultColumn(t *testing.T) {
	pool := pgtest.Require(t)
	schema := outbox.SchemaConfig{Table: pgtest.Table(t), ExtraColumns: []outbox.Column{{Name: "webhook_result", Type: "JSONB NULL"}}}
	if err := outbox.Migrate(whCtx, pool, schema); err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if calls.Add(1) == 1 {
			w.WriteHeader(http.StatusBadGateway)
			io.WriteString(w, "bad\x00gateway "+strings.Repeat("x", 5000))
			return
		}
		w.WriteHeader(http.StatusOK)
		io.WriteString(w, "ok")
	}))
	defer srv.Close()
	exec := func(ctx context.Context, sql string, args ...any) error {
		_, err := pool.Exec(ctx, sql, args...)
		return err
	}
	var recErr atomic.Value
	onResult, err := webhook.ColumnRecorder(exec, schema.Table, "webhook_result", func(_ context.Context, _ webhook.Result, err error) { recErr.Store(err) })
	if err != nil {
		t.Fatal(err)
	}
	m := outbox.NewMessage([]byte(`{"n":1}`))
	if err := mustOutboxPublisher(t, schema).Publish("t", m); err != nil {
		t.Fatal(err)
	}

	// First attempt: the 502 is recorded, truncated and cleaned.
	deliver := func() error {
		return whPublisher(t, srv.URL, []byte("integration-result-key"), onResult).Publish("t", message.NewMessage(m.UUID, m.Payload))
	}
	if err := deliver(); err == nil {
		t.Fatal("502 must be a failure")
	}
	var status int
	var body string
	if err := pool.QueryRow(whCtx, fmt.Sprintf(`SELECT (webhook_result->>'status_code')::int, webhook_result->>'body' FROM %q`, schema.Table)).Scan(&status, &body); err != nil {
		t.Fatal(err)
	}
	if status != http.StatusBadGateway || len([]rune(body)) != 4000 || !strings.HasPrefix(body, "bad\uFFFDgateway xxx") {
		t.Fatalf("recorded status %d, body of %d characters starting %q", status, len([]rune(body)), body[:20])
	}
	// Second attempt: success replaces it.
	if err := deliver(); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(whCtx, fmt.Sprintf(`SELECT (webhook_result->>'status_code')::int, webhook_result->>'body' FROM %q`, schema.Table)).Scan(&status, &body); err != nil {
		t.Fatal(err)
	}
	if status != http.StatusOK || body != "ok" {
		t.Fatalf("recorded %d %q", status, body)
	}
	if e := recErr.Load(); e != nil {
		t.Fatalf("recording failed: %v", e)
	}
}

func mustOutboxPublisher(t *testing.T, schema outbox.SchemaConfig) *outbox.Publisher {
	t.Helper()
	p, err := outbox.NewPublisher(pgtest.Require(t), outbox.PublisherConfig{Schema: schema}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return p
}
