package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	wmsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/internal/pgtest"
)

var ctx = context.Background()

// newTable migrates a fresh outbox table and returns its config.
func newTable(t *testing.T, mod ...func(*outbox.SchemaConfig)) outbox.SchemaConfig {
	t.Helper()
	pool := pgtest.Require(t)
	cfg := outbox.SchemaConfig{Table: pgtest.Table(t)}
	for _, m := range mod {
		m(&cfg)
	}
	if err := outbox.Migrate(ctx, pool, cfg); err != nil {
		t.Fatal(err)
	}
	return cfg
}

func count(t *testing.T, q string, args ...any) int {
	t.Helper()
	var n int
	if err := pgtest.Require(t).QueryRow(ctx, q, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return n
}

func mustPublisher(t *testing.T, db any, cfg outbox.PublisherConfig) *outbox.Publisher {
	t.Helper()
	p, err := outbox.NewPublisher(db, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// txRunner abstracts the two driver paths: begin, publish through a Publisher on the tx, commit
// or roll back.
type txRunner struct {
	name  string
	begin func(t *testing.T) (db any, commit, rollback func() error, exec func(q string, args ...any) error)
}

func runners(t *testing.T) []txRunner {
	pool := pgtest.Require(t)
	std := pgtest.StdDB(t)
	return []txRunner{
		{"pgx", func(t *testing.T) (any, func() error, func() error, func(string, ...any) error) {
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			return tx, func() error { return tx.Commit(ctx) }, func() error { return tx.Rollback(ctx) },
				func(q string, a ...any) error { _, err := tx.Exec(ctx, q, a...); return err }
		}},
		{"database/sql", func(t *testing.T) (any, func() error, func() error, func(string, ...any) error) {
			tx, err := std.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			return tx, tx.Commit, tx.Rollback, func(q string, a ...any) error { _, err := tx.ExecContext(ctx, q, a...); return err }
		}},
		{"watermill-sql TxFromPgx", func(t *testing.T) (any, func() error, func() error, func(string, ...any) error) {
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			wtx := wmsql.TxFromPgx(tx)
			return wtx, func() error { return tx.Commit(ctx) }, func() error { return tx.Rollback(ctx) },
				func(q string, a ...any) error { _, err := tx.Exec(ctx, q, a...); return err }
		}},
		{"watermill-sql TxFromStdSQL", func(t *testing.T) (any, func() error, func() error, func(string, ...any) error) {
			tx, err := std.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			return wmsql.TxFromStdSQL(tx), tx.Commit, tx.Rollback, func(q string, a ...any) error { _, err := tx.ExecContext(ctx, q, a...); return err }
		}},
		{"watermill-sql Tx of the caller", func(t *testing.T) (any, func() error, func() error, func(string, ...any) error) {
			tx, err := std.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			return callerTx{tx}, tx.Commit, tx.Rollback, func(q string, a ...any) error { _, err := tx.ExecContext(ctx, q, a...); return err }
		}},
	}
}

// callerTx is a watermill-sql Tx that is none of watermill-sql's adapters: the Publisher calls
// its ExecContext and QueryContext, whose results are watermill-sql's own types.
type callerTx struct{ tx *sql.Tx }

func (c callerTx) ExecContext(ctx context.Context, q string, args ...any) (wmsql.Result, error) {
	return c.tx.ExecContext(ctx, q, args...)
}

func (c callerTx) QueryContext(ctx context.Context, q string, args ...any) (wmsql.Rows, error) {
	r, err := c.tx.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	return r, nil
}

func (c callerTx) Commit() error   { return c.tx.Commit() }
func (c callerTx) Rollback() error { return c.tx.Rollback() }

var _ wmsql.Tx = callerTx{}

type storedRow struct {
	Sequence                    int64
	ID, Topic, Payload, Headers string
	OrderingKey, IdempotencyKey *string
	CreatedAt                   time.Time
	Attempts                    int
	LastError, LeasedBy         *string
	NextAttemptAt, LeaseUntil   *time.Time
	PublishedAt, DeadLetteredAt *time.Time
}

func readRows(t *testing.T, table string) []storedRow {
	t.Helper()
	rows, err := pgtest.Require(t).Query(ctx, fmt.Sprintf(`SELECT sequence, id::text, topic, payload::text, headers::text, ordering_key, idempotency_key,
		created_at, attempts, last_error, leased_by, next_attempt_at, lease_until, published_at, dead_lettered_at FROM %q ORDER BY sequence`, table))
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []storedRow
	for rows.Next() {
		var r storedRow
		if err := rows.Scan(&r.Sequence, &r.ID, &r.Topic, &r.Payload, &r.Headers, &r.OrderingKey, &r.IdempotencyKey,
			&r.CreatedAt, &r.Attempts, &r.LastError, &r.LeasedBy, &r.NextAttemptAt, &r.LeaseUntil, &r.PublishedAt, &r.DeadLetteredAt); err != nil {
			t.Fatal(err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func ptr(s string) *string { return &s }

func TestPublishCommitRollbackBothDrivers(t *testing.T) {
	for _, r := range runners(t) {
		t.Run(r.name, func(t *testing.T) {
			cfg := newTable(t)
			before := time.Now().Add(-time.Second)

			// Commit: three messages land as consecutive sequences in input order.
			db, commit, _, _ := r.begin(t)
			p := mustPublisher(t, db, outbox.PublisherConfig{Schema: cfg})
			id1 := uuid.Must(uuid.NewV7()).String()
			m1 := message.NewMessage(id1, []byte(`{"n":1,"html":"<a&b>","big":12345678901234567890}`))
			m1.Metadata.Set("trace", "abc")
			outbox.SetOrderingKey(m1, "order-7")
			outbox.SetIdempotencyKey(m1, "idem-1")
			m2 := message.NewMessage("", []byte(`[1,2]`)) // empty UUID: fresh v7
			m3 := outbox.NewMessage([]byte(`"x"`))
			if err := p.Publish("orders.created", m1, m2, m3); err != nil {
				t.Fatal(err)
			}
			if err := commit(); err != nil {
				t.Fatal(err)
			}
			got := readRows(t, cfg.Table)
			if len(got) != 3 {
				t.Fatalf("rows = %d, want 3", len(got))
			}
			if got[1].Sequence != got[0].Sequence+1 || got[2].Sequence != got[1].Sequence+1 {
				t.Fatalf("sequences %d %d %d not consecutive", got[0].Sequence, got[1].Sequence, got[2].Sequence)
			}
			r0 := got[0]
			if r0.ID != id1 || r0.Topic != "orders.created" || r0.Payload != `{"n":1,"html":"<a&b>","big":12345678901234567890}` ||
				r0.Headers != `{"trace":"abc"}` || *r0.OrderingKey != "order-7" || *r0.IdempotencyKey != "idem-1" ||
				r0.Attempts != 0 || r0.LastError != nil || r0.LeasedBy != nil || r0.NextAttemptAt != nil || r0.LeaseUntil != nil ||
				r0.PublishedAt != nil || r0.DeadLetteredAt != nil || r0.CreatedAt.Before(before) || r0.CreatedAt.After(time.Now().Add(time.Second)) {
				t.Fatalf("row 0 = %+v", r0)
			}
			id2 := uuid.MustParse(got[1].ID)
			if id2.Version() != 7 || got[1].Payload != `[1,2]` || got[1].Headers != `{}` || got[1].OrderingKey != nil || got[1].IdempotencyKey != nil {
				t.Fatalf("row 1 = %+v (uuid version %d)", got[1], id2.Version())
			}
			if got[2].ID != m3.UUID || got[2].Payload != `"x"` {
				t.Fatalf("row 2 = %+v", got[2])
			}

			// Rollback: nothing.
			db, _, rollback, _ := r.begin(t)
			p = mustPublisher(t, db, outbox.PublisherConfig{Schema: cfg})
			if err := p.Publish("orders.created", outbox.NewMessage([]byte(`1`))); err != nil {
				t.Fatal(err)
			}
			if err := rollback(); err != nil {
				t.Fatal(err)
			}
			if n := len(readRows(t, cfg.Table)); n != 3 {
				t.Fatalf("after rollback rows = %d, want 3", n)
			}
		})
	}
}

func TestPublishOnPoolCommitsAtOnce(t *testing.T) {
	cfg := newTable(t)
	for _, db := range []any{pgtest.Require(t), pgtest.StdDB(t)} {
		p := mustPublisher(t, db, outbox.PublisherConfig{Schema: cfg})
		if err := p.Publish("t", outbox.NewMessage([]byte(`{}`))); err != nil {
			t.Fatal(err)
		}
	}
	// Read through a fresh connection, outside any transaction of the publisher.
	conn, err := pgx.Connect(ctx, pgtest.DSN())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var n int
	if err := conn.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM %q`, cfg.Table)).Scan(&n); err != nil || n != 2 {
		t.Fatalf("count = %d, %v; want 2", n, err)
	}
}

func TestIdempotencyKey(t *testing.T) {
	pool := pgtest.Require(t)
	cfg := newTable(t)
	pcfg := outbox.PublisherConfig{Schema: cfg}

	// Same key twice in one transaction and once more in another: one row, caller learns its id.
	tx, _ := pool.Begin(ctx)
	p := mustPublisher(t, tx, pcfg)
	first := outbox.NewMessage([]byte(`1`))
	outbox.SetIdempotencyKey(first, "k1")
	again := outbox.NewMessage([]byte(`2`))
	outbox.SetIdempotencyKey(again, "k1")
	evs, err := p.PublishEvents(ctx, "t", first, again)
	if err != nil {
		t.Fatal(err)
	}
	if evs[0].Duplicate || evs[0].ID.String() != first.UUID || !evs[1].Duplicate || evs[1].ID.String() != first.UUID || evs[1].Sequence != evs[0].Sequence {
		t.Fatalf("same call: %+v", evs)
	}
	third := outbox.NewMessage([]byte(`3`))
	outbox.SetIdempotencyKey(third, "k1")
	evs, err = p.PublishEvents(ctx, "t", third)
	if err != nil || !evs[0].Duplicate || evs[0].ID.String() != first.UUID {
		t.Fatalf("same tx, later statement: %+v %v", evs, err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	ev, err := mustPublisher(t, pool, pcfg).Enqueue(ctx, outbox.EventInput{Topic: "t", Payload: 4, IdempotencyKey: "k1"})
	if err != nil || !ev.Duplicate || ev.ID.String() != first.UUID {
		t.Fatalf("across txs: %+v %v", ev, err)
	}
	if n := count(t, fmt.Sprintf(`SELECT count(*) FROM %q`, cfg.Table)); n != 1 {
		t.Fatalf("rows = %d, want 1", n)
	}

	// A non-key unique violation (an id that exists) is an error.
	dupID := message.NewMessage(first.UUID, []byte(`5`))
	err = mustPublisher(t, pool, pcfg).Publish("t", dupID)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "23505" {
		t.Fatalf("duplicate id: err = %v, want unique violation", err)
	}
}

// waitForLockWait waits until some backend is blocked waiting for a lock.
func waitForLockWait(t *testing.T) {
	pgtest.Eventually(t, 10*time.Second, "a backend waits on a lock", func() bool {
		return count(t, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()`) > 0
	})
}

func TestIdempotencyConcurrentTransactions(t *testing.T) {
	pool := pgtest.Require(t)
	cfg := newTable(t)
	pcfg := outbox.PublisherConfig{Schema: cfg}
	for _, firstCommits := range []bool{true, false} {
		t.Run(fmt.Sprintf("firstCommits=%v", firstCommits), func(t *testing.T) {
			key := fmt.Sprintf("conc-%v", firstCommits)
			tx1, _ := pool.Begin(ctx)
			m1 := outbox.NewMessage([]byte(`1`))
			outbox.SetIdempotencyKey(m1, key)
			if err := mustPublisher(t, tx1, pcfg).Publish("t", m1); err != nil {
				t.Fatal(err)
			}
			tx2, _ := pool.Begin(ctx)
			defer tx2.Rollback(ctx)
			m2 := outbox.NewMessage([]byte(`2`))
			outbox.SetIdempotencyKey(m2, key)
			type res struct {
				evs []outbox.Event
				err error
			}
			done := make(chan res, 1)
			go func() {
				evs, err := mustPublisher(t, tx2, pcfg).PublishEvents(ctx, "t", m2)
				done <- res{evs, err}
			}()
			waitForLockWait(t)
			select {
			case r := <-done:
				t.Fatalf("second writer did not wait: %+v", r)
			default:
			}
			if firstCommits {
				_ = tx1.Commit(ctx)
			} else {
				_ = tx1.Rollback(ctx)
			}
			r := <-done
			if r.err != nil {
				t.Fatal(r.err)
			}
			if firstCommits && (!r.evs[0].Duplicate || r.evs[0].ID.String() != m1.UUID) {
				t.Fatalf("after first committed: %+v, want duplicate of %s", r.evs[0], m1.UUID)
			}
			if !firstCommits && (r.evs[0].Duplicate || r.evs[0].ID.String() != m2.UUID) {
				t.Fatalf("after first rolled back: %+v, want own event %s", r.evs[0], m2.UUID)
			}
			if err := tx2.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			if n := count(t, fmt.Sprintf(`SELECT count(*) FROM %q WHERE idempotency_key = $1`, cfg.Table), key); n != 1 {
				t.Fatalf("rows with key = %d", n)
			}
		})
	}
}

// TestOrderingKeyCommitOrder checks that per-key sequence order equals commit order.
//
// Commit order is recorded with a side table of per-key counters. Each transaction first
// publishes its events, then increments its key's counter (UPDATE … RETURNING), sleeps a random
// few milliseconds and commits. The counter row stays locked until COMMIT, so counter values of
// one key are handed out exactly in commit order; because the increment comes after the
// publish, the counter itself cannot serialise the inserts. Without the publisher's per-key lock
// a transaction that draws a later sequence can commit first, and the test sees it.
func TestOrderingKeyCommitOrder(t *testing.T) {
	pool := pgtest.Require(t)
	cfg := newTable(t)
	side := cfg.Table + "_commits"
	pgtest.Table(t) // cleanup hook naming is per test; drop the side table explicitly below
	if _, err := pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE %q (k text PRIMARY KEY, n int NOT NULL DEFAULT 0);
		CREATE TABLE %q (k text, n int, first_seq bigint, last_seq bigint)`, side, side+"_log")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pool.Exec(ctx, fmt.Sprintf(`DROP TABLE IF EXISTS %q, %q`, side, side+"_log")) })
	keys := []string{"a", "b", "c", "d"}
	for _, k := range keys {
		pool.Exec(ctx, fmt.Sprintf(`INSERT INTO %q (k) VALUES ($1)`, side), k)
	}
	const writers, txPerWriter = 8, 170
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for range txPerWriter {
				k := keys[rng.IntN(len(keys))]
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					n := 1 + rng.IntN(2)
					msgs := make([]*message.Message, n)
					for i := range msgs {
						msgs[i] = outbox.NewMessage([]byte(`{}`))
						outbox.SetOrderingKey(msgs[i], k)
					}
					evs, err := mustPublisher(t, tx, outbox.PublisherConfig{Schema: cfg}).PublishEvents(ctx, "t", msgs...)
					if err != nil {
						return err
					}
					var c int
					if err := tx.QueryRow(ctx, fmt.Sprintf(`UPDATE %q SET n = n + 1 WHERE k = $1 RETURNING n`, side), k).Scan(&c); err != nil {
						return err
					}
					if _, err := tx.Exec(ctx, fmt.Sprintf(`INSERT INTO %q VALUES ($1, $2, $3, $4)`, side+"_log"), k, c, evs[0].Sequence, evs[n-1].Sequence); err != nil {
						return err
					}
					time.Sleep(time.Duration(rng.IntN(3000)) * time.Microsecond)
					return nil
				})
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	events := count(t, fmt.Sprintf(`SELECT count(*) FROM %q`, cfg.Table))
	if events < 2000 {
		t.Fatalf("only %d events", events)
	}
	// For each key, in commit (counter) order, sequences must increase.
	violations := count(t, fmt.Sprintf(`SELECT count(*) FROM (SELECT first_seq, lag(last_seq) OVER (PARTITION BY k ORDER BY n) AS prev FROM %q) s WHERE first_seq < prev`, side+"_log"))
	if violations != 0 {
		t.Fatalf("%d per-key commit-order violations in %d events", violations, events)
	}
	t.Logf("%d events, %d transactions, 0 violations", events, writers*txPerWriter)
}

func TestValidationBeforeSQL(t *testing.T) {
	pool := pgtest.Require(t)
	cfg := newTable(t, func(c *outbox.SchemaConfig) {
		c.ExtraColumns = []outbox.Column{{Name: "tenant", Type: "TEXT NULL"}}
	})
	biz := cfg.Table + "_biz"
	if _, err := pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE %q (id int)`, biz)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pool.Exec(ctx, fmt.Sprintf(`DROP TABLE %q`, biz)) })
	cases := validationCases()
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx)
			if _, err := tx.Exec(ctx, fmt.Sprintf(`INSERT INTO %q VALUES ($1)`, biz), i); err != nil {
				t.Fatal(err)
			}
			err = c.publish(mustPublisher(t, tx, outbox.PublisherConfig{Schema: cfg}))
			var ve *outbox.ValidationError
			if !errors.Is(err, outbox.ErrValidation) || !errors.As(err, &ve) || ve.Field != c.field {
				t.Fatalf("err = %v, want *ValidationError on %q", err, c.field)
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatalf("caller's tx no longer commits: %v", err)
			}
			if n := count(t, fmt.Sprintf(`SELECT count(*) FROM %q WHERE id = $1`, biz), i); n != 1 {
				t.Fatalf("business row count = %d", n)
			}
		})
	}
	if n := count(t, fmt.Sprintf(`SELECT count(*) FROM %q`, cfg.Table)); n != 0 {
		t.Fatalf("outbox rows = %d, want 0", n)
	}
}

