package capture_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/google/uuid"
	_ "modernc.org/sqlite" // the "sqlite" database/sql driver

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/capture"
	"github.com/watermill-outbox/outbox/internal/pgtest"
	_ "github.com/watermill-outbox/outbox/sqlite"
)

var ctx = context.Background()

// harness is one dialect with a fresh outbox table.
type harness struct {
	t      *testing.T
	sqlite bool
	db     *sql.DB // runs the tests' SQL and Install
	schema outbox.SchemaConfig
	prefix string // schema of captured tables in envelopes: "public" or "main"
	names  int
}

func eachDialect(t *testing.T, fn func(t *testing.T, h *harness)) {
	t.Run("postgresql", func(t *testing.T) { fn(t, pgHarness(t, nil)) })
	t.Run("sqlite", func(t *testing.T) { fn(t, sqliteHarness(t, nil)) })
}

func pgHarness(t *testing.T, mod func(*outbox.SchemaConfig)) *harness {
	db := pgtest.StdDB(t)
	h := &harness{t: t, db: db, schema: outbox.SchemaConfig{Table: pgtest.Table(t)}, prefix: "public"}
	if mod != nil {
		mod(&h.schema)
	}
	if err := outbox.Migrate(ctx, db, h.schema); err != nil {
		t.Fatal(err)
	}
	return h
}

func sqliteHarness(t *testing.T, mod func(*outbox.SchemaConfig)) *harness {
	db, err := sql.Open("sqlite", outbox.SQLiteDSN(filepath.Join(t.TempDir(), "capture.db"))+"&_pragma=foreign_keys(1)")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	h := &harness{t: t, sqlite: true, db: db, schema: outbox.SchemaConfig{Dialect: outbox.DialectSQLite}, prefix: "main"}
	if mod != nil {
		mod(&h.schema)
	}
	if err := outbox.Migrate(ctx, db, h.schema); err != nil {
		t.Fatal(err)
	}
	return h
}

// table returns a fresh business table name.
func (h *harness) table() string {
	if h.sqlite {
		h.names++
		return fmt.Sprintf("biz%d", h.names)
	}
	return pgtest.Table(h.t)
}

func (h *harness) exec(stmts ...string) {
	h.t.Helper()
	for _, q := range stmts {
		if _, err := h.db.ExecContext(ctx, q); err != nil {
			h.t.Fatalf("%s: %v", q, err)
		}
	}
}

func (h *harness) install(tables ...capture.Table) {
	h.t.Helper()
	if err := capture.Install(ctx, h.db, h.schema, tables...); err != nil {
		h.t.Fatal(err)
	}
}

// captured is one outbox row as a test sees it.
type captured struct {
	Seq      int64
	ID       string
	Topic    string
	Key      string // "" for NULL
	Envelope map[string]any
	Headers  map[string]string
	Extra    map[string]any
}

