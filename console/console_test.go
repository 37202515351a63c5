package console_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/console"
	"github.com/watermill-outbox/outbox/internal/pgtest"
)

const chromiumPath = "/usr/bin/chromium"

// browser starts a headless Chromium with a fresh profile and returns its context. Without
// Chromium the test is skipped, or fails under CI=true.
func browser(t *testing.T) context.Context {
	t.Helper()
	if _, err := os.Stat(chromiumPath); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s missing and CI=true (install Debian's chromium; .ci/run does): %v", chromiumPath, err)
		}
		t.Skipf("%s missing (apt-get install chromium; in CI this fails)", chromiumPath)
	}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromiumPath),
		chromedp.Flag("headless", true),
		chromedp.NoSandbox,
		chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("no-first-run", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1200, 900),
	}
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelB := chromedp.NewContext(actx)
	ctx, cancelC := context.WithTimeout(ctx, 90*time.Second)
	t.Cleanup(func() { cancelC(); cancelB(); cancelA() })
	if err := chromedp.Do(ctx); err != nil { // starts the browser
		t.Fatalf("start chromium: %v", err)
	}
	return ctx
}

// env is one test's table, console and server.
type env struct {
	pool   *pgxpool.Pool
	schema outbox.SchemaConfig
	sub    *outbox.Subscriber
	srv    *httptest.Server
	con    *console.Console
}

func newEnv(t *testing.T, cfg console.Config) *env {
	t.Helper()
	pool := pgtest.Require(t)
	ctx := context.Background()
	e := &env{pool: pool, schema: outbox.SchemaConfig{Table: pgtest.Table(t)}}
	if err := outbox.Migrate(ctx, pool, e.schema); err != nil {
		t.Fatal(err)
	}
	cfg.DB, cfg.Schema = pool, e.schema
	con, err := console.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := con.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	e.con = con
	e.sub, err = outbox.NewSubscriber(pool, outbox.SubscriberConfig{Schema: e.schema}, nil)
	if err != nil {
		t.Fatal(err)
	}
	e.srv = httptest.NewServer(con)
	t.Cleanup(func() {
		e.srv.Close()
		_ = con.Close()
		_ = e.sub.Close()
		_, _ = pool.Exec(context.Background(), `DROP TABLE IF EXISTS "`+e.schema.Table+`", "`+e.schema.Table+`_console_audit"`)
	})
	return e
}

// publish writes one event of topic (with ordering key key unless "") and returns its sequence.
func (e *env) publish(t *testing.T, topic, key, payload string) {
	t.Helper()
	pub, err := outbox.NewPublisher(e.pool, outbox.PublisherConfig{Schema: e.schema}, nil)
	if err != nil {
		t.Fatal(err)
	}
	msg := outbox.NewMessage([]byte(payload))
	if key != "" {
		outbox.SetOrderingKey(msg, key)
	}
	if err := pub.Publish(topic, msg); err != nil {
		t.Fatal(err)
	}
}

func (e *env) exec(t *testing.T, q string, args ...any) int64 {
	t.Helper()
	tag, err := e.pool.Exec(context.Background(), strings.ReplaceAll(q, "{t}", `"`+e.schema.Table+`"`), args...)
	if err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return tag.RowsAffected()
}