// validationCase is bad input that the Publisher refuses with a *ValidationError on field
// before any SQL (tables with an extra column "tenant").
type validationCase struct {
	name    string
	field   string
	publish func(p *outbox.Publisher) error
}

// validationCases are TestValidationBeforeSQL's cases, shared by every dialect's version.
func validationCases() []validationCase {
	long := strings.Repeat("é", 256)
	withMeta := func(k, v string) *message.Message {
		m := outbox.NewMessage([]byte(`{}`))
		m.Metadata.Set(k, v)
		return m
	}
	withExtra := func(cols map[string]any) *message.Message {
		m := outbox.NewMessage([]byte(`{}`))
		outbox.SetExtraColumns(m, cols)
		return m
	}
	return []validationCase{
		{"empty topic", "topic", func(p *outbox.Publisher) error { return p.Publish("", outbox.NewMessage([]byte(`1`))) }},
		{"topic 256 chars", "topic", func(p *outbox.Publisher) error { return p.Publish(long, outbox.NewMessage([]byte(`1`))) }},
		{"ordering key 256 chars", "ordering_key", func(p *outbox.Publisher) error { return p.Publish("t", withMeta(outbox.MetadataOrderingKey, long)) }},
		{"idempotency key 256 chars", "idempotency_key", func(p *outbox.Publisher) error {
			return p.Publish("t", withMeta(outbox.MetadataIdempotencyKey, long))
		}},
		{"invalid JSON", "payload", func(p *outbox.Publisher) error { return p.Publish("t", outbox.NewMessage([]byte(`{"a":`))) }},
		{"NaN via Enqueue", "payload", func(p *outbox.Publisher) error {
			_, err := p.Enqueue(ctx, outbox.EventInput{Topic: "t", Payload: math.NaN()})
			return err
		}},
		{"+Inf via Enqueue", "payload", func(p *outbox.Publisher) error {
			_, err := p.Enqueue(ctx, outbox.EventInput{Topic: "t", Payload: map[string]float64{"x": math.Inf(1)}})
			return err
		}},
		{"-Inf via Enqueue", "payload", func(p *outbox.Publisher) error {
			_, err := p.Enqueue(ctx, outbox.EventInput{Topic: "t", Payload: math.Inf(-1)})
			return err
		}},
		{"\\u0000 in payload", "payload", func(p *outbox.Publisher) error { return p.Publish("t", outbox.NewMessage([]byte(`{"a":"x\u0000y"}`))) }},
		{"NUL string via Enqueue", "payload", func(p *outbox.Publisher) error {
			_, err := p.Enqueue(ctx, outbox.EventInput{Topic: "t", Payload: "a\x00b"})
			return err
		}},
		{"invalid UTF-8 payload", "payload", func(p *outbox.Publisher) error { return p.Publish("t", outbox.NewMessage([]byte("\"\xff\xfe\""))) }},
		{"empty header name", "headers", func(p *outbox.Publisher) error { return p.Publish("t", withMeta("", "v")) }},
		{"CR in header value", "headers", func(p *outbox.Publisher) error { return p.Publish("t", withMeta("h", "a\rb")) }},
		{"LF in header value", "headers", func(p *outbox.Publisher) error { return p.Publish("t", withMeta("h", "a\nX-Injected: 1")) }},
		{"NUL in header value", "headers", func(p *outbox.Publisher) error { return p.Publish("t", withMeta("h", "a\x00b")) }},
		{"LF in header name", "headers", func(p *outbox.Publisher) error { return p.Publish("t", withMeta("h\n", "v")) }},
		{"Watermill's UUID header", "headers", func(p *outbox.Publisher) error { return p.Publish("t", withMeta("_watermill_message_uuid", "x")) }},
		{"CR in header via Enqueue", "headers", func(p *outbox.Publisher) error {
			_, err := p.Enqueue(ctx, outbox.EventInput{Topic: "t", Payload: 1, Headers: map[string]string{"h": "v\r"}})
			return err
		}},
		{"non-UUID id", "uuid", func(p *outbox.Publisher) error { return p.Publish("t", message.NewMessage("not-a-uuid", []byte(`1`))) }},
		{"relay-owned extra column", "extra_columns", func(p *outbox.Publisher) error {
			return p.Publish("t", withExtra(map[string]any{"published_at": "2020-01-01T00:00:00Z"}))
		}},
		{"unknown extra column", "extra_columns", func(p *outbox.Publisher) error { return p.Publish("t", withExtra(map[string]any{"nope": 1})) }},
		{"second message bad", "payload", func(p *outbox.Publisher) error {
			return p.Publish("t", outbox.NewMessage([]byte(`1`)), outbox.NewMessage([]byte(`nope`)))
		}},
	}
}

