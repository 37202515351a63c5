package console_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/console"
	"github.com/watermill-outbox/outbox/internal/pgtest"
)

// tracer keeps the SQL and arguments of every query while recording is on.
type tracer struct {
	mu   sync.Mutex
	on   bool
	seen []tracedQuery
}

type tracedQuery struct {
	sql  string
	args []any
}

func (tr *tracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if tr.on {
		var args []any
		for _, a := range d.Args {
			if _, mode := a.(pgx.QueryExecMode); !mode {
				args = append(args, a)
			}
		}
		tr.seen = append(tr.seen, tracedQuery{d.SQL, args})
	}
	return ctx
}

func (tr *tracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (tr *tracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

// TraceBatchQuery keeps a batch's statements but its BEGIN, SET LOCAL and COMMIT.
func (tr *tracer) TraceBatchQuery(ctx context.Context, c *pgx.Conn, d pgx.TraceBatchQueryData) {
	up := strings.ToUpper(strings.TrimSpace(d.SQL))
	if up == "BEGIN" || up == "COMMIT" || strings.HasPrefix(up, "SET ") || strings.HasPrefix(up, "BEGIN ") {
		return
	}
	tr.TraceQueryStart(ctx, c, pgx.TraceQueryStartData{SQL: d.SQL, Args: d.Args})
}

func (tr *tracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// TestConsolePerf measures each page's p95 over a table of 1M published, 100k pending and
// 10k dead-lettered events (with blocked keys and failing heads), VACUUM ANALYZEd after
// loading (the steady state autovacuum keeps; see docs/design/console-explain.txt), in 40
// interleaved rounds beside a page that runs no SQL, logs the overview's statement against
// the exact BacklogByTopic it replaced (medians of the same rounds), and writes each page's
// statements with EXPLAIN (ANALYZE, BUFFERS) to $OUTBOX_CONSOLE_PERF_OUT (default
// console-perf.txt in the test's temporary directory, named in the log). Opt-in:
// OUTBOX_CONSOLE_PERF=1 (seeding takes about a minute).
func TestConsolePerf(t *testing.T) {
	if os.Getenv("OUTBOX_CONSOLE_PERF") != "1" {
		t.Skip("set OUTBOX_CONSOLE_PERF=1 to measure the console's pages on 1M published rows")
	}
	pgtest.Require(t)
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(pgtest.DSN())
	if err != nil {
		t.Fatal(err)
	}
	tr := &tracer{}
	cfg.ConnConfig.Tracer = tr
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	// OUTBOX_CONSOLE_PERF_TABLE names a table to seed once and keep (later runs measure it).
	keep := os.Getenv("OUTBOX_CONSOLE_PERF_TABLE")
	schema := outbox.SchemaConfig{Table: pgtest.Table(t)}
	if keep != "" {
		schema.Table = keep
	}
	q := `"` + schema.Table + `"`
	var seeded bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, q).Scan(&seeded); err != nil {
		t.Fatal(err)
	}
	if err := outbox.Migrate(ctx, pool, schema); err != nil {
		t.Fatal(err)
	}
	if keep == "" {
		defer pool.Exec(context.Background(), `DROP TABLE IF EXISTS `+q+`, "`+schema.Table+`_console_audit"`)
	}
	start := time.Now()
	seeds := []string{
		// 1M published over the last 7 days, half of them keyed (1,000 keys), 10 topics.
		`INSERT INTO {t} ("id", "topic", "payload", "ordering_key", "created_at", "published_at")
			SELECT gen_random_uuid(), 'topic.' || (i % 10), '{"n":1}', CASE WHEN i % 2 = 0 THEN 'pk-' || (i % 1000) END,
				now() - i * interval '604 milliseconds' - interval '80 milliseconds', now() - i * interval '604 milliseconds'
			FROM generate_series(1, 1000000) i`,
		// 10k dead letters, half keyed over 2,000 keys.
		`INSERT INTO {t} ("id", "topic", "payload", "ordering_key", "created_at", "attempts", "last_error", "last_error_class", "dead_lettered_at")
			SELECT gen_random_uuid(), 'topic.' || (i % 10), '{"n":2}', CASE WHEN i % 2 = 0 THEN 'dk-' || (i % 2000) END,
				now() - interval '2 hours', 5, 'error ' || (i % 7), 'failure', now() - i * interval '1 second'
			FROM generate_series(1, 10000) i`,
		// 100k pending, half keyed over 5,000 keys (the dead letters' keys among them).
		`INSERT INTO {t} ("id", "topic", "payload", "ordering_key", "created_at")
			SELECT gen_random_uuid(), 'topic.' || (i % 10), '{"n":3}', CASE WHEN i % 2 = 0 THEN (ARRAY['pk-','dk-'])[1 + i % 4 / 2] || (i % 5000) END,
				now() - i * interval '10 milliseconds'
			FROM generate_series(1, 100000) i`,
		// 100 keys with a failing head.
		`UPDATE {t} SET "attempts" = 2, "last_error" = 'timeout', "last_error_class" = 'failure', "next_attempt_at" = now() + interval '5 minutes'
			WHERE "sequence" IN (SELECT min("sequence") FROM {t} WHERE "published_at" IS NULL AND "dead_lettered_at" IS NULL AND "ordering_key" LIKE 'pk-%' GROUP BY "ordering_key" LIMIT 100)`,
		// 2,000 events leased by two relays.
		`UPDATE {t} SET "lease_until" = now() + interval '1 hour', "leased_by" = 'relay-' || ("sequence" % 2) || '#0a1b2c3d4e5f#' || "sequence"
			WHERE "sequence" IN (SELECT "sequence" FROM {t} WHERE "published_at" IS NULL AND "dead_lettered_at" IS NULL AND "ordering_key" IS NULL ORDER BY "sequence" LIMIT 2000)`,
		`VACUUM ANALYZE {t}`,
	}
	if seeded {
		seeds = nil
	}
	for _, s := range seeds {
		if _, err := pool.Exec(ctx, strings.ReplaceAll(s, "{t}", q)); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	t.Logf("seeded in %s", time.Since(start).Round(time.Second))

	con, err := console.New(console.Config{DB: pool, Schema: schema, Token: "t"})
	if err != nil {
		t.Fatal(err)
	}
	defer con.Close()
	if err := con.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(con)
	defer srv.Close()
	out := os.Getenv("OUTBOX_CONSOLE_PERF_OUT")
	if out == "" {
		out = t.TempDir() + "/console-perf.txt"
	}
	var report strings.Builder
	get := func(p string) time.Duration {
		t0 := time.Now()
		resp, err := http.Get(srv.URL + p)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %d", p, resp.StatusCode)
		}
		return time.Since(t0)
	}
	// /login renders the layout and runs no SQL: the comparator, what the machine's load
	// alone costs a request. Rounds are interleaved (each round requests every page once),
	// so that a burst of load from elsewhere falls on every page alike.
	pages := []string{"/login", "/", "/keys", "/dead", "/dead?topic=topic.3&error=error+5", "/dead?topic=*&key=dk-10", "/dead/confirm?action=retry&topic=topic.*", "/audit"}
	times := make([][]time.Duration, len(pages))
	for _, p := range pages {
		get(p) // warm
	}
	load := func() string {
		b, _ := os.ReadFile("/proc/loadavg")
		return strings.Join(strings.Fields(string(b))[:3], " ")
	}
	fmt.Fprintf(&report, "== load average before: %s\n", load())
	// The overview's statement against BacklogByTopic, the exact one it replaced, in the
	// same rounds.
	sub, err := outbox.NewSubscriber(pool, outbox.SubscriberConfig{Schema: schema}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	// The overview's statements one by one, and BacklogByTopic, the exact one BacklogOverview
	// replaced, in the same rounds.
	calls := []struct {
		name string
		run  func() error
		ds   []time.Duration
	}{
		{name: "BacklogByTopic", run: func() error { _, err := sub.BacklogByTopic(ctx); return err }},
		{name: fmt.Sprintf("BacklogOverview(%d)", outbox.DefaultOverviewLimit), run: func() error { _, err := sub.BacklogOverview(ctx, outbox.DefaultOverviewLimit); return err }},
		{name: "DeliveryStats(1h)", run: func() error { _, err := sub.DeliveryStats(ctx, time.Hour); return err }},
		{name: "RelayLeases", run: func() error { _, err := sub.RelayLeases(ctx, outbox.DefaultOverviewLimit); return err }},
	}
	for range 40 {
		for i, p := range pages {
			times[i] = append(times[i], get(p))
		}
		for i := range calls {
			t0 := time.Now()
			if err := calls[i].run(); err != nil {
				t.Fatal(err)
			}
			calls[i].ds = append(calls[i].ds, time.Since(t0))
		}
	}
	fmt.Fprintf(&report, "== load average after: %s\n", load())
	median := func(ds []time.Duration) time.Duration {
		sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
		return ds[len(ds)/2]
	}
	var parts []string
	for _, c := range calls {
		parts = append(parts, fmt.Sprintf("%s %.1f ms", c.name, ms(median(c.ds))))
	}
	line := fmt.Sprintf("statement medians: %s; BacklogByTopic / BacklogOverview %.1fx", strings.Join(parts, ", "), float64(median(calls[0].ds))/float64(median(calls[1].ds)))
	t.Log(line)
	fmt.Fprintf(&report, "== %s\n", line)
	for i, p := range pages {
		ds := times[i]
		sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
		line := fmt.Sprintf("GET %-40s p50 %6.1f ms  p95 %6.1f ms  max %6.1f ms", p, ms(ds[len(ds)/2]), ms(ds[len(ds)*95/100]), ms(ds[len(ds)-1]))
		t.Log(line)
		fmt.Fprintf(&report, "== %s\n", line)
	}
	for _, p := range pages[1:] {
		fmt.Fprintf(&report, "\n== GET %s\n", p)
		tr.mu.Lock()
		tr.on, tr.seen = true, nil
		tr.mu.Unlock()
		get(p)
		tr.mu.Lock()
		tr.on = false
		seen := tr.seen
		tr.mu.Unlock()
		for _, s := range seen {
			if strings.HasPrefix(s.sql, "SELECT set_config(") {
				continue
			}
			rows, err := pool.Query(ctx, "EXPLAIN (ANALYZE, BUFFERS) "+s.sql, s.args...)
			if err != nil {
				t.Fatalf("explain %s: %v", s.sql, err)
			}
			fmt.Fprintf(&report, "-- %s\n", strings.Join(strings.Fields(s.sql), " "))
			for rows.Next() {
				var l string
				_ = rows.Scan(&l)
				report.WriteString(l + "\n")
			}
			rows.Close()
			report.WriteString("\n")
		}
	}
	if err := os.WriteFile(out, []byte(report.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("EXPLAIN (ANALYZE, BUFFERS) of each page's statements: %s", out)
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