func (e *env) count(t *testing.T, q string, args ...any) int64 {
	t.Helper()
	var n int64
	if err := e.pool.QueryRow(context.Background(), strings.ReplaceAll(q, "{t}", `"`+e.schema.Table+`"`), args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return n
}

// audit returns the audit log's rows as "action affected error" lines, oldest first.
func (e *env) audit(t *testing.T) []string {
	t.Helper()
	rows, err := e.pool.Query(context.Background(), `SELECT "action", "affected", COALESCE("error", ''), "actor", "target" FROM "`+e.schema.Table+`_console_audit" ORDER BY "id"`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var a, errText, actor, target string
		var n int64
		if err := rows.Scan(&a, &n, &errText, &actor, &target); err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(actor, "token@127.0.0.1:") {
			t.Errorf("audit actor %q, want token@127.0.0.1:port", actor)
		}
		out = append(out, fmt.Sprintf("%s %d %s", a, n, errText))
	}
	return out
}

// login logs the browser in with the operator token.
func login(t *testing.T, ctx context.Context, base, token string) {
	t.Helper()
	if err := chromedp.Do(ctx,
		chromedp.Navigate(base+"/login"),
		chromedp.SendKeys(chromedp.CSS(`#login input[name=token]`), token),
		chromedp.Submit(chromedp.CSS(`#login input[name=token]`)),
		chromedp.WaitVisible(chromedp.CSS(`#mode.ok`)),
	); err != nil {
		t.Fatalf("login: %v", err)
	}
}

func text(t *testing.T, ctx context.Context, sel string) string {
	t.Helper()
	s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
	if err != nil {
		t.Fatalf("text of %s: %v", sel, err)
	}
	return strings.TrimSpace(s)
}

// screenshot saves the visible part of the page as docs/images/console-<name>.png when
// OUTBOX_CONSOLE_SCREENSHOTS=1 (so that ordinary runs rewrite no file).
func screenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	if os.Getenv("OUTBOX_CONSOLE_SCREENSHOTS") != "1" {
		return
	}
	png, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	if err != nil {
		t.Fatalf("screenshot %s: %v", name, err)
	}
	if err := os.WriteFile(filepath.Join("..", "docs", "images", "console-"+name+".png"), png, 0o644); err != nil {
		t.Fatal(err)
	}
}

// relay runs a relay over e's table whose handler fails every event with a payload of
// "poison" (recording the error for last_error) and acks the others, recording the payloads
// it acked per ordering key, in order.
type relay struct {
	mu    sync.Mutex
	acked map[string][]string
}

func (r *relay) keyAcked(key string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.acked[key]...)
}

func startRelay(t *testing.T, e *env) *relay {
	t.Helper()
	return startRelayOn(t, e.pool, e.schema)
}