// TestValidatePayloadMatchesPostgres cross-checks ValidatePayload with PostgreSQL's jsonb input
// on the edge cases of each rule.
func TestValidatePayloadMatchesPostgres(t *testing.T) {
	pool := pgtest.Require(t)
	inputs := []string{
		`1`, `-0`, `1e131071`, `1e131072`, `12345678901234567890e131050`, `0.001e131074`, `1e-16383`, `1e-16384`,
		`0e-16384`, `0.0e16390`, `1.5e-16382`, `-1E+5`, `1e0000000000000000000005`, `1e99999999999`,
		`"\ud83d\ude00"`, `"\ud800"`, `"\udc00"`, `"\ud800x"`, `"\ud800\u0041"`, `"\\u0000"`, `"\u0000"`, `"a\\\u0000"`,
		`{"a":[1,{"b":null}]}`, `"é"`, `[]`, `{}`, `true`, ` 1 `,
	}
	for _, in := range inputs {
		_, pgErr := pool.Exec(ctx, `SELECT $1::text::jsonb`, in)
		reason := outbox.ValidatePayload([]byte(in))
		if (pgErr == nil) != (reason == "") {
			t.Errorf("%s: ValidatePayload = %q, PostgreSQL err = %v", in, reason, pgErr)
		}
	}
}

