package wal_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/capture/wal"
	"github.com/watermill-outbox/outbox/forwarder"
)

// TestParking: a key whose delivery fails is parked in the outbox table after MaxAttempts,
// its later changes are parked behind it without being tried while it has unpublished rows,
// other keys flow meanwhile; the outbox relay then delivers the parked rows in order, and once
// they are published the key's next changes go straight to the destination again.
// With a forwarder.BatchPublisher destination, each batch goes out in one PublishBatch call
// first (one more attempt for the failing change).
func TestParking(t *testing.T) {
	t.Run("publisher", func(t *testing.T) { testParking(t, false) })
	t.Run("batch-publisher", func(t *testing.T) { testParking(t, true) })
}

// batchRecorder is a recorder with PublishBatch: a failing message holds back its key's later
// messages of the batch.
type batchRecorder struct{ *recorder }

func (b batchRecorder) PublishBatch(_ context.Context, batch []forwarder.Outgoing) []error {
	errs := make([]error, len(batch))
	failed := map[string]bool{}
	for i, o := range batch {
		k := o.Message.Metadata.Get(outbox.MetadataOrderingKey)
		if failed[k] {
			errs[i] = forwarder.ErrHeldBack
			continue
		}
		if errs[i] = b.Publish(o.Topic, o.Message); errs[i] != nil {
			failed[k] = true
		}
	}
	return errs
}

func testParking(t *testing.T, batch bool) {
	_, pool := logicalPG(t)
	tables := itemTable(t, pool, 10)
	rec := &recorder{}
	rec.setFail(func(m *message.Message) bool { return m.Metadata.Get(outbox.MetadataOrderingKey) == "item:3" })
	var dest message.Publisher = rec
	wantRetries := uint64(1)
	if batch {
		dest, wantRetries = batchRecorder{rec}, 2
	}
	src, err := wal.New(pool, wal.Config{Tables: tables, Destination: dest, MaxAttempts: 2, RetryBackoff: 5 * time.Millisecond, StatusInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, src)
	versionsOf := func(key string) []int {
		var out []int
		for _, c := range decodeItems(t, rec.snapshot()) {
			if "item:"+itoa(c.id) == key {
				out = append(out, c.v)
			}
		}
		return out
	}
	waitFor(t, 30*time.Second, "9 inserts delivered and 1 parked", func() bool { return len(rec.snapshot()) == 9 && src.Stats().Parked == 1 })
	for range 4 {
		exec(t, pool, `UPDATE item SET v = v + 1 WHERE id = 3`)
	}
	exec(t, pool, `UPDATE item SET v = v + 1 WHERE id = 5`, `UPDATE item SET v = v + 1 WHERE id = 5`)
	waitFor(t, 30*time.Second, "item 5 delivered, item 3 parked", func() bool {
		return slices.Equal(versionsOf("item:5"), []int{0, 1, 2}) && src.Stats().Parked == 5
	})
	var unpublished int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+outbox.DefaultTable+" WHERE published_at IS NULL AND ordering_key = 'item:3'").Scan(&unpublished); err != nil {
		t.Fatal(err)
	}
	if st := src.Stats(); unpublished != 5 || st.Retries != wantRetries || len(versionsOf("item:3")) != 0 {
		t.Fatalf("unpublished %d (want 5), retries %d (want %d: only the first change was tried), delivered versions of item 3 %v", unpublished, st.Retries, wantRetries, versionsOf("item:3"))
	}

	// The destination recovers; the relay delivers the parked rows.
	rec.setFail(nil)
	sub, err := outbox.NewSubscriber(pool, outbox.SubscriberConfig{PollInterval: 20 * time.Millisecond}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	msgs, err := sub.Subscribe(sctx, "item.*")
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for m := range msgs {
			if rec.Publish(m.Metadata.Get(outbox.MetadataTopic), m) == nil {
				m.Ack()
			} else {
				m.Nack()
			}
		}
	}()
	waitFor(t, 30*time.Second, "parked rows delivered", func() bool { return slices.Equal(versionsOf("item:3"), []int{0, 1, 2, 3, 4}) })
	waitFor(t, 30*time.Second, "parked rows published", func() bool {
		_ = pool.QueryRow(ctx, "SELECT count(*) FROM "+outbox.DefaultTable+" WHERE published_at IS NULL").Scan(&unpublished)
		return unpublished == 0
	})
	exec(t, pool, `UPDATE item SET v = v + 1 WHERE id = 3`, `UPDATE item SET v = v + 1 WHERE id = 3`)
	waitFor(t, 30*time.Second, "item 3's next changes", func() bool { return len(versionsOf("item:3")) == 7 })
	if got := versionsOf("item:3"); !slices.Equal(got, []int{0, 1, 2, 3, 4, 5, 6}) || src.Stats().Parked != 5 {
		t.Fatalf("item 3 versions %v (want 0..6), parked %d (want 5)", got, src.Stats().Parked)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

func itoa(i int) string { return string(rune('0' + i)) }
