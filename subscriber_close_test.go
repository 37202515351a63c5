package outbox_test

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/internal/pgtest"
)

// closeAnswer is what a test handler does with a message in flight when Close begins.
type closeAnswer int

const (
	answerAck     closeAnswer = iota // acks once Close has begun: within CloseTimeout
	answerOnStop                     // waits for its context to end, then nacks with ctx.Err()
	answerNothing                    // never answers
)

// answerOf spreads the three behaviours over a round's events.
func answerOf(i int) closeAnswer { return closeAnswer(i % 3) }

// handleAtClose answers msg as a handler of the given behaviour would once begun is closed.
func handleAtClose(msg *message.Message, a closeAnswer, begun <-chan struct{}) {
	switch a {
	case answerAck:
		<-begun
		msg.Ack()
	case answerOnStop:
		<-msg.Context().Done()
		outbox.SetNackError(msg, fmt.Errorf("publish: %w", msg.Context().Err()))
		msg.Nack()
	}
}

// TestCloseChargesNoAttempt: a Subscriber closed with 50 events in flight, 20 times, on the
// per-message and the batch path: the acks given while it closes are written, the messages
// that end with their context (context.Canceled) or stay unanswered are released with no
// attempt and no delivery start counted (MaxAttempts is 1, so one charged attempt would be a
// dead letter), and a later relay delivers every event.
func TestCloseChargesNoAttempt(t *testing.T) {
	const rounds, inFlight = 20, 50
	for _, path := range []string{"per-message", "batch"} {
		t.Run(path, func(t *testing.T) {
			eachBackend(t, func(t *testing.T, b *backend) {
				schema := b.table(t)
				cfg := fastCfg(schema)
				cfg.BatchSize, cfg.MaxRunPerKey, cfg.Concurrency, cfg.MaxAttempts = inFlight, inFlight, inFlight, 1
				cfg.LeaseDuration, cfg.DeliveryTimeout, cfg.CloseTimeout = 20*time.Second, 10*time.Second, 100*time.Millisecond
				// Per-message path: 50 keys per round, so all 50 events are out at once. Batch
				// path: 10 keys of 5 events; a key's events after one that was not acked are
				// released too.
				wantPublished := 0
				for r := range rounds {
					topic := fmt.Sprintf("close.%d", r)
					keys := make([]string, inFlight)
					for i := range keys {
						if path == "batch" {
							keys[i] = fmt.Sprintf("r%d-k%d", r, i%10)
						} else {
							keys[i] = fmt.Sprintf("r%d-k%d", r, i)
						}
					}
					b.publishKeys(t, schema, topic, r*inFlight, keys)
					sub, err := outbox.NewSubscriber(b.db, cfg, nil)
					if err != nil {
						t.Fatal(err)
					}
					var msgs []*message.Message
					timeout := time.After(10 * time.Second)
					if path == "batch" {
						ch, err := sub.SubscribeBatches(ctx, topic)
						if err != nil {
							t.Fatal(err)
						}
						select {
						case batch := <-ch:
							msgs = batch.Messages
						case <-timeout:
							t.Fatalf("round %d: no batch within 10s", r)
						}
					} else {
						ch, err := sub.Subscribe(ctx, topic)
						if err != nil {
							t.Fatal(err)
						}
						for len(msgs) < inFlight {
							select {
							case m := <-ch:
								msgs = append(msgs, m)
							case <-timeout:
								t.Fatalf("round %d: %d messages out within 10s, want %d", r, len(msgs), inFlight)
							}
						}
					}
					if len(msgs) != inFlight {
						t.Fatalf("round %d: %d messages out, want %d", r, len(msgs), inFlight)
					}
					begun := make(chan struct{})
					done := make(chan struct{}, inFlight)
					blocked := map[string]bool{} // ordering keys with an event not acked so far
					published := 0
					for _, m := range msgs {
						var p struct{ I int }
						if err := json.Unmarshal(m.Payload, &p); err != nil {
							t.Fatal(err)
						}
						a, k := answerOf(p.I), m.Metadata.Get(outbox.MetadataOrderingKey)
						if a == answerAck && !blocked[k] {
							published++
						} else {
							blocked[k] = true
						}
						go func() { handleAtClose(m, a, begun); done <- struct{}{} }()
					}
					close(begun)
					sub.Close()
					for range inFlight {
						<-done
					}
					wantPublished += published
					q := fmt.Sprintf(`SELECT count(*) FROM %q WHERE topic = '%s' AND `, schema.Table, topic)
					if n := b.count(t, q+`published_at IS NOT NULL`); n != published {
						t.Fatalf("round %d: %d published, want %d", r, n, published)
					}
					if n := b.count(t, q+`published_at IS NULL AND lease_until IS NULL AND leased_by IS NULL AND attempts = 0 AND delivery_starts = 0 AND dead_lettered_at IS NULL`); n != inFlight-published {
						t.Fatalf("round %d: %d released without an attempt, want %d", r, n, inFlight-published)
					}
				}
				if n := b.count(t, fmt.Sprintf(`SELECT count(*) FROM %q WHERE attempts > 0 OR dead_lettered_at IS NOT NULL`, schema.Table)); n != 0 {
					t.Fatalf("%d events charged an attempt over %d closes, want 0", n, rounds)
				}
				t.Logf("%d closes with %d events out: %d acked during the close, %d released, 0 attempts charged, 0 dead letters",
					rounds, inFlight, wantPublished, rounds*inFlight-wantPublished)

				// Every event is delivered afterwards, each key in order.
				sub := b.newSub(t, cfg)
				ch, err := sub.Subscribe(ctx, "close.*")
				if err != nil {
					t.Fatal(err)
				}
				rec := &recorder{}
				rec.consume(ch, ack)
				pgtest.Eventually(t, 30*time.Second, "every event published", func() bool {
					return b.count(t, fmt.Sprintf(`SELECT count(*) FROM %q WHERE published_at IS NOT NULL`, schema.Table)) == rounds*inFlight
				})
				if n := b.count(t, fmt.Sprintf(`SELECT count(*) FROM %q WHERE attempts > 0 OR dead_lettered_at IS NOT NULL`, schema.Table)); n != 0 {
					t.Fatalf("%d events charged an attempt, want 0", n)
				}
				if n := rec.count(); n != rounds*inFlight-wantPublished {
					t.Fatalf("the next relay delivered %d events, want %d", n, rounds*inFlight-wantPublished)
				}
			})
		})
	}
}