func TestEnqueueExtraColumnsAndEncoding(t *testing.T) {
	pool := pgtest.Require(t)
	cfg := newTable(t, func(c *outbox.SchemaConfig) {
		c.ExtraColumns = []outbox.Column{{Name: "tenant_id", Type: "UUID NULL"}, {Name: "weight", Type: "INT NULL DEFAULT 7"}}
	})
	tenant := uuid.New()
	p := mustPublisher(t, pool, outbox.PublisherConfig{Schema: cfg})
	evs, err := p.EnqueueMany(ctx, []outbox.EventInput{
		{Topic: "t", Payload: map[string]any{"d": 1500 * time.Millisecond}, ExtraColumns: map[string]any{"tenant_id": tenant, "weight": 3}, OrderingKey: "k"},
		{Topic: "t", Payload: struct{ A int }{1}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if evs[0].OrderingKey != "k" || evs[1].Sequence != evs[0].Sequence+1 {
		t.Fatalf("events %+v", evs)
	}
	var tid *string
	var w *int
	var payload string
	err = pool.QueryRow(ctx, fmt.Sprintf(`SELECT tenant_id::text, weight, payload::text FROM %q WHERE sequence = $1`, cfg.Table), evs[0].Sequence).Scan(&tid, &w, &payload)
	if err != nil || *tid != tenant.String() || *w != 3 || payload != `{"d":1.5}` {
		t.Fatalf("row 0: %v %v %v %v", tid, w, payload, err)
	}
	err = pool.QueryRow(ctx, fmt.Sprintf(`SELECT tenant_id::text, weight FROM %q WHERE sequence = $1`, cfg.Table), evs[1].Sequence).Scan(&tid, &w)
	if err != nil || tid != nil || w != nil {
		t.Fatalf("row 1 (lacks columns another message named: NULL): %v %v %v", tid, w, err)
	}
	// Named by no message: the column keeps its DEFAULT.
	ev, err := p.Enqueue(ctx, outbox.EventInput{Topic: "t", Payload: 1})
	if err != nil {
		t.Fatal(err)
	}
	if n := count(t, fmt.Sprintf(`SELECT weight FROM %q WHERE sequence = $1`, cfg.Table), ev.Sequence); n != 7 {
		t.Fatalf("default weight = %d", n)
	}
	// A database error inside EnqueueMany leaves the caller's transaction usable (savepoint).
	tx, _ := pool.Begin(ctx)
	defer tx.Rollback(ctx)
	_, err = mustPublisher(t, tx, outbox.PublisherConfig{Schema: cfg}).Enqueue(ctx, outbox.EventInput{Topic: "t", Payload: 1, ExtraColumns: map[string]any{"weight": "not a number"}})
	if err == nil {
		t.Fatal("want a database error for a bad weight")
	}
	if _, err := mustPublisher(t, tx, outbox.PublisherConfig{Schema: cfg}).Enqueue(ctx, outbox.EventInput{Topic: "t", Payload: 2}); err != nil {
		t.Fatalf("tx unusable after savepoint rollback: %v", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestByteaPayloadAndQualifiedTable(t *testing.T) {
	pool := pgtest.Require(t)
	schemaName := "s_" + strings.ToLower(strings.ReplaceAll(uuid.NewString()[:8], "-", ""))
	if _, err := pool.Exec(ctx, fmt.Sprintf(`CREATE SCHEMA %q`, schemaName)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pool.Exec(ctx, fmt.Sprintf(`DROP SCHEMA %q CASCADE`, schemaName)) })
	cfg := outbox.SchemaConfig{Table: schemaName + `.we"ird tab`, PayloadType: outbox.PayloadBytea}
	for range 2 { // idempotent
		if err := outbox.Migrate(ctx, pool, cfg); err != nil {
			t.Fatal(err)
		}
	}
	raw := []byte{0x00, 0xff, 0x10, 'x'}
	p := mustPublisher(t, pgtest.StdDB(t), outbox.PublisherConfig{Schema: cfg})
	if err := p.Publish("bin", message.NewMessage(uuid.NewString(), raw)); err != nil {
		t.Fatal(err)
	}
	var got []byte
	if err := pool.QueryRow(ctx, `SELECT payload FROM `+pgx.Identifier{schemaName, `we"ird tab`}.Sanitize()).Scan(&got); err != nil || string(got) != string(raw) {
		t.Fatalf("payload %x %v", got, err)
	}
	ddl, err := outbox.SchemaSQL(cfg)
	if err != nil || !strings.Contains(ddl, `"we""ird tab"`) || !strings.Contains(ddl, "BYTEA") {
		t.Fatalf("ddl: %v\n%s", err, ddl)
	}
}

func TestConfigErrors(t *testing.T) {
	for _, c := range []struct {
		name string
		err  error
	}{
		{"negative keys", outbox.PublisherConfig{MaxOrderingKeysPerCall: -1}.Validate()},
		{"three-part table", outbox.SchemaConfig{Table: "a.b.c"}.Validate()},
		{"empty part", outbox.SchemaConfig{Table: "a."}.Validate()},
		{"builtin extra column", outbox.SchemaConfig{ExtraColumns: []outbox.Column{{Name: "topic", Type: "TEXT"}}}.Validate()},
		{"bad extra name", outbox.SchemaConfig{ExtraColumns: []outbox.Column{{Name: "a b", Type: "TEXT"}}}.Validate()},
		{"bad extra type", outbox.SchemaConfig{ExtraColumns: []outbox.Column{{Name: "ab", Type: "TEXT; DROP TABLE x"}}}.Validate()},
		{"fillfactor below 10", outbox.SchemaConfig{FillFactor: 9}.Validate()},
		{"fillfactor above 100", outbox.SchemaConfig{FillFactor: 101}.Validate()},
		{"negative fillfactor", outbox.SchemaConfig{FillFactor: -1}.Validate()},
		{"fillfactor on SQLite", outbox.SchemaConfig{FillFactor: 50, Dialect: outbox.DialectSQLite}.Validate()},
	} {
		var ce *outbox.ConfigError
		if !errors.Is(c.err, outbox.ErrConfig) || !errors.As(c.err, &ce) {
			t.Errorf("%s: err = %v, want *ConfigError", c.name, c.err)
		}
	}
	_, err := outbox.NewPublisher(42, outbox.PublisherConfig{}, nil)
	if !errors.Is(err, outbox.ErrUnsupportedDB) {
		t.Fatalf("unsupported handle: %v", err)
	}
	var _ = (*sql.Tx)(nil)
	var _ *pgxpool.Pool
}

func TestNotifyChannelAndOnInserted(t *testing.T) {
	pool := pgtest.Require(t)
	cfg := newTable(t)
	listener, err := pgx.Connect(ctx, pgtest.DSN())
	if err != nil {
		t.Fatal(err)
	}
	defer listener.Close(ctx)
	channel := "outbox_test_" + strings.ReplaceAll(uuid.NewString()[:8], "-", "")
	if _, err := listener.Exec(ctx, "LISTEN "+channel); err != nil {
		t.Fatal(err)
	}
	var inserted [][]string
	pcfg := outbox.PublisherConfig{Schema: cfg, NotifyChannel: channel, OnInserted: func(topics []string) { inserted = append(inserted, topics) }}
	publish := func(commit bool, topics ...string) {
		tx, _ := pool.Begin(ctx)
		p := mustPublisher(t, tx, pcfg)
		for _, tp := range topics {
			for range 3 {
				if err := p.Publish(tp, outbox.NewMessage([]byte(`1`))); err != nil {
					t.Fatal(err)
				}
			}
		}
		if commit {
			tx.Commit(ctx)
		} else {
			tx.Rollback(ctx)
		}
	}
	publish(false, "rolled.back")
	publish(true, "a", "b")
	var got []string
	for len(got) < 2 {
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		n, err := listener.WaitForNotification(wctx)
		cancel()
		if err != nil {
			t.Fatalf("after %v: %v", got, err)
		}
		got = append(got, n.Payload)
	}
	// One notification per topic per transaction (PostgreSQL folds repeats), none for the
	// rollback, in commit order.
	if fmt.Sprint(got) != "[a b]" {
		t.Fatalf("notifications %v", got)
	}
	wctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if n, err := listener.WaitForNotification(wctx); err == nil {
		t.Fatalf("unexpected notification %+v", n)
	}
	if fmt.Sprint(inserted) != "[[rolled.back] [rolled.back] [rolled.back] [a] [a] [a] [b] [b] [b]]" {
		t.Fatalf("OnInserted calls %v", inserted)
	}
}

// TestPublishWithoutReadBack: Publish without OnWrite and without idempotency keys reads
// nothing back (no RETURNING) and PublishEvents of one event returns only the database's
// columns; both must still store every column and report the same values as the table, on
// every handle, and OnInserted must get the distinct topics.
func TestPublishWithoutReadBack(t *testing.T) {
	for _, r := range runners(t) {
		t.Run(r.name, func(t *testing.T) {
			cfg := newTable(t)
			var inserted [][]string
			db, commit, _, _ := r.begin(t)
			p := mustPublisher(t, db, outbox.PublisherConfig{Schema: cfg, OnInserted: func(topics []string) { inserted = append(inserted, topics) }})
			a, b, c := outbox.NewMessage([]byte(`{"n":1}`)), outbox.NewMessage([]byte(`{"n":2}`)), outbox.NewMessage([]byte(`{"n":3}`))
			outbox.SetOrderingKey(a, "k1")
			b.Metadata.Set("h", "v")
			if err := p.Publish("x", a, b); err != nil {
				t.Fatal(err)
			}
			if err := p.Publish("y", c); err != nil {
				t.Fatal(err)
			}
			d := outbox.NewMessage([]byte(`{"n":4}`))
			outbox.SetOrderingKey(d, "k2")
			evs, err := p.PublishEvents(ctx, "z", d)
			if err != nil {
				t.Fatal(err)
			}
			if err := commit(); err != nil {
				t.Fatal(err)
			}
			rows := readRows(t, cfg.Table)
			if len(rows) != 4 {
				t.Fatalf("%d rows stored, want 4", len(rows))
			}
			want := []struct {
				id, topic, payload, headers string
				okey                        *string
			}{{a.UUID, "x", `{"n":1}`, `{}`, ptr("k1")}, {b.UUID, "x", `{"n":2}`, `{"h":"v"}`, nil}, {c.UUID, "y", `{"n":3}`, `{}`, nil}, {d.UUID, "z", `{"n":4}`, `{}`, ptr("k2")}}
			for i, w := range want {
				got := rows[i]
				if got.ID != w.id || got.Topic != w.topic || got.Payload != w.payload || got.Headers != w.headers || fmt.Sprint(deref(got.OrderingKey)) != fmt.Sprint(deref(w.okey)) || got.IdempotencyKey != nil {
					t.Errorf("row %d = %+v, want %+v", i, got, w)
				}
			}
			last := rows[3]
			want0 := outbox.Event{Sequence: last.Sequence, ID: uuid.MustParse(d.UUID), Topic: "z", OrderingKey: "k2", CreatedAt: last.CreatedAt}
			if len(evs) != 1 || evs[0].Sequence != want0.Sequence || evs[0].ID != want0.ID || evs[0].Topic != want0.Topic || evs[0].OrderingKey != want0.OrderingKey ||
				evs[0].IdempotencyKey != "" || evs[0].Duplicate || !evs[0].CreatedAt.Equal(want0.CreatedAt) {
				t.Errorf("PublishEvents = %+v, want %+v", evs, want0)
			}
			if fmt.Sprint(inserted) != "[[x] [y] [z]]" {
				t.Errorf("OnInserted calls %v, want [[x] [y] [z]]", inserted)
			}
		})
	}
}

func deref(s *string) any {
	if s == nil {
		return nil
	}
	return *s
}
