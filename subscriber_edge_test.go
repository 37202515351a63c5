package outbox_test

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/internal/pgtest"
)

// TestNoStarvationBehindBlockedKeys: a thousand dead-lettered keys, each with a waiting
// successor, sort before a healthy key; the key skip scan must still reach it.
func TestNoStarvationBehindBlockedKeys(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		schema := b.table(t)
		var ins []outbox.EventInput
		for round := range 2 {
			for i := 1; i <= 1000; i++ {
				ins = append(ins, outbox.EventInput{Topic: "t", Payload: round + 1, OrderingKey: fmt.Sprintf("a%05d", i)})
			}
		}
		p := b.publisher(t, outbox.PublisherConfig{Schema: schema})
		if _, err := p.EnqueueMany(ctx, ins); err != nil {
			t.Fatal(err)
		}
		b.exec(t, fmt.Sprintf(`UPDATE %[1]q SET dead_lettered_at = %[2]s, attempts = 5 WHERE sequence <= (SELECT min(sequence) + 999 FROM %[1]q)`, schema.Table, b.at(0)))
		if _, err := p.Enqueue(ctx, outbox.EventInput{Topic: "t", Payload: 3, OrderingKey: "zzz"}); err != nil {
			t.Fatal(err)
		}
		cfg := fastCfg(schema)
		cfg.KeyScan = 100
		ch, _ := b.newSub(t, cfg).Subscribe(ctx, "t")
		rec := &recorder{}
		rec.consume(ch, ack)
		pgtest.Eventually(t, 20*time.Second, "healthy key zzz delivered", func() bool {
			return b.count(t, fmt.Sprintf(`SELECT count(*) FROM %q WHERE ordering_key = 'zzz' AND published_at IS NOT NULL`, schema.Table)) == 1
		})
		for _, d := range rec.all() {
			if d.key != "zzz" {
				t.Fatalf("event of blocked key %s delivered", d.key)
			}
		}
	})
}

// TestBackoffHugeAttempts: a retry-for-ever configuration keeps marking (no numeric overflow
// in the backoff) and acks of the same batch are written.
func TestBackoffHugeAttempts(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		schema := b.table(t)
		b.seed(t, schema, "t", 3, []string{""})
		b.raw.ExecContext(ctx, fmt.Sprintf(`UPDATE %q SET attempts = 5000 WHERE sequence = (SELECT min(sequence) FROM %[1]q)`, schema.Table))
		cfg := fastCfg(schema)
		cfg.MaxAttempts = 1 << 30
		ch, _ := b.newSub(t, cfg).Subscribe(ctx, "t")
		(&recorder{}).consume(ch, func(m *message.Message) error {
			if m.Metadata.Get(outbox.MetadataAttempt) == "5001" {
				return errors.New("still down")
			}
			return nil
		})
		pgtest.Eventually(t, 10*time.Second, "failure recorded with backoff capped at RetryMax, acks written", func() bool {
			return b.count(t, fmt.Sprintf(`SELECT count(*) FROM %q WHERE (attempts = 5001 AND next_attempt_at BETWEEN %s AND %s) OR published_at IS NOT NULL`, schema.Table, b.at(0), b.at(2*time.Second))) == 3
		})
	})
}

func TestEnqueueManySavepointThroughWatermillTx(t *testing.T) {
	schema := newTable(t, func(c *outbox.SchemaConfig) { c.ExtraColumns = []outbox.Column{{Name: "n", Type: "INT NULL"}} })
	pool := pgtest.Require(t)
	tx, _ := pool.Begin(ctx)
	defer tx.Rollback(ctx)
	p := mustPublisher(t, wmsql.TxFromPgx(tx), outbox.PublisherConfig{Schema: schema})
	if _, err := p.Enqueue(ctx, outbox.EventInput{Topic: "t", Payload: 1, ExtraColumns: map[string]any{"n": "x"}}); err == nil {
		t.Fatal("want a database error")
	}
	if _, err := p.Enqueue(ctx, outbox.EventInput{Topic: "t", Payload: 2}); err != nil {
		t.Fatalf("transaction unusable after the savepoint rollback: %v", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := outbox.NewSubscriber(wmsql.TxFromPgx(tx), outbox.SubscriberConfig{}, nil); !errors.Is(err, outbox.ErrUnsupportedDB) {
		t.Fatalf("watermill-sql tx accepted by the subscriber: %v", err)
	}
	conn, err := pgx.Connect(ctx, pgtest.DSN())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := outbox.NewSubscriber(conn, outbox.SubscriberConfig{}, nil); !errors.Is(err, outbox.ErrUnsupportedDB) {
		t.Fatalf("*pgx.Conn accepted by the subscriber: %v", err)
	}
}

// TestFencingSameRelayName: two subscribers configured with one RelayName still fence each
// other (tokens carry a per-subscriber nonce).
func TestFencingSameRelayName(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		schema := b.table(t)
		b.seed(t, schema, "t", 1, []string{""})
		cfg := fastCfg(schema)
		cfg.RelayName = "relay"
		subA := b.newSub(t, cfg)
		chA, _ := subA.Subscribe(ctx, "t")
		msgA := <-chA
		b.raw.ExecContext(ctx, fmt.Sprintf(`UPDATE %q SET lease_until = %s`, schema.Table, b.at(-time.Second)))
		chB, _ := b.newSub(t, cfg).Subscribe(ctx, "t")
		(&recorder{}).consume(chB, ack)
		pgtest.Eventually(t, 10*time.Second, "B published", func() bool {
			return b.count(t, fmt.Sprintf(`SELECT count(*) FROM %q WHERE published_at IS NOT NULL`, schema.Table)) == 1
		})
		outbox.SetNackError(msgA, errors.New("late"))
		msgA.Nack()
		subA.Close()
		if n := b.count(t, fmt.Sprintf(`SELECT count(*) FROM %q WHERE attempts = 0 AND last_error IS NULL AND published_at IS NOT NULL`, schema.Table)); n != 1 {
			t.Fatal("A's late nack changed the event B published")
		}
	})
}

