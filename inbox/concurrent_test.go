package inbox_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/inbox"
	"github.com/watermill-outbox/outbox/internal/pgtest"
)

// TestConcurrentDuplicates: 8 goroutines deliver the same 500 messages at once (the same order,
// so deliveries of one message overlap). Each message is processed exactly once — 500 business
// rows, 500 outbox events, 500 inbox rows, a counter of 500 — and the other 3,500 deliveries
// are skipped. Under SERIALIZABLE the inbox insert that waited on a concurrent one, and the
// counter updates, fail with 40001 and are retried inside the inbox.
func TestConcurrentDuplicates(t *testing.T) {
	pool := pgtest.Require(t)
	for _, tc := range []struct {
		name string
		iso  pgx.TxIsoLevel
	}{{"read-committed", pgx.ReadCommitted}, {"serializable", pgx.Serializable}} {
		t.Run(tc.name, func(t *testing.T) {
			const workers, n = 8, 500
			e := pgEnv(t, "pgx", pool)
			if _, err := pool.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (id) VALUES ('counter')`, e.biz)); err != nil {
				t.Fatal(err)
			}
			cfg := e.config("dedup")
			cfg.MaxRetries = 20 // eight writers of one counter row: a loser may lose again
			in, err := inbox.New(inbox.FromPgx(pool, pgx.TxOptions{IsoLevel: tc.iso}), cfg, nil)
			if err != nil {
				t.Fatal(err)
			}
			msgs := make([]*message.Message, n)
			for i := range msgs {
				msgs[i] = outbox.NewMessage([]byte(fmt.Sprintf(`{"i":%d}`, i)))
			}
			handler := func(msg *message.Message, tx pgx.Tx) ([]*message.Message, error) {
				if _, err := tx.Exec(msg.Context(), fmt.Sprintf(`INSERT INTO %s (id) VALUES ($1)`, e.biz), msg.UUID); err != nil {
					return nil, err
				}
				if _, err := tx.Exec(msg.Context(), fmt.Sprintf(`UPDATE %s SET n = n + 1 WHERE id = 'counter'`, e.biz)); err != nil {
					return nil, err
				}
				return []*message.Message{outbox.NewMessage(msg.Payload)}, nil
			}
			deadline, cancel := context.WithTimeout(ctx, 2*time.Minute)
			defer cancel()
			var wg sync.WaitGroup
			errs := make(chan error, workers)
			for range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for _, m := range msgs {
						// A nack is a redelivery: deliver again until the message is acked.
						for {
							d := m.Copy()
							d.SetContext(deadline)
							_, err := in.Process(d, handler)
							if err == nil {
								break
							}
							if deadline.Err() != nil {
								errs <- fmt.Errorf("message %s still failing at the deadline: %w", m.UUID, err)
								return
							}
						}
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			if got := e.counts(t); got != [3]int{n + 1, n, n} {
				t.Fatalf("business (with the counter), outbox, inbox rows = %v, want [%d %d %d]", got, n+1, n, n)
			}
			if c := e.count(t, fmt.Sprintf(`SELECT n FROM %s WHERE id = 'counter'`, e.biz)); c != n {
				t.Fatalf("counter %d, want %d (a message processed twice or lost)", c, n)
			}
			s := in.Stats()
			if s.Processed != n || s.Duplicates != (workers-1)*n {
				t.Fatalf("stats %+v: want %d processed, %d duplicates", s, n, (workers-1)*n)
			}
			if tc.iso == pgx.Serializable && s.Retries == 0 {
				t.Fatalf("stats %+v: no serialization failure was retried under SERIALIZABLE", s)
			}
			t.Logf("%s: %+v", tc.name, s)
		})
	}
}
