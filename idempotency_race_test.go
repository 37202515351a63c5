package outbox_test

import (
	"errors"
	"fmt"
	"hash/fnv"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/internal/pgtest"
)

// TestIdempotencyConcurrentSameMessage: the same Watermill message (same UUID, same idempotency
// key) published by two concurrent transactions (a redelivery racing the first handler): the
// second waits and then sees the first's event, never an error. Both passed
// PostgreSQL's conflict pre-check, and the second then failed on the id index (23505, its
// transaction aborted) in 6-7 of 400 rounds.
func TestIdempotencyConcurrentSameMessage(t *testing.T) {
	pool := pgtest.Require(t)
	cfg := newTable(t)
	pcfg := outbox.PublisherConfig{Schema: cfg}
	fails := 0
	var firstErr error
	for i := range 400 {
		id := outbox.NewMessage(nil).UUID
		key := fmt.Sprintf("k%d", i)
		var wg sync.WaitGroup
		start := make(chan struct{})
		errs := make([]error, 2)
		for w := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				tx, err := pool.Begin(ctx)
				if err != nil {
					errs[w] = err
					return
				}
				defer tx.Rollback(ctx)
				p := mustPublisher(t, tx, pcfg)
				m := message.NewMessage(id, []byte(`1`))
				outbox.SetIdempotencyKey(m, key)
				<-start
				if err := p.Publish("t", m); err != nil {
					errs[w] = err
					return
				}
				errs[w] = tx.Commit(ctx)
			}()
		}
		close(start)
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				fails++
				if firstErr == nil {
					firstErr = err
				}
			}
		}
	}
	if fails > 0 {
		t.Fatalf("%d of 400 races failed; first: %v", fails, firstErr)
	}
}

// Two transactions whose single calls carry the same idempotency keys in different orders:
// The second waits for the first and then sees its event.
// TestIdempotencyKeysInOppositeOrders: two transactions publishing the same idempotency keys in
// different orders (a retried handler building its batch from a map) do not deadlock: the keys
// are locked in one sorted pass like ordering keys. They deadlocked (40P01) in the unique index.
func TestIdempotencyKeysInOppositeOrders(t *testing.T) {
	pool := pgtest.Require(t)
	cfg := newTable(t)
	pcfg := outbox.PublisherConfig{Schema: cfg}
	msgs := func(keys ...string) []*message.Message {
		var out []*message.Message
		for _, k := range keys {
			m := outbox.NewMessage([]byte(`1`))
			outbox.SetIdempotencyKey(m, k)
			out = append(out, m)
		}
		return out
	}
	// A third transaction holds "z" so that both writers are inside their statements at once.
	tx0, _ := pool.Begin(ctx)
	defer tx0.Rollback(ctx)
	if err := mustPublisher(t, tx0, pcfg).Publish("t", msgs("z")...); err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 2)
	for _, keys := range [][]string{{"a", "z", "b"}, {"b", "z", "a"}} {
		go func() {
			tx, err := pool.Begin(ctx)
			if err != nil {
				errs <- err
				return
			}
			defer tx.Rollback(ctx)
			if err := mustPublisher(t, tx, pcfg).Publish("t", msgs(keys...)...); err != nil {
				errs <- fmt.Errorf("keys %v: %w", keys, err)
				return
			}
			errs <- tx.Commit(ctx)
		}()
	}
	pgtest.Eventually(t, 10*time.Second, "both writers wait for z", func() bool {
		return count(t, fmt.Sprintf(`SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database() AND query LIKE '%%%s%%'`, cfg.Table)) >= 2
	})
	_ = tx0.Rollback(ctx)
	for range 2 {
		if err := <-errs; err != nil {
			var pgErr *pgconn.PgError
			errors.As(err, &pgErr)
			t.Errorf("writer failed (SQLSTATE %v): %v", pgErr.Code, err)
		}
	}
	if n := count(t, fmt.Sprintf(`SELECT count(*) FROM %q`, cfg.Table)); n != 3 {
		t.Fatalf("%d events stored, want 3 (a, b, z once each)", n)
	}
}