// startRelayOn is startRelay on any database handle and table.
func startRelayOn(t *testing.T, db any, schema outbox.SchemaConfig) *relay {
	t.Helper()
	sub, err := outbox.NewSubscriber(db, outbox.SubscriberConfig{Schema: schema, PollInterval: 50 * time.Millisecond,
		RetryBase: time.Hour, RetryMax: time.Hour, MaxAttempts: 10}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	msgs, err := sub.Subscribe(ctx, "*")
	if err != nil {
		t.Fatal(err)
	}
	r := &relay{acked: map[string][]string{}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for msg := range msgs {
			if strings.Contains(string(msg.Payload), "poison") {
				outbox.SetNackError(msg, errors.New("payments said 422: card declined"))
				msg.Nack()
				continue
			}
			r.mu.Lock()
			k := msg.Metadata.Get("outbox-ordering-key")
			r.acked[k] = append(r.acked[k], string(msg.Payload))
			r.mu.Unlock()
			msg.Ack()
		}
	}()
	t.Cleanup(func() { cancel(); _ = sub.Close(); <-done })
	return r
}

// TestBlockedKeySkip: a key held behind a failing head is listed with the head's error;
// "skip" dead-letters the head (out of the key's order) and the key's later events are then
// delivered in order; the audit log records the action.
func TestBlockedKeySkip(t *testing.T) {
	const token = "s3cret-operator-token"
	e := newEnv(t, console.Config{Token: token})
	e.publish(t, "orders.created", "customer-7", `{"n":1,"poison":true}`)
	e.publish(t, "orders.created", "customer-7", `{"n":2}`)
	e.publish(t, "orders.paid", "customer-7", `{"n":3}`)
	e.publish(t, "orders.created", "customer-8", `{"n":1}`)
	r := startRelay(t, e)
	ctx := context.Background()
	pgtest.Eventually(t, 20*time.Second, "customer-7 blocked behind its failed head", func() bool {
		ks, err := e.sub.BlockedKeys(ctx, 10)
		return err == nil && len(ks) == 1 && ks[0].Key == "customer-7" && ks[0].Held == 2 && len(r.keyAcked("customer-8")) == 1
	})

	b := browser(t)
	login(t, b, e.srv.URL, token)
	if err := chromedp.Do(b, chromedp.Navigate(e.srv.URL+"/keys"), chromedp.WaitVisible(chromedp.CSS(`#keys`))); err != nil {
		t.Fatal(err)
	}
	row := text(t, b, `#keys tr[data-key="customer-7"]`)
	for _, want := range []string{"customer-7", "orders.created", "payments said 422: card declined"} {
		if !strings.Contains(row, want) {
			t.Errorf("blocked key row %q lacks %q", row, want)
		}
	}
	if !regexp.MustCompile(`\tin (5[0-9]m[0-9]{2}s|1h0[0-6]m)\t2\t`).MatchString(row) { // RetryBase 1h ± 10% jitter; 2 held
		t.Errorf("blocked key row %q: want the next attempt in about an hour and 2 held events", row)
	}
	screenshot(t, b, "keys")
	if err := chromedp.Do(b, chromedp.Click(chromedp.CSS(`#keys tr[data-key="customer-7"] button.skip`)), chromedp.WaitVisible(chromedp.CSS(`#msg`))); err != nil {
		t.Fatal(err)
	}
	if got := text(t, b, `#msg`); !strings.Contains(got, "skipped") {
		t.Errorf("message after skip: %q", got)
	}
	pgtest.Eventually(t, 20*time.Second, "customer-7's later events delivered", func() bool { return len(r.keyAcked("customer-7")) == 2 })
	if got := r.keyAcked("customer-7"); got[0] != `{"n":2}` || got[1] != `{"n":3}` {
		t.Errorf("customer-7 delivered %v, want n=2 then n=3", got)
	}
	// The head is a dead letter out of its key's order, found by the key filter.
	if n := e.count(t, `SELECT count(*) FROM {t} WHERE "dead_lettered_at" IS NOT NULL AND "ordering_key" IS NULL AND "headers"::jsonb ->> 'outbox-skipped-ordering-key' = 'customer-7' AND "attempts" = 1`); n != 1 {
		t.Errorf("skipped heads: %d, want 1", n)
	}
	if n, err := e.sub.CountDeadLettered(ctx, outbox.DeadLetterFilter{Topics: []string{"*"}, Key: "customer-7"}); err != nil || n != 1 {
		t.Errorf("CountDeadLettered(Key customer-7) = %d, %v; want 1", n, err)
	}
	if err := chromedp.Do(b, chromedp.Navigate(e.srv.URL+"/keys"), chromedp.WaitVisible(chromedp.CSS(`#no-keys`))); err != nil {
		t.Fatal(err)
	}
	// A second skip of the same head answers 409 and is recorded with its error.
	if got := e.audit(t); len(got) != 1 || got[0] != "skip-head 1 " {
		t.Errorf("audit %q, want one skip-head of 1 event", got)
	}
	if err := chromedp.Do(b, chromedp.Navigate(e.srv.URL+"/audit"), chromedp.WaitVisible(chromedp.CSS(`#audit`))); err != nil {
		t.Fatal(err)
	}
	if got := text(t, b, `#audit tbody`); !strings.Contains(got, "skip-head") || !strings.Contains(got, `key="customer-7"`) {
		t.Errorf("audit page: %q", got)
	}
	screenshot(t, b, "audit")
}

// seedDead writes n dead letters of topic (one INSERT of n rows through the Publisher, then
// dead-lettered with error text).
func (e *env) seedDead(t *testing.T, topic string, n int, errText string) {
	t.Helper()
	pub, err := outbox.NewPublisher(e.pool, outbox.PublisherConfig{Schema: e.schema}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < n; i += 500 {
		msgs := make([]*message.Message, 0, 500)
		for j := i; j < min(i+500, n); j++ {
			msgs = append(msgs, outbox.NewMessage([]byte(fmt.Sprintf(`{"order":%d}`, j))))
		}
		if err := pub.Publish(topic, msgs...); err != nil {
			t.Fatal(err)
		}
	}
	e.exec(t, `UPDATE {t} SET "dead_lettered_at" = now() - interval '5 minutes', "attempts" = 5, "last_error" = $1, "last_error_class" = 'failure'
		WHERE "topic" = $2 AND "published_at" IS NULL AND "dead_lettered_at" IS NULL`, errText, topic)
}

// TestRetryAllMatching: the dead-letter page counts every match of a filter (2,500, more than
// a page), the confirmation repeats the count, and the action retries exactly those 2,500 and
// not the dead letters outside the filter; the audit log records it.
func TestRetryAllMatching(t *testing.T) {
	const token = "another-token"
	e := newEnv(t, console.Config{Token: token})
	e.seedDead(t, "billing.invoice", 2500, "smtp: 451 try again later")
	e.seedDead(t, "billing.refund", 40, "smtp: 451 try again later")
	e.seedDead(t, "shipping.label", 60, "label printer offline")

	b := browser(t)
	login(t, b, e.srv.URL, token)
	q := url.Values{"topic": {"billing.*"}, "error": {"SMTP: 451"}}
	e.exec(t, `UPDATE {t} SET "dead_lettered_at" = now() - interval '3 hours' WHERE "topic" = 'billing.refund'`)
	q.Set("after", time.Now().UTC().Add(-time.Hour).Format("2006-01-02T15:04"))
	if err := chromedp.Do(b, chromedp.Navigate(e.srv.URL+"/dead?"+q.Encode()), chromedp.WaitVisible(chromedp.CSS(`#dead-count`))); err != nil {
		t.Fatal(err)
	}
	if got := text(t, b, `#dead-count`); got != "2,500" {
		t.Fatalf("dead-letter count %q, want 2,500", got)
	}
	screenshot(t, b, "dead")
	if err := chromedp.Do(b, chromedp.Click(chromedp.CSS(`#retry-all`)), chromedp.WaitVisible(chromedp.CSS(`#confirm-count`))); err != nil {
		t.Fatal(err)
	}
	if got := text(t, b, `#confirm-count`); got != "2,500" {
		t.Fatalf("confirmation count %q, want 2,500", got)
	}
	screenshot(t, b, "confirm")
	if n := e.count(t, `SELECT count(*) FROM {t} WHERE "dead_lettered_at" IS NULL`); n != 0 {
		t.Fatalf("%d events retried before the confirmation", n)
	}
	if err := chromedp.Do(b, chromedp.Click(chromedp.CSS(`#confirm`)), chromedp.WaitVisible(chromedp.CSS(`#done-count`))); err != nil {
		t.Fatal(err)
	}
	if got := text(t, b, `#done-count`); got != "2,500" {
		t.Errorf("done count %q, want 2,500", got)
	}
	if n := e.count(t, `SELECT count(*) FROM {t} WHERE "topic" = 'billing.invoice' AND "dead_lettered_at" IS NULL AND "attempts" = 0 AND "published_at" IS NULL`); n != 2500 {
		t.Errorf("retried billing.invoice events: %d, want 2500", n)
	}
	if n := e.count(t, `SELECT count(*) FROM {t} WHERE "dead_lettered_at" IS NOT NULL`); n != 100 {
		t.Errorf("dead letters left: %d, want 100 (40 refunds dead 3h ago, 60 shipping labels)", n)
	}
	if got := e.audit(t); len(got) != 1 || got[0] != "retry-dead 2500 " {
		t.Errorf("audit %q, want one retry-dead of 2500", got)
	}
}

// TestReadOnlyRefuses: without a token the console shows no action and refuses a POSTed
// action with 403 (even with a valid CSRF token), changing nothing and recording nothing.
func TestReadOnlyRefuses(t *testing.T) {
	e := newEnv(t, console.Config{})
	e.seedDead(t, "mail.welcome", 3, "boom")
	b := browser(t)
	if err := chromedp.Do(b, chromedp.Navigate(e.srv.URL+"/dead"), chromedp.WaitVisible(chromedp.CSS(`#dead-count`))); err != nil {
		t.Fatal(err)
	}
	if got := text(t, b, `#mode`); got != "read-only" {
		t.Errorf("mode badge %q, want read-only", got)
	}
	if n, err := chromedp.Run(b, chromedp.Evaluate[int](`document.querySelectorAll('#retry-all, #purge-all').length`)); err != nil || n != 0 {
		t.Errorf("action links in read-only mode: %d, %v", n, err)
	}
	// The page's CSP allows no script requests: post a form built in the page, as a button would.
	if err := chromedp.Do(b, chromedp.Evaluate[chromedp.Void](`(() => { const f = document.createElement('form'); f.method = 'post'; f.action = '/dead/apply';
		for (const [k, v] of Object.entries({csrf: document.querySelector('meta[name=csrf]').content, action: 'purge', topic: '*', count: '3'})) {
			const i = document.createElement('input'); i.name = k; i.value = v; f.appendChild(i) }
		document.body.appendChild(f); f.submit() })()`), chromedp.WaitVisible(chromedp.CSS(`#error`))); err != nil {
		t.Fatal(err)
	}
	if got := text(t, b, `#error`); !strings.HasPrefix(got, "403") || !strings.Contains(got, "read-only") {
		t.Errorf("POST in read-only mode answered %q, want 403 naming read-only", got)
	}
	if n := e.count(t, `SELECT count(*) FROM {t} WHERE "dead_lettered_at" IS NOT NULL`); n != 3 {
		t.Errorf("dead letters after a refused purge: %d, want 3", n)
	}
	if got := e.audit(t); len(got) != 0 {
		t.Errorf("audit after a refused action: %q", got)
	}
}

// TestCrossSitePostRefused: a page of another site that submits a purge form to the console
// (in a browser logged in to it) gets 403 and purges nothing; so does a request whose Origin
// is another site even with the right cookies and CSRF token.
func TestCrossSitePostRefused(t *testing.T) {
	const token = "cross-site-token"
	e := newEnv(t, console.Config{Token: token})
	e.seedDead(t, "mail.welcome", 3, "boom")
	target := e.srv.URL + "/dead/apply"
	evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		fmt.Fprintf(w, `<form id="f" method="post" action="%s"><input name="action" value="purge"><input name="topic" value="*"><input name="csrf" value="guess"></form><script>document.getElementById('f').submit()</script>`, target)
	}))
	defer evil.Close()
	evilURL := strings.Replace(evil.URL, "127.0.0.1", "localhost", 1) // another site than 127.0.0.1
	b := browser(t)
	login(t, b, e.srv.URL, token)
	if err := chromedp.Do(b, chromedp.Navigate(evilURL), chromedp.WaitVisible(chromedp.CSS(`#error`))); err != nil {
		t.Fatal(err)
	}
	if got := text(t, b, `#error`); !strings.HasPrefix(got, "403") || !strings.Contains(got, "cross-site") {
		t.Errorf("cross-site form post answered %q, want 403 cross-site", got)
	}
	// The same with the console's own cookies and CSRF token, but another Origin.
	csrf, err := chromedp.Run(b, chromedp.Evaluate[string](`fetch('`+e.srv.URL+`/dead').then(r => r.text()).then(t => t.match(/name="csrf" content="([^"]+)"/)[1])`, chromedp.EvalAwaitPromise))
	if err == nil {
		t.Fatalf("a page of another site read the console (CSRF token %q)", csrf)
	}
	con := e.srv.Client()
	page, err := con.Get(e.srv.URL + "/dead")
	if err != nil {
		t.Fatal(err)
	}
	page.Body.Close()
	cookies := page.Cookies()
	req, _ := http.NewRequest(http.MethodPost, target, strings.NewReader(url.Values{"action": {"purge"}, "topic": {"*"}, "csrf": {"x"}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", "http://evil.example")
	req.Header.Set("Authorization", "Bearer "+token)
	for _, c := range cookies {
		req.AddCookie(c)
	}
	resp, err := con.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("POST with a foreign Origin answered %d, want 403", resp.StatusCode)
	}
	if n := e.count(t, `SELECT count(*) FROM {t} WHERE "dead_lettered_at" IS NOT NULL`); n != 3 {
		t.Errorf("dead letters after refused purges: %d, want 3", n)
	}
	if got := e.audit(t); len(got) != 0 {
		t.Errorf("audit after refused actions: %q", got)
	}
}

// outages is a fixed OutageSource.
type outages []outbox.Outage

func (o outages) Outages() []outbox.Outage { return o }

// relayView is a fixed OutageSource and LimitSource.
type relayView struct {
	outages
	limits map[string]outbox.DestinationLimit
}

func (r relayView) DestinationLimits() map[string]outbox.DestinationLimit { return r.limits }

// seedHour fills e's table as a busy hour leaves it: 6,000 events published over the last
// hour, pending events of three topics (one of them waiting on an outage), a key blocked
// behind a dead-lettered head, leases of two relays, and dead letters with headers.
func (e *env) seedHour(t *testing.T) {
	t.Helper()
	e.exec(t, `INSERT INTO {t} ("id", "topic", "payload", "headers", "created_at", "published_at")
		SELECT gen_random_uuid(), (ARRAY['orders.created','orders.paid','mail.welcome'])[1 + i % 3], '{"n":1}', '{}',
			now() - (i % 3600) * interval '1 second' - (20 + (i * 37) % 400) * interval '1 millisecond' * (1 + (i / 1200)),
			now() - (i % 3600) * interval '1 second'
		FROM generate_series(1, 6000) i`)
	e.exec(t, `INSERT INTO {t} ("id", "topic", "payload", "ordering_key", "created_at")
		SELECT gen_random_uuid(), (ARRAY['orders.created','orders.paid','mail.welcome'])[1 + i % 3], '{"n":2}', CASE WHEN i % 2 = 0 THEN 'customer-' || (i % 50) END, now() - i * interval '1 second'
		FROM generate_series(1, 240) i`)
	e.exec(t, `UPDATE {t} SET "last_error" = 'smtp 127.0.0.1:2525: connection refused', "last_error_class" = 'unavailable' WHERE "sequence" = (SELECT max("sequence") FROM {t} WHERE "topic" = 'mail.welcome')`)
	e.exec(t, `UPDATE {t} SET "lease_until" = now() + interval '40 seconds', "leased_by" = CASE WHEN ("sequence" / 2) % 2 = 0 THEN 'relay-a#0a1b2c3d4e5f#' ELSE 'relay-b#9f8e7d6c5b4a#' END || "sequence"
		WHERE "sequence" IN (SELECT "sequence" FROM {t} WHERE "published_at" IS NULL AND "ordering_key" IS NULL ORDER BY "sequence" LIMIT 30)`)
	e.publish(t, "orders.paid", "customer-900", `{"order":900,"amount":"12.50"}`)
	e.publish(t, "orders.paid", "customer-900", `{"order":901}`)
	e.exec(t, `UPDATE {t} SET "created_at" = now() - interval '14 minutes', "dead_lettered_at" = now() - interval '2 minutes', "attempts" = 5, "last_error" = 'payments said 422: card declined', "last_error_class" = 'failure',
		"headers" = '{"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01","author":"checkout"}'
		WHERE "sequence" = (SELECT min("sequence") FROM {t} WHERE "ordering_key" = 'customer-900')`)
	e.exec(t, `UPDATE {t} SET "attempts" = 2, "last_error" = 'webhook answered 500', "last_error_class" = 'failure', "next_attempt_at" = now() + interval '3 minutes'
		WHERE "sequence" = (SELECT min("sequence") FROM {t} WHERE "ordering_key" = 'customer-4' AND "published_at" IS NULL)`)
}

// TestPages: every page renders a seeded table with the values the API reads (the overview's
// totals and charts, the relays' leases, the blocked keys, a dead letter's detail with its
// payload hidden, the destinations), on a desktop and a phone screen.
func TestPages(t *testing.T) {
	now := time.Now()
	e := newEnv(t, console.Config{Token: "t", Outages: relayView{
		outages: outages{{Destination: "smtp 127.0.0.1:2525", Topics: []string{"mail.welcome"}, Since: now.Add(-95 * time.Second), Refused: 14,
			LastError: errors.New("dial tcp 127.0.0.1:2525: connect: connection refused"), LastProbe: now.Add(-20 * time.Minute), NextProbe: now.Add(10 * time.Minute)}},
		limits: map[string]outbox.DestinationLimit{"webhook 127.0.0.1:8443": {Rate: 100}, "smtp 127.0.0.1:2525": {MaxInFlight: 4}},
	}})
	e.seedHour(t)
	ctx := context.Background()
	total, err := e.sub.Backlog(ctx)
	if err != nil {
		t.Fatal(err)
	}
	b := browser(t)
	login(t, b, e.srv.URL, "t")
	if err := chromedp.Do(b, chromedp.Navigate(e.srv.URL+"/"), chromedp.WaitVisible(chromedp.CSS(`#topics`))); err != nil {
		t.Fatal(err)
	}
	for sel, want := range map[string]string{`#total-pending`: num(total.Pending), `#total-held`: num(total.Held), `#total-dead`: num(total.DeadLettered)} {
		if got := text(t, b, sel); got != want {
			t.Errorf("%s = %q, want %q", sel, got, want)
		}
	}
	bars, err := chromedp.Run(b, chromedp.Evaluate[int](`document.querySelectorAll('svg.chart')[0].querySelectorAll('rect').length`))
	if err != nil || bars < 59 {
		t.Errorf("delivered-per-minute chart has %d bars (%v), want one per minute of the hour", bars, err)
	}
	leases := text(t, b, `#leases tbody`)
	if !strings.Contains(leases, "relay-a\trelay-a#0a1b2c3d4e5f\t15") || !strings.Contains(leases, "relay-b\trelay-b#9f8e7d6c5b4a\t15") {
		t.Errorf("leases table %q, want relay-a and relay-b with 15 events each", leases)
	}
	screenshot(t, b, "overview")
	if err := chromedp.Do(b, chromedp.EmulateViewport(390, 844, chromedp.EmulateMobile)); err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Do(b, chromedp.Navigate(e.srv.URL+"/keys"), chromedp.WaitVisible(chromedp.CSS(`#keys`))); err != nil {
		t.Fatal(err)
	}
	screenshot(t, b, "keys-phone")
	if err := chromedp.Do(b, chromedp.EmulateViewport(1200, 900)); err != nil {
		t.Fatal(err)
	}
	keys := text(t, b, `#keys tbody`)
	if !strings.Contains(keys, "customer-900") || !strings.Contains(keys, "dead-lettered") || !strings.Contains(keys, "customer-4") || !strings.Contains(keys, "webhook answered 500") {
		t.Errorf("blocked keys %q, want customer-900 (dead head) and customer-4 (retrying head)", keys)
	}
	ks, err := e.sub.BlockedKeys(ctx, 10)
	if err != nil || len(ks) != 2 {
		t.Fatalf("BlockedKeys = %v, %v; want 2", ks, err)
	}
	var id string
	for _, k := range ks {
		if k.Key == "customer-900" {
			id = k.Head.ID.String()
		}
	}
	if err := chromedp.Do(b, chromedp.Navigate(e.srv.URL+"/dead/event?id="+id), chromedp.WaitVisible(chromedp.CSS(`#event`))); err != nil {
		t.Fatal(err)
	}
	if got := text(t, b, `#headers`); !strings.Contains(got, "traceparent") {
		t.Errorf("headers %q", got)
	}
	if got := text(t, b, `#payload-hidden`); !strings.Contains(got, "Hidden (30 bytes)") {
		t.Errorf("payload note %q, want it hidden", got)
	}
	if html, _ := chromedp.Run(b, chromedp.OuterHTML(chromedp.CSS(`main`))); strings.Contains(html, "12.50") {
		t.Errorf("the payload reached the page without --show-payloads")
	}
	screenshot(t, b, "event")
	if err := chromedp.Do(b, chromedp.Navigate(e.srv.URL+"/destinations"), chromedp.WaitVisible(chromedp.CSS(`#outages`))); err != nil {
		t.Fatal(err)
	}
	if got := text(t, b, `#outages tbody`); !regexp.MustCompile(`^smtp 127\.0\.0\.1:2525\s+mail\.welcome\s+1m[3-5][0-9]s\s+14\s+20m[0-2][0-9]s ago\s+9m[3-5][0-9]s\s+dial tcp 127\.0\.0\.1:2525: connect: connection refused$`).MatchString(got) {
		t.Errorf("outages %q", got)
	}
	if got := text(t, b, `#limits tbody`); !regexp.MustCompile(`^smtp 127\.0\.0\.1:2525\s+unlimited\s+—\s+4\s+webhook 127\.0\.0\.1:8443\s+100\s+10\s+unlimited$`).MatchString(got) {
		t.Errorf("flow control %q", got)
	}
	screenshot(t, b, "destinations")
	if err := chromedp.Do(b, chromedp.Navigate(e.srv.URL+"/replay"), chromedp.WaitVisible(chromedp.CSS(`#replay-filter`))); err != nil {
		t.Fatal(err)
	}
}

// TestShowPayloads: with ShowPayloads the detail page shows the payload; a console outside a
// relay says n/a on the destinations page.
func TestShowPayloads(t *testing.T) {
	e := newEnv(t, console.Config{ShowPayloads: true})
	e.seedDead(t, "mail.welcome", 1, "boom")
	l, err := e.sub.ListDeadLettered(context.Background(), outbox.DeadLetterFilter{Topics: []string{"*"}}, 1)
	if err != nil || len(l) != 1 {
		t.Fatal(l, err)
	}
	b := browser(t)
	if err := chromedp.Do(b, chromedp.Navigate(e.srv.URL+"/dead/event?id="+l[0].ID.String()), chromedp.WaitVisible(chromedp.CSS(`#payload`))); err != nil {
		t.Fatal(err)
	}
	if got := text(t, b, `#payload`); got != "{\n  \"order\": 0\n}" {
		t.Errorf("payload %q", got)
	}
	if err := chromedp.Do(b, chromedp.Navigate(e.srv.URL+"/destinations"), chromedp.WaitVisible(chromedp.CSS(`#dest-na`))); err != nil {
		t.Fatal(err)
	}
}

func num(n int64) string {
	s := fmt.Sprint(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// TestCSRF: an action needs the form token tied to the request's CSRF cookie — a wrong token
// or no cookie is 403 even with the operator token — and a script with the operator token,
// the cookie and its form token (no Origin) may act.
func TestCSRF(t *testing.T) {
	e := newEnv(t, console.Config{Token: "tok"})
	e.seedDead(t, "mail.welcome", 2, "boom")
	c := e.srv.Client()
	resp, err := c.Get(e.srv.URL + "/dead")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	m := regexp.MustCompile(`name="csrf" content="([^"]+)"`).FindSubmatch(body)
	if m == nil {
		t.Fatal("no CSRF token on the page")
	}
	post := func(csrf string, withCookie bool) int {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, e.srv.URL+"/dead/apply", strings.NewReader(url.Values{"action": {"retry"}, "topic": {"*"}, "csrf": {csrf}}.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Authorization", "Bearer tok")
		if withCookie {
			for _, ck := range resp.Cookies() {
				req.AddCookie(ck)
			}
		}
		r, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		r.Body.Close()
		return r.StatusCode
	}
	if code := post(string(m[1])+"x", true); code != http.StatusForbidden {
		t.Errorf("wrong CSRF token: %d, want 403", code)
	}
	if code := post(string(m[1]), false); code != http.StatusForbidden {
		t.Errorf("no CSRF cookie: %d, want 403", code)
	}
	if n := e.count(t, `SELECT count(*) FROM {t} WHERE "dead_lettered_at" IS NOT NULL`); n != 2 {
		t.Fatalf("dead letters after refused retries: %d, want 2", n)
	}
	if code := post(string(m[1]), true); code != http.StatusOK {
		t.Errorf("cookie, its token and the operator token: %d, want 200", code)
	}
	if n := e.count(t, `SELECT count(*) FROM {t} WHERE "dead_lettered_at" IS NOT NULL`); n != 0 {
		t.Errorf("dead letters after the retry: %d, want 0", n)
	}
	if got := e.audit(t); len(got) != 1 || got[0] != "retry-dead 2 " {
		t.Errorf("audit %q", got)
	}
}
