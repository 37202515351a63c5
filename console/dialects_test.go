package console_test

import (
	"context"
	"database/sql"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/console"
	"github.com/watermill-outbox/outbox/internal/mariadbtest"
	"github.com/watermill-outbox/outbox/internal/pgtest"
	_ "github.com/watermill-outbox/outbox/mysql"  // links outbox.DialectMySQL
	_ "github.com/watermill-outbox/outbox/sqlite" // links outbox.DialectSQLite
	_ "modernc.org/sqlite"                        // the "sqlite" database/sql driver
)

// TestBlockedKeySkipSQLite: blockedKeySkipHTTP on SQLite.
func TestBlockedKeySkipSQLite(t *testing.T) {
	db, err := sql.Open("sqlite", outbox.SQLiteDSN(filepath.Join(t.TempDir(), "console.db")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	blockedKeySkipHTTP(t, db, outbox.SchemaConfig{Dialect: outbox.DialectSQLite})
}

// TestBlockedKeySkipMariaDB: blockedKeySkipHTTP on MariaDB (the shared test server, a fresh
// table and its audit table).
func TestBlockedKeySkipMariaDB(t *testing.T) {
	db := mariadbtest.Require(t)
	table := mariadbtest.Table(t)
	t.Cleanup(func() { _, _ = db.Exec("DROP TABLE IF EXISTS `" + table + "_console_audit`") })
	blockedKeySkipHTTP(t, db, outbox.SchemaConfig{Dialect: outbox.DialectMySQL, Table: table})
}

// blockedKeySkipHTTP, over plain HTTP (the handlers; the Chromium tests run on PostgreSQL): the
// blocked-keys page lists a key held behind a failing head, with its error and its 2 held
// events; POST /keys/skip (operator token, CSRF cookie and form token) dead-letters the head out
// of its key's order, and the key's later events are then delivered in order; a second skip
// answers 409; the audit log (in the database's own SQL) records both; the overview and the
// dead-letter page's key filter work.
func blockedKeySkipHTTP(t *testing.T, db *sql.DB, schema outbox.SchemaConfig) {
	const token = "s3cret-operator-token"
	ctx := context.Background()
	if err := outbox.Migrate(ctx, db, schema); err != nil {
		t.Fatal(err)
	}
	con, err := console.New(console.Config{DB: db, Schema: schema, Token: token})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = con.Close() })
	if err := con.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(con)
	t.Cleanup(srv.Close)
	pub, err := outbox.NewPublisher(db, outbox.PublisherConfig{Schema: schema}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range []struct{ topic, key, payload string }{
		{"orders.created", "customer-7", `{"n":1,"poison":true}`}, {"orders.created", "customer-7", `{"n":2}`},
		{"orders.paid", "customer-7", `{"n":3}`}, {"orders.created", "customer-8", `{"n":1}`},
	} {
		msg := outbox.NewMessage([]byte(e.payload))
		outbox.SetOrderingKey(msg, e.key)
		if err := pub.Publish(e.topic, msg); err != nil {
			t.Fatal(err)
		}
	}
	sub, err := outbox.NewSubscriber(db, outbox.SubscriberConfig{Schema: schema}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Close() })
	r := startRelayOn(t, db, schema)
	pgtest.Eventually(t, 20*time.Second, "customer-7 blocked behind its failed head", func() bool {
		ks, err := sub.BlockedKeys(ctx, 10)
		return err == nil && len(ks) == 1 && ks[0].Key == "customer-7" && ks[0].Held == 2 && len(r.keyAcked("customer-8")) == 1
	})

	c := srv.Client()
	get := func(path string) (int, string, []*http.Cookie) {
		t.Helper()
		resp, err := c.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body), resp.Cookies()
	}
	code, page, cookies := get("/keys")
	row := regexp.MustCompile(`(?s)<tr data-key="customer-7">.*?</tr>`).FindString(page)
	if code != http.StatusOK || row == "" {
		t.Fatalf("GET /keys: %d, no row of customer-7:\n%s", code, page)
	}
	for _, want := range []string{"orders.created", "payments said 422: card declined", `data-label="held">2<`, `name="seq" value="1"`} {
		if !strings.Contains(row, want) {
			t.Errorf("blocked key row lacks %q:\n%s", want, row)
		}
	}
	m := regexp.MustCompile(`name="csrf" content="([^"]+)"`).FindStringSubmatch(page)
	if m == nil {
		t.Fatal("no CSRF token on the page")
	}
	skip := func() (int, string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/keys/skip", strings.NewReader(url.Values{"key": {"customer-7"}, "seq": {"1"}, "csrf": {m[1]}}.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Authorization", "Bearer "+token)
		for _, ck := range cookies {
			req.AddCookie(ck)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	if code, body := skip(); code != http.StatusOK || !strings.Contains(body, "head 1 of key &#34;customer-7&#34; skipped (dead-lettered)") {
		t.Fatalf("POST /keys/skip: %d\n%s", code, body)
	}
	pgtest.Eventually(t, 20*time.Second, "customer-7's later events delivered", func() bool { return len(r.keyAcked("customer-7")) == 2 })
	if got := r.keyAcked("customer-7"); got[0] != `{"n":2}` || got[1] != `{"n":3}` {
		t.Errorf("customer-7 delivered %v, want n=2 then n=3", got)
	}
	if code, _ := skip(); code != http.StatusConflict {
		t.Errorf("second skip of the same head: %d, want 409", code)
	}
	if code, page, _ := get("/keys"); code != http.StatusOK || !strings.Contains(page, `id="no-keys"`) {
		t.Errorf("GET /keys after the skip: %d, want no blocked key:\n%s", code, page)
	}
	code, page, _ = get("/dead?topic=*&key=customer-7")
	if code != http.StatusOK || !strings.Contains(page, "orders.created") || strings.Contains(page, "not supported") {
		t.Errorf("GET /dead by key: %d\n%s", code, page)
	}
	if n, err := sub.CountDeadLettered(ctx, outbox.DeadLetterFilter{Topics: []string{"*"}, Key: "customer-7", ErrorContains: "CARD DECLINED"}); err != nil || n != 1 {
		t.Errorf("CountDeadLettered(key customer-7, error text) = %d, %v; want 1", n, err)
	}
	code, page, _ = get("/audit")
	if code != http.StatusOK || strings.Count(page, "skip-head") != 2 || !strings.Contains(page, "customer-7") {
		t.Errorf("GET /audit: %d, want two skip-head entries (one refused):\n%s", code, page)
	}
	if code, page, _ := get("/"); code != http.StatusOK || strings.Contains(page, "not supported") || !strings.Contains(page, "orders.created") {
		t.Errorf("GET /: %d\n%s", code, page)
	}
}