// TestLockCapCountsIdempotencyKeys: on PostgreSQL MaxOrderingKeysPerCall caps the distinct
// ordering and idempotency keys of a call together (each takes a lock): over it, a
// *ValidationError before any SQL, and the transaction goes on.
func TestLockCapCountsIdempotencyKeys(t *testing.T) {
	pool := pgtest.Require(t)
	cfg := newTable(t)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	p := mustPublisher(t, tx, outbox.PublisherConfig{Schema: cfg, MaxOrderingKeysPerCall: 2})
	msg := func(okey, ikey string) *message.Message {
		m := outbox.NewMessage([]byte(`1`))
		if okey != "" {
			outbox.SetOrderingKey(m, okey)
		}
		outbox.SetIdempotencyKey(m, ikey)
		return m
	}
	for name, msgs := range map[string][]*message.Message{
		"three idempotency keys":                 {msg("", "i1"), msg("", "i2"), msg("", "i3")},
		"one ordering key, two idempotency keys": {msg("o1", "i1"), msg("o1", "i2")},
	} {
		var ve *outbox.ValidationError
		if err := p.Publish("t", msgs...); !errors.As(err, &ve) || ve.Index != len(msgs)-1 {
			t.Fatalf("%s with MaxOrderingKeysPerCall 2: %v, want a *ValidationError at #%d", name, err, len(msgs)-1)
		}
	}
	if err := p.Publish("t", msg("", "i1"), msg("", "i2"), msg("", "i1")); err != nil {
		t.Fatalf("two distinct idempotency keys (one repeated) in the same transaction after the refusals: %v", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if n := count(t, fmt.Sprintf(`SELECT count(*) FROM %q`, cfg.Table)); n != 2 {
		t.Fatalf("%d events stored, want 2", n)
	}
}

// TestSingleAndBatchLockInOneOrder: a one-message Publish with an ordering key and an
// idempotency key takes their two locks in hash order, as a batch does. It took them in column
// order, and against a batch holding the same keys one was aborted with 40P01 (found by a review
// of this session's own diff).
func TestSingleAndBatchLockInOneOrder(t *testing.T) {
	pool := pgtest.Require(t)
	cfg := newTable(t)
	pcfg := outbox.PublisherConfig{Schema: cfg}
	h := fnv.New64a()
	h.Write([]byte(pgx.Identifier{cfg.Table}.Sanitize()))
	seed := int64(h.Sum64())
	iseed := seed ^ 0x49646d4b
	hash := func(s string, sd int64) int64 {
		var v int64
		if err := pool.QueryRow(ctx, "SELECT hashtextextended($1, $2)", s, sd).Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	// pick I with a low idem hash, K with a high ordering hash, X (ordering) in between
	var K, I, X string
	var hK, hI, hX int64
	for n := 0; K == "" || I == "" || X == ""; n++ {
		s := fmt.Sprintf("s%d", n)
		if v := hash(s, iseed); I == "" && v < -(1<<62) {
			I, hI = s, v
		}
		if v := hash(s, seed); K == "" && v > 1<<62 {
			K, hK = s, v
		} else if X == "" && v > -(1<<60) && v < 1<<60 {
			X, hX = s, v
		}
	}
	_, _, _ = hI, hX, hK
	// H holds X
	txH, _ := pool.Begin(ctx)
	defer txH.Rollback(ctx)
	if _, err := txH.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", hX); err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 2)
	run := func(msgs ...*message.Message) {
		tx, err := pool.Begin(ctx)
		if err != nil {
			errs <- err
			return
		}
		defer tx.Rollback(ctx)
		if err := mustPublisher(t, tx, pcfg).Publish("t", msgs...); err != nil {
			errs <- err
			return
		}
		errs <- tx.Commit(ctx)
	}
	waiting := func(n int) func() bool {
		return func() bool {
			return count(t, fmt.Sprintf(`SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database() AND query LIKE '%%%s%%'`, cfg.Table)) >= n
		}
	}
	// B: batch {okey K}, {idem I}, {okey X}: sorted I, X, K → holds I, waits on X.
	b1 := outbox.NewMessage([]byte(`1`))
	outbox.SetOrderingKey(b1, K)
	b2 := outbox.NewMessage([]byte(`2`))
	outbox.SetIdempotencyKey(b2, I)
	b3 := outbox.NewMessage([]byte(`3`))
	outbox.SetOrderingKey(b3, X)
	go run(b1, b2, b3)
	pgtest.Eventually(t, 10*time.Second, "B waits", waiting(1))
	// A: single {okey K, idem I}: takes K, waits on I (held by B).
	a := outbox.NewMessage([]byte(`4`))
	outbox.SetOrderingKey(a, K)
	outbox.SetIdempotencyKey(a, I)
	go run(a)
	pgtest.Eventually(t, 10*time.Second, "A waits", waiting(2))
	_ = txH.Rollback(ctx) // B takes X, then wants K (held by A)
	for range 2 {
		if err := <-errs; err != nil {
			t.Errorf("writer failed: %v", err)
		}
	}
}
