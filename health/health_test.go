package health_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/health"
	"github.com/watermill-outbox/outbox/internal/privatepg"
)

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestHandler(t *testing.T) {
	running, done := make(chan struct{}), make(chan struct{})
	h, err := health.Handler(health.Config{
		Metrics: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("m 1\n")) }),
		Ready:   []health.Check{health.Running(health.Runner{Name: "forwarder", Running: running, Done: done})},
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	for _, c := range []struct {
		path string
		code int
		body string
	}{
		{"/healthz", 200, "ok\n"},
		{"/metrics", 200, "m 1\n"},
		{"/nope", 404, ""},
		{"/readyz", 503, "subscriptions: forwarder 1 of 1 not subscribed yet: not running\n"},
	} {
		if code, body := get(t, srv.URL+c.path); code != c.code || c.body != "" && body != c.body {
			t.Errorf("GET %s = %d %q, want %d %q", c.path, code, body, c.code, c.body)
		}
	}
	close(running)
	if code, body := get(t, srv.URL+"/readyz"); code != 200 || body != "ready\n" {
		t.Errorf("running: /readyz = %d %q", code, body)
	}
	close(done)
	if code, body := get(t, srv.URL+"/readyz"); code != 503 || body != "subscriptions: forwarder 1 of 1 stopped: not running\n" {
		t.Errorf("stopped: /readyz = %d %q", code, body)
	}
	if _, err := health.Handler(health.Config{Timeout: -1}); !errors.Is(err, outbox.ErrConfig) {
		t.Errorf("negative timeout: %v", err)
	}
	if _, err := health.Handler(health.Config{Ready: []health.Check{{Name: "x"}}}); !errors.Is(err, outbox.ErrConfig) {
		t.Errorf("check without Func: %v", err)
	}
}

// TestReadyzFollowsDatabase stops a private PostgreSQL under a ready relay: /readyz answers 503
// naming the database within 2s, and 200 again within 2s of its return.
func TestReadyzFollowsDatabase(t *testing.T) {
	pg := privatepg.Start(t)
	ctx := t.Context()
	pool, err := pgxpool.New(ctx, pg.DSN())
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	schema := outbox.SchemaConfig{}
	if err := outbox.Migrate(ctx, pool, schema); err != nil {
		t.Fatal(err)
	}
	h, err := health.Handler(health.Config{Ready: []health.Check{health.Database(pool, schema)}, Timeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	if code, body := get(t, srv.URL+"/readyz"); code != 200 {
		t.Fatalf("/readyz = %d %q before the stop", code, body)
	}
	waitFor := func(want int, what string) {
		t.Helper()
		deadline := time.Now().Add(2 * time.Second)
		for {
			code, body := get(t, srv.URL+"/readyz")
			if code == want {
				if want == 503 && !strings.HasPrefix(body, "database: ") {
					t.Fatalf("503 body %q does not name the database", body)
				}
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("/readyz still %d %q 2s after %s", code, body, what)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	pg.Stop(t)
	waitFor(503, "the database stopped")
	pg.Restart(t)
	waitFor(200, "the database came back")

	// A closed pool is not ready either.
	pool.Close()
	cctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if err := health.Database(pool, schema).Func(cctx); err == nil {
		t.Error("database check passed on a closed pool")
	}
}

// outages is an OutageSource with fixed outages.
type outages []outbox.Outage

func (o *outages) Outages() []outbox.Outage { return *o }

// TestDestinationsCheck: /readyz fails while a source reports an outage, naming each
// destination, how long it has been down and its last error, and passes when none does.
func TestDestinationsCheck(t *testing.T) {
	var src outages
	h, err := health.Handler(health.Config{Ready: []health.Check{health.Destinations(&src)}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	if code, body := get(t, srv.URL+"/readyz"); code != 200 || body != "ready\n" {
		t.Fatalf("no outage: /readyz = %d %q", code, body)
	}
	src = outages{
		{Destination: "redis 127.0.0.1:6379", Since: time.Now().Add(-12 * time.Second), LastError: errors.New("dial tcp 127.0.0.1:6379: connect: connection refused")},
		{Since: time.Now().Add(-3 * time.Second)},
	}
	want := "destinations: redis 127.0.0.1:6379 unavailable for 12s: dial tcp 127.0.0.1:6379: connect: connection refused; destination unavailable for 3s\n"
	if code, body := get(t, srv.URL+"/readyz"); code != 503 || body != want {
		t.Fatalf("outage: /readyz = %d %q, want 503 %q", code, body, want)
	}
}
