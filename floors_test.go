package outbox_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/internal/pgtest"
)

// TestEventsBehindAFloor: a key's head fails (a retry, a dead letter then retried by an
// operator, a dead letter then purged) while 300 events (60 on SQLite under -race) of other keys and unordered ones are
// delivered, so that on PostgreSQL the relay's floors move past the key's waiting events; once
// the head is due again (or purged), the key's events are delivered exactly once, in order,
// within seconds (the claim's retry scan, the next_attempt_at that RetryDeadLettered and
// PurgeDeadLettered set, and the relay following the key: with BatchSize 3 the head's run is cut
// short, so the key's later events are found only by following it).
func TestEventsBehindAFloor(t *testing.T) {
	for _, mode := range []string{"retry", "dead then retried", "dead then purged"} {
		t.Run(mode, func(t *testing.T) {
			eachBackend(t, func(t *testing.T, b *backend) {
				schema := b.table(t)
				b.publishKeys(t, schema, "t", 0, []string{"a", "a", "a", "a", "a"})
				cfg := fastCfg(schema)
				cfg.RetryBase, cfg.RetryMax, cfg.BatchSize = 2*time.Second, 2*time.Second, 3
				sub := b.newSub(t, cfg)
				ch, err := sub.Subscribe(ctx, "t")
				if err != nil {
					t.Fatal(err)
				}
				var rec recorder
				first := true
				var failMu = make(chan struct{}, 1)
				failMu <- struct{}{}
				rec.consume(ch, func(m *message.Message) error {
					if strings.ReplaceAll(string(m.Payload), " ", "") != `{"i":0}` {
						return nil
					}
					<-failMu
					defer func() { failMu <- struct{}{} }()
					if !first {
						return nil
					}
					first = false
					if mode == "retry" {
						return errors.New("destination refused")
					}
					return outbox.Permanent(errors.New("destination refused for good"))
				})
				n := b.scale(300, 5)
				others := make([]string, n)
				for i := range others {
					if i%3 > 0 {
						others[i] = fmt.Sprintf("o%d", i%20)
					}
				}
				b.publishKeys(t, schema, "t", 100, others)
				pgtest.Eventually(t, 60*time.Second, "the other events delivered", func() bool {
					return b.count(t, fmt.Sprintf(`SELECT count(*) FROM %q WHERE published_at IS NOT NULL AND (ordering_key IS NULL OR ordering_key <> 'a')`, schema.Table)) == n
				})
				// More claims after the others' marks, so that the floors settle above the key.
				b.publishKeys(t, schema, "t", 1000, []string{"", "p"})
				pgtest.Eventually(t, 10*time.Second, "two more events delivered", func() bool {
					return b.count(t, fmt.Sprintf(`SELECT count(*) FROM %q WHERE published_at IS NOT NULL AND (ordering_key IS NULL OR ordering_key <> 'a')`, schema.Table)) == n+2
				})
				switch mode {
				case "dead then retried":
					if n, err := sub.RetryDeadLettered(ctx, outbox.RetryFilter{Topics: []string{"t"}}); err != nil || n != 1 {
						t.Fatalf("retried %d, %v", n, err)
					}
				case "dead then purged":
					if n, err := sub.PurgeDeadLettered(ctx, outbox.DeadLetterFilter{Topics: []string{"t"}}); err != nil || n != 1 {
						t.Fatalf("purged %d, %v", n, err)
					}
				}
				want := []int64{1, 2, 3, 4, 5}
				if mode == "dead then purged" {
					want = want[1:]
				}
				pgtest.Eventually(t, 15*time.Second, "the key's events delivered", func() bool {
					return b.count(t, fmt.Sprintf(`SELECT count(*) FROM %q WHERE published_at IS NOT NULL AND ordering_key = 'a'`, schema.Table)) == len(want)
				})
				var got []int64
				for _, d := range rec.all() {
					if d.key == "a" && (len(got) == 0 || got[len(got)-1] != d.seq) {
						got = append(got, d.seq)
					}
				}
				if mode == "dead then purged" {
					got = slices.DeleteFunc(got, func(s int64) bool { return s == 1 })
				}
				if !slices.Equal(got, want) {
					t.Fatalf("key a delivered as %v, want %v", got, want)
				}
			})
		})
	}
}

// TestSweepFindsEventsBelowTheFloors (PostgreSQL): an event written below the relay's floors
// without the Publisher (here: into the sequence gap a rolled-back write left, after the floors
// moved past it) is found by the sweep and delivered.
func TestSweepFindsEventsBelowTheFloors(t *testing.T) {
	t.Cleanup(outbox.SetSweepInterval(300 * time.Millisecond)) // after the Subscriber's Close
	b := pgBackend(t)
	schema := b.table(t)
	tx, err := b.raw.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	pub := mustPublisher(t, tx, outbox.PublisherConfig{Schema: schema})
	gap := outbox.NewMessage([]byte(`{"i":"gap"}`))
	outbox.SetOrderingKey(gap, "g")
	if err := pub.Publish("t", gap); err != nil {
		t.Fatal(err)
	}
	var gapSeq int64
	if err := tx.QueryRowContext(ctx, fmt.Sprintf(`SELECT max("sequence") FROM %q`, schema.Table)).Scan(&gapSeq); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	sub := b.newSub(t, fastCfg(schema))
	ch, err := sub.Subscribe(ctx, "t")
	if err != nil {
		t.Fatal(err)
	}
	var rec recorder
	rec.consume(ch, func(*message.Message) error { return nil })
	for i := range 3 {
		b.publishKeys(t, schema, "t", 100*i, []string{"g", "h", ""})
		pgtest.Eventually(t, 10*time.Second, "events delivered", func() bool {
			return b.count(t, fmt.Sprintf(`SELECT count(*) FROM %q WHERE published_at IS NOT NULL`, schema.Table)) == 3*(i+1)
		})
	}
	b.exec(t, fmt.Sprintf(`INSERT INTO %q ("sequence", "id", "topic", "payload", "ordering_key") OVERRIDING SYSTEM VALUE VALUES ($1, gen_random_uuid(), 't', '{"i":"late"}', 'late')`, schema.Table), gapSeq)
	pgtest.Eventually(t, 10*time.Second, "the event below the floors delivered", func() bool {
		return b.count(t, fmt.Sprintf(`SELECT count(*) FROM %q WHERE published_at IS NOT NULL AND ordering_key = 'late'`, schema.Table)) == 1
	})
	n := 0
	for _, d := range rec.all() {
		if d.seq == gapSeq {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("the late event was delivered %d times, want 1", n)
	}
}