// TestOverviewCappedSQLite: with OverviewLimit 1 the overview shows its counts as lower bounds
// and says which kinds were capped, the relays' leased events included (two events leased by one
// relay: "1+").
func TestOverviewCappedSQLite(t *testing.T) {
	ctx := context.Background()
	db, err := sql.Open("sqlite", outbox.SQLiteDSN(filepath.Join(t.TempDir(), "console.db")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	schema := outbox.SchemaConfig{Dialect: outbox.DialectSQLite}
	if err := outbox.Migrate(ctx, db, schema); err != nil {
		t.Fatal(err)
	}
	pub, err := outbox.NewPublisher(db, outbox.PublisherConfig{Schema: schema}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish("mail", outbox.NewMessage([]byte(`{}`)), outbox.NewMessage([]byte(`{}`)), outbox.NewMessage([]byte(`{}`))); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`UPDATE "watermill_outbox" SET "leased_by" = 'relay-1#0123456789ab#4', "lease_until" = $1 WHERE "sequence" <= 2`, time.Now().Add(time.Minute).UnixMicro()); err != nil {
		t.Fatal(err)
	}
	con, err := console.New(console.Config{DB: db, Schema: schema, OverviewLimit: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = con.Close() })
	srv := httptest.NewServer(con)
	t.Cleanup(srv.Close)
	resp, err := srv.Client().Get(srv.URL + "/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	page := string(body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /: %d\n%s", resp.StatusCode, page)
	}
	for _, want := range []string{`id="capped"`, `<b id="total-pending">1&#43;</b>`, `id="leases-capped"`, "relay-1#0123456789ab", `<td class="n">1&#43;</td>`} {
		if !strings.Contains(page, want) {
			t.Errorf("overview lacks %q:\n%s", want, page)
		}
	}
}
