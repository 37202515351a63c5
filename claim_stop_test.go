package outbox

import (
	"context"
	"strconv"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/uuid"

	"github.com/watermill-outbox/outbox/internal/dialect"
	"github.com/watermill-outbox/outbox/internal/dialect/memory"
)

// TestStopDuringClaimReleasesItsLeases: a claim whose statement commits its leases while the
// subscription stops (the answer comes after the stop) does not leave them to expire: the
// subscription releases them before it ends, so another relay claims them at once. Before,
// the claim ran under the subscription's context, the answer was dropped as canceled and the
// events waited for their lease (TestDemoPostgres missed up to 441 events this way).
func TestStopDuringClaimReleasesItsLeases(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		db := memory.New(memory.WithCapabilities(dialect.Capabilities{SkipLocked: true, Continuations: true, FlushAcks: true, DatabaseClock: true}))
		stopped := make(chan struct{})
		claims := 0
		db.SetHook(func(op memory.Op, after bool, _ dialect.Executor) error {
			if op == memory.OpClaim && after {
				if claims++; claims == 1 {
					<-stopped // the leases are written; the answer arrives after the stop
				}
			}
			return nil
		})
		rows := make([]dialect.InsertRow, 20)
		for i := range rows {
			k := "k" + strconv.Itoa(i%5)
			rows[i] = dialect.InsertRow{ID: uuid.Must(uuid.NewV7()).String(), Topic: "t", Payload: []byte("{}"), Headers: "{}", OrderingKey: &k}
		}
		if _, err := db.Insert(context.Background(), &memory.Executor{}, &dialect.InsertParams{Table: &dialect.Table{Parts: []string{DefaultTable}}, Rows: rows}); err != nil {
			t.Fatal(err)
		}
		sub, err := newSubscriberOn(&memory.Executor{}, db, SubscriberConfig{PollInterval: time.Second, LeaseDuration: time.Minute}, nil)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		msgs, err := sub.Subscribe(ctx, "t")
		if err != nil {
			t.Fatal(err)
		}
		synctest.Wait() // the claim waits in the hook with its leases written
		leased := 0
		for _, r := range db.Rows() {
			if r.LeasedBy != "" {
				leased++
			}
		}
		if leased != 20 {
			t.Fatalf("%d events leased by the claim in flight, want 20", leased)
		}
		cancel()
		close(stopped)
		for range msgs {
			t.Fatal("a message was emitted after the stop")
		}
		if err := sub.Close(); err != nil {
			t.Fatal(err)
		}
		for _, r := range db.Rows() {
			if r.LeasedBy != "" || !r.LeaseUntil.IsZero() {
				t.Fatalf("event %d still leased by %s until %s after the subscription stopped, want released", r.Sequence, r.LeasedBy, r.LeaseUntil)
			}
			if r.DeliveryStarts != 0 || r.Attempts != 0 {
				t.Fatalf("event %d: %d delivery starts, %d attempts after a stop that emitted nothing, want 0", r.Sequence, r.DeliveryStarts, r.Attempts)
			}
		}
	})
}