func TestLongTableNamesDoNotShareIndexes(t *testing.T) {
	pool := pgtest.Require(t)
	prefix := strings.Repeat("é", 25) // 50 bytes, shared by both names
	for _, suffix := range []string{"_a", "_b"} {
		cfg := outbox.SchemaConfig{Table: prefix + suffix}
		t.Cleanup(func() { pool.Exec(ctx, `DROP TABLE IF EXISTS `+pgx.Identifier{cfg.Table}.Sanitize()) })
		if err := outbox.Migrate(ctx, pool, cfg); err != nil {
			t.Fatal(err)
		}
		if n := count(t, `SELECT count(*) FROM pg_indexes WHERE tablename = $1`, cfg.Table); n != 10 {
			t.Fatalf("%s has %d indexes, want 10", cfg.Table, n)
		}
		m := outbox.NewMessage([]byte(`1`))
		outbox.SetIdempotencyKey(m, "k")
		if err := mustPublisher(t, pool, outbox.PublisherConfig{Schema: cfg}).Publish("t", m); err != nil {
			t.Fatal(err)
		}
	}
}

// TestSubscribeBatchesKeepsKeyOrder: in a batch, an ack after a failed event of the same key
// is not recorded as published (it would overtake the failed one); other keys are unaffected.
func TestSubscribeBatchesKeepsKeyOrder(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		schema := b.table(t)
		b.seed(t, schema, "t", 6, []string{"a", "b"}) // a: 1st,3rd,5th; b: 2nd,4th,6th
		cfg := fastCfg(schema)
		cfg.RetryBase = 10 * time.Second
		cfg.RetryMax = 10 * time.Second
		sub := b.newSub(t, cfg)
		ch, err := sub.SubscribeBatches(ctx, "t")
		if err != nil {
			t.Fatal(err)
		}
		batch := <-ch
		if len(batch.Messages) != 6 {
			t.Fatalf("batch of %d", len(batch.Messages))
		}
		for i, m := range batch.Messages {
			if i == 0 { // first event of key a fails
				m.Nack()
				continue
			}
			m.Ack()
		}
		sub.Close()
		var got []string
		rows, _ := b.raw.QueryContext(ctx, fmt.Sprintf(`SELECT ordering_key || ':' || (CASE WHEN published_at IS NOT NULL THEN 'published' WHEN attempts > 0 THEN 'failed' ELSE 'pending' END) FROM %q ORDER BY sequence`, schema.Table))
		for rows.Next() {
			var s string
			rows.Scan(&s)
			got = append(got, s)
		}
		rows.Close()
		want := "[a:failed b:published a:pending b:published a:pending b:published]"
		if fmt.Sprint(got) != want {
			t.Fatalf("states %v, want %s", got, want)
		}
	})
}

// TestLeaseLostStopsEmitting: when a renewal finds the batch's lease taken over, the relay
// emits nothing more of that batch and changes nothing.
func TestLeaseLostStopsEmitting(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		schema := b.table(t)
		b.seed(t, schema, "t", 3, []string{"k"})
		cfg := fastCfg(schema)
		cfg.LeaseDuration, cfg.DeliveryTimeout = 1500*time.Millisecond, time.Second
		cfg.MaxRunPerKey = 3
		logs := &errorLog{}
		sub, err := outbox.NewSubscriber(b.db, cfg, logs)
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Close()
		ch, _ := sub.Subscribe(ctx, "t")
		first := <-ch
		// Another relay takes the events over.
		if _, err := b.raw.ExecContext(ctx, fmt.Sprintf(`UPDATE %q SET leased_by = 'someone-else', lease_until = %s`, schema.Table, b.at(time.Minute))); err != nil {
			t.Fatal(err)
		}
		pgtest.Eventually(t, 5*time.Second, "the next renewal notices the loss", func() bool {
			return logs.has("outbox: lease lost")
		})
		first.Ack()
		// Without the loss the key's second event would be emitted right after this ack. A
		// negative check needs a bound: half a second is ample for a channel hand-off.
		select {
		case m := <-ch:
			t.Fatalf("emitted sequence %s after the lease was lost", m.Metadata.Get(outbox.MetadataSequence))
		case <-time.After(500 * time.Millisecond):
		}
		sub.Close()
		for m := range ch {
			t.Fatalf("emitted sequence %s after the lease was lost", m.Metadata.Get(outbox.MetadataSequence))
		}
		if n := b.count(t, fmt.Sprintf(`SELECT count(*) FROM %q WHERE published_at IS NOT NULL OR leased_by <> 'someone-else'`, schema.Table)); n != 0 {
			t.Fatalf("%d events changed by the relay that lost its lease", n)
		}
	})
}

// errorLog records the messages logged at ERROR; safe for concurrent use.
type errorLog struct {
	mu   sync.Mutex
	msgs []string
}

func (l *errorLog) Error(msg string, err error, fields watermill.LogFields) {
	l.mu.Lock()
	l.msgs = append(l.msgs, msg)
	l.mu.Unlock()
}
func (l *errorLog) Info(string, watermill.LogFields)                 {}
func (l *errorLog) Debug(string, watermill.LogFields)                {}
func (l *errorLog) Trace(string, watermill.LogFields)                {}
func (l *errorLog) With(watermill.LogFields) watermill.LoggerAdapter { return l }

func (l *errorLog) has(prefix string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, m := range l.msgs {
		if strings.HasPrefix(m, prefix) {
			return true
		}
	}
	return false
}
