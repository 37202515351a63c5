package console_test

import (
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/watermill-outbox/outbox/console"
)

// TestReplay: the replay page counts what a window selects (a dry run: nothing written), the
// confirmation repeats the count, and confirming writes exactly that many copies, in the
// audit log; a read-only console refuses the replay (403) and writes nothing.
func TestReplay(t *testing.T) {
	const token = "replay-token"
	e := newEnv(t, console.Config{Token: token})
	// In the window: 30 orders.created over three keys and 20 mail.welcome; before it: 10
	// orders.created; pending: 5 orders.created.
	e.exec(t, `INSERT INTO {t} ("id", "topic", "payload", "headers", "ordering_key", "created_at", "published_at")
		SELECT gen_random_uuid(), 'orders.created', '{"n":1}', '{}', 'k' || (i % 3), now() - interval '51 minutes', now() - interval '50 minutes' + i * interval '1 millisecond'
		FROM generate_series(1, 30) i`)
	e.exec(t, `INSERT INTO {t} ("id", "topic", "payload", "headers", "created_at", "published_at")
		SELECT gen_random_uuid(), 'mail.welcome', '{"n":2}', '{}', now() - interval '41 minutes', now() - interval '40 minutes' FROM generate_series(1, 20) i`)
	e.exec(t, `INSERT INTO {t} ("id", "topic", "payload", "headers", "created_at", "published_at")
		SELECT gen_random_uuid(), 'orders.created', '{"n":3}', '{}', now() - interval '3 hours', now() - interval '3 hours' FROM generate_series(1, 10) i`)
	e.exec(t, `INSERT INTO {t} ("id", "topic", "payload", "headers", "created_at")
		SELECT gen_random_uuid(), 'orders.created', '{"n":4}', '{}', now() FROM generate_series(1, 5) i`)
	copies := `SELECT count(*) FROM {t} WHERE "headers"::jsonb ? 'outbox-replay-of'`

	b := browser(t)
	login(t, b, e.srv.URL, token)
	q := url.Values{"since": {time.Now().UTC().Add(-time.Hour).Format("2006-01-02T15:04")}, "topics": {"orders.*"}}
	if err := chromedp.Do(b, chromedp.Navigate(e.srv.URL+"/replay?"+q.Encode()), chromedp.WaitVisible(chromedp.CSS(`#replay-count`))); err != nil {
		t.Fatal(err)
	}
	if got := text(t, b, `#replay-count`); got != "30" {
		t.Fatalf("dry-run count %q, want 30", got)
	}
	screenshot(t, b, "replay")
	if err := chromedp.Do(b, chromedp.Click(chromedp.CSS(`#replay-start`)), chromedp.WaitVisible(chromedp.CSS(`#replay-confirm-count`))); err != nil {
		t.Fatal(err)
	}
	if got := text(t, b, `#replay-confirm-count`); got != "30" {
		t.Fatalf("confirmation count %q, want 30", got)
	}
	if n := e.count(t, copies); n != 0 {
		t.Fatalf("%d copies written before the confirmation", n)
	}
	if err := chromedp.Do(b, chromedp.Click(chromedp.CSS(`#confirm`)), chromedp.WaitVisible(chromedp.CSS(`#replay-done`))); err != nil {
		t.Fatal(err)
	}
	if got := text(t, b, `#replay-done`); got != "30" {
		t.Errorf("replayed %q, want 30", got)
	}
	if n := e.count(t, copies+` AND "topic" = 'orders.created' AND "published_at" IS NULL AND "payload"::text = '{"n":1}'`); n != 30 {
		t.Errorf("pending copies of the window's orders.created: %d, want 30", n)
	}
	if n := e.count(t, copies); n != 30 {
		t.Errorf("copies: %d, want 30", n)
	}
	if got := e.audit(t); len(got) != 1 || got[0] != "replay 30 " {
		t.Errorf("audit %q, want one replay of 30", got)
	}

	ro := newEnv(t, console.Config{})
	ro.exec(t, `INSERT INTO {t} ("id", "topic", "payload", "headers", "created_at", "published_at") SELECT gen_random_uuid(), 'orders.created', '{}', '{}', now(), now() FROM generate_series(1, 3) i`)
	resp, err := http.PostForm(ro.srv.URL+"/replay/apply", url.Values{"since": {time.Now().UTC().Add(-time.Hour).Format(time.RFC3339)},
		"until": {time.Now().UTC().Add(time.Minute).Format(time.RFC3339)}, "count": {"3"}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("replay on a read-only console: %d, want 403", resp.StatusCode)
	}
	if n := ro.count(t, copies); n != 0 {
		t.Errorf("read-only console wrote %d copies", n)
	}
	if got := ro.audit(t); len(got) != 0 {
		t.Errorf("audit after a refused replay: %q", got)
	}
}