var isoMicros = regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}\+00:00$`)

// events reads the outbox rows after sequence since, checking each id is a UUIDv7 and each
// occurred_at is an ISO 8601 time of the last minute (then dropping it for exact comparison).
func (h *harness) events(since int64) []captured {
	h.t.Helper()
	rows, err := h.db.QueryContext(ctx, fmt.Sprintf(`SELECT "sequence", CAST("id" AS TEXT), "topic", coalesce("ordering_key", ''), "payload", CAST("headers" AS TEXT) FROM %s WHERE "sequence" > $1 ORDER BY "sequence"`, quote(h.schema)), since)
	if err != nil {
		h.t.Fatal(err)
	}
	defer rows.Close()
	var out []captured
	for rows.Next() {
		var (
			c       captured
			payload []byte
			header  string
		)
		if err := rows.Scan(&c.Seq, &c.ID, &c.Topic, &c.Key, &payload, &header); err != nil {
			h.t.Fatal(err)
		}
		id, err := uuid.Parse(c.ID)
		if err != nil || id.Version() != 7 || id.Variant() != uuid.RFC4122 {
			h.t.Fatalf("event id %q is not a UUIDv7 (%v)", c.ID, err)
		}
		if err := decodeExact(payload, &c.Envelope); err != nil {
			h.t.Fatalf("payload %s: %v", payload, err)
		}
		if err := json.Unmarshal([]byte(header), &c.Headers); err != nil {
			h.t.Fatalf("headers %s: %v", header, err)
		}
		if at, ok := c.Envelope["occurred_at"].(string); ok {
			if !isoMicros.MatchString(at) {
				h.t.Fatalf("occurred_at %q: want ISO 8601 UTC with microseconds", at)
			}
			ts, _ := time.Parse(time.RFC3339Nano, at)
			if d := time.Since(ts); d < -time.Minute || d > time.Minute {
				h.t.Fatalf("occurred_at %q is %s away from now", at, d)
			}
			delete(c.Envelope, "occurred_at")
		} else {
			h.t.Fatalf("envelope without occurred_at: %s", payload)
		}
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		h.t.Fatal(err)
	}
	return out
}

func (h *harness) lastSeq() int64 {
	h.t.Helper()
	var n sql.NullInt64
	if err := h.db.QueryRowContext(ctx, fmt.Sprintf(`SELECT max("sequence") FROM %s`, quote(h.schema))).Scan(&n); err != nil {
		h.t.Fatal(err)
	}
	return n.Int64
}

func quote(s outbox.SchemaConfig) string {
	if s.Table == "" {
		return `"` + outbox.DefaultTable + `"`
	}
	return `"` + s.Table + `"`
}

// want is an expected event: topic, ordering key, envelope (JSON, without occurred_at),
// headers (nil = {}).
type want struct {
	topic, key, env string
	headers         map[string]string
}

// expect runs stmts and checks that exactly the events in ws were captured, in order.
func (h *harness) expect(ws []want, stmts ...string) {
	h.t.Helper()
	since := h.lastSeq()
	h.exec(stmts...)
	h.check(since, ws)
}

func (h *harness) check(since int64, ws []want) {
	h.t.Helper()
	h.compare(h.events(since), ws)
}

// checkAnyTableOrder is check for events of several tables whose relative order the dialects
// define differently (SQLite runs foreign-key actions before the parent's AFTER trigger): the
// order is compared per topic.
func (h *harness) checkAnyTableOrder(since int64, ws []want) {
	h.t.Helper()
	got := h.events(since)
	sort.SliceStable(got, func(i, j int) bool { return got[i].Topic < got[j].Topic })
	ws = slices.Clone(ws)
	sort.SliceStable(ws, func(i, j int) bool { return ws[i].topic < ws[j].topic })
	h.compare(got, ws)
}

func (h *harness) compare(got []captured, ws []want) {
	h.t.Helper()
	if len(got) != len(ws) {
		var envs []any
		for _, g := range got {
			envs = append(envs, g.Envelope)
		}
		h.t.Fatalf("%d events, want %d: %v", len(got), len(ws), envs)
	}
	for i, w := range ws {
		g := got[i]
		var env map[string]any
		if err := decodeExact([]byte(w.env), &env); err != nil {
			h.t.Fatalf("bad expected envelope %s: %v", w.env, err)
		}
		hdr := w.headers
		if hdr == nil {
			hdr = map[string]string{}
		}
		if g.Topic != w.topic || g.Key != w.key || !reflect.DeepEqual(g.Envelope, env) || !reflect.DeepEqual(g.Headers, hdr) {
			gb, _ := json.Marshal(g.Envelope)
			h.t.Fatalf("event %d:\n got topic %q key %q env %s headers %v\nwant topic %q key %q env %s headers %v", i, g.Topic, g.Key, gb, g.Headers, w.topic, w.key, w.env, hdr)
		}
	}
}

// decodeExact decodes JSON keeping numbers as their text (json.Number), so 2^53+1 and
// 12.50 compare exactly.
func decodeExact(b []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	return d.Decode(v)
}
