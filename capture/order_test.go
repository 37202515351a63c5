package capture_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/capture"
	"github.com/watermill-outbox/outbox/internal/pgtest"
)

// TestOrderConcurrentWriters: 8 writers update 20 shared rows 10,000 times in total and, in
// between, publish explicit events on the same ordering keys. Each transaction records its
// commit position on its key (a per-key counter it increments after writing its event, so
// the counter's row lock orders commits without ordering the event writes). Delivered through
// the relay, every key's events must come in commit order: 0 reorders, none lost.
func TestOrderConcurrentWriters(t *testing.T) {
	pool := pgtest.Require(t)
	h := pgHarness(t, nil)
	acct, counters := h.table(), h.table()
	const rows, writers = 20, 8
	updates := 10000
	if testing.Short() {
		updates = 2000
	}
	h.exec(fmt.Sprintf(`CREATE TABLE %s (id int PRIMARY KEY, token text)`, acct),
		fmt.Sprintf(`CREATE TABLE %s (id int PRIMARY KEY, n int NOT NULL)`, counters),
		fmt.Sprintf(`INSERT INTO %s SELECT g, NULL FROM generate_series(1, %d) g`, acct, rows),
		fmt.Sprintf(`INSERT INTO %s SELECT g, 0 FROM generate_series(1, %d) g`, counters, rows))
	// A custom ordering key: the trigger takes the Publisher's per-key lock.
	h.install(capture.Table{Name: acct, OrderingKey: "acct-{pk}", Payload: capture.PayloadAfter, Fields: []string{"token"}})

	var (
		mu       sync.Mutex
		position = map[string]int{} // token -> commit position on its key
		keyOf    = map[string]string{}
	)
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rnd := rand.New(rand.NewPCG(uint64(w), 7))
			done := 0
			for i := 0; done < updates/writers; i++ {
				id := 1 + rnd.IntN(rows)
				token := fmt.Sprintf("w%d-%d", w, i)
				publish := rnd.IntN(4) == 0
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					if publish {
						pub, err := outbox.NewPublisher(tx, outbox.PublisherConfig{Schema: h.schema}, nil)
						if err != nil {
							return err
						}
						msg := outbox.NewMessage([]byte(fmt.Sprintf(`{"token":%q}`, token)))
						outbox.SetOrderingKey(msg, fmt.Sprintf("acct-%d", id))
						if err := pub.Publish("acct.published", msg); err != nil {
							return err
						}
					} else if _, err := tx.Exec(ctx, fmt.Sprintf(`UPDATE %s SET token = $1 WHERE id = $2`, acct), token, id); err != nil {
						return err
					}
					var n int
					if err := tx.QueryRow(ctx, fmt.Sprintf(`UPDATE %s SET n = n + 1 WHERE id = $1 RETURNING n`, counters), id).Scan(&n); err != nil {
						return err
					}
					mu.Lock()
					position[token], keyOf[token] = n, fmt.Sprintf("acct-%d", id)
					mu.Unlock()
					return nil
				})
				if err != nil {
					errs <- err
					return
				}
				if !publish {
					done++
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}

	sub, err := outbox.NewSubscriber(pool, outbox.SubscriberConfig{Schema: h.schema, PollInterval: 20 * time.Millisecond, BatchSize: 1000}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	msgs, err := sub.Subscribe(sctx, "*")
	if err != nil {
		t.Fatal(err)
	}
	want := len(position)
	last := map[string]int{}
	reorders, delivered := 0, 0
	deadline := time.After(2 * time.Minute)
	for delivered < want {
		var msg *message.Message
		select {
		case msg = <-msgs:
		case <-deadline:
			t.Fatalf("delivered %d of %d events", delivered, want)
		}
		token := tokenOf(t, msg)
		key := msg.Metadata.Get(outbox.MetadataOrderingKey)
		if key != keyOf[token] {
			t.Fatalf("event %s: ordering key %q, want %q", token, key, keyOf[token])
		}
		if _, err := uuid.Parse(msg.UUID); err != nil {
			t.Fatalf("message UUID %q: %v", msg.UUID, err)
		}
		if position[token] <= last[key] {
			reorders++
		}
		last[key] = position[token]
		delivered++
		msg.Ack()
	}
	if reorders != 0 {
		t.Fatalf("%d of %d events delivered out of commit order", reorders, want)
	}
	if len(last) != rows {
		t.Fatalf("%d keys delivered, want %d", len(last), rows)
	}
	t.Logf("%d events (%d captured updates, %d published) delivered in per-key commit order", want, updates, want-updates)
}

// tokenOf reads the writer's token from a captured envelope or a published payload.
func tokenOf(t *testing.T, msg *message.Message) string {
	t.Helper()
	var p struct {
		Token string `json:"token"`
	}
	if ch, err := capture.Decode(msg); err == nil {
		after, err := capture.Row[struct {
			Token string `json:"token"`
		}](ch.After)
		if err != nil {
			t.Fatal(err)
		}
		return after.Token
	}
	if err := json.Unmarshal(msg.Payload, &p); err != nil || p.Token == "" {
		t.Fatalf("payload %s: %v", msg.Payload, err)
	}
	return p.Token
}
