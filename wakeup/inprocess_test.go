package wakeup_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/internal/pgtest"

	"github.com/watermill-outbox/outbox/wakeup"
	"github.com/watermill-outbox/outbox/wakeup/internal/wakeuptest"
)

func TestInProcess(t *testing.T) {
	wakeuptest.Run(t, wakeuptest.Case{
		New: func(t *testing.T) wakeup.Wakeup { return wakeup.NewInProcess() },
	})
}

// recorder is a Wakeup that records the Signal calls.
type recorder struct {
	*wakeup.InProcess
	mu      sync.Mutex
	signals [][]string
}

func (r *recorder) Signal(topics ...string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.signals = append(r.signals, slices.Clone(topics))
}

func (r *recorder) get() [][]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.signals)
}

// TestRunInTxSignals checks both transaction helpers: one Signal with the distinct topics
// after COMMIT; none after fn's error, a panic or a failed COMMIT (a deferred unique
// constraint makes COMMIT itself fail).
func TestRunInTxSignals(t *testing.T) {
	pool := pgtest.Require(t)
	db := pgtest.StdDB(t)
	ctx := context.Background()
	schema := outbox.SchemaConfig{Table: pgtest.Table(t)}
	if err := outbox.Migrate(ctx, pool, schema); err != nil {
		t.Fatal(err)
	}
	dedup := pgtest.Table(t)
	if _, err := pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE %q (k int UNIQUE DEFERRABLE INITIALLY DEFERRED)`, dedup)); err != nil {
		t.Fatal(err)
	}
	cfg := outbox.PublisherConfig{Schema: schema}
	errFn := errors.New("fn failed")
	publish := func(pub *outbox.Publisher, topics ...string) error {
		for _, topic := range topics {
			if err := pub.Publish(topic, outbox.NewMessage([]byte(`{}`))); err != nil {
				return err
			}
		}
		return nil
	}
	type runner func(w wakeup.Wakeup, fn func(exec func(q string) error, pub *outbox.Publisher) error) error
	runners := map[string]runner{
		"pgx": func(w wakeup.Wakeup, fn func(func(string) error, *outbox.Publisher) error) error {
			return wakeup.RunInTx(ctx, pool, w, cfg, func(tx pgx.Tx, pub *outbox.Publisher) error {
				return fn(func(q string) error { _, err := tx.Exec(ctx, q); return err }, pub)
			})
		},
		"database/sql": func(w wakeup.Wakeup, fn func(func(string) error, *outbox.Publisher) error) error {
			return wakeup.RunInSQLTx(ctx, db, nil, w, cfg, func(tx *sql.Tx, pub *outbox.Publisher) error {
				return fn(func(q string) error { _, err := tx.ExecContext(ctx, q); return err }, pub)
			})
		},
	}
	for name, run := range runners {
		t.Run(name, func(t *testing.T) {
			w := &recorder{InProcess: wakeup.NewInProcess()}
			err := run(w, func(_ func(string) error, pub *outbox.Publisher) error { return publish(pub, "a", "b", "a", "c", "b") })
			if err != nil {
				t.Fatal(err)
			}
			if got := w.get(); len(got) != 1 || !slices.Equal(got[0], []string{"a", "b", "c"}) {
				t.Fatalf("signals after commit = %v, want one [a b c]", got)
			}
			if err := run(w, func(_ func(string) error, pub *outbox.Publisher) error {
				if err := publish(pub, "x"); err != nil {
					return err
				}
				return errFn
			}); !errors.Is(err, errFn) {
				t.Fatalf("err = %v, want fn's error", err)
			}
			func() {
				defer func() {
					if recover() == nil {
						t.Fatal("panic swallowed")
					}
				}()
				_ = run(w, func(_ func(string) error, pub *outbox.Publisher) error {
					_ = publish(pub, "y")
					panic("boom")
				})
			}()
			if err := run(w, func(exec func(string) error, pub *outbox.Publisher) error {
				if err := exec(fmt.Sprintf(`INSERT INTO %q VALUES (1), (1)`, dedup)); err != nil {
					return err
				}
				return publish(pub, "z")
			}); err == nil {
				t.Fatal("COMMIT of a deferred unique violation succeeded")
			}
			if got := w.get(); len(got) != 1 {
				t.Fatalf("signals = %v: only the committed transaction may signal", got)
			}
			var stored int
			if err := pool.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM %q WHERE topic IN ('x', 'y', 'z')`, schema.Table)).Scan(&stored); err != nil || stored != 0 {
				t.Fatalf("events of rolled-back transactions stored: %d (%v)", stored, err)
			}
		})
	}
}
