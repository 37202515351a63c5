package outbox_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-outbox/outbox"
)

// TestStressFourRelaysKeyOrderWithFailures: four relays share one table; handlers fail about
// 5% of deliveries. For every delivery attempt of an event, every earlier event of its key
// must already have been acked — the per-key order guarantee, checked at the moment of each
// delivery, not only at the end. Unordered events are mixed in.
func TestStressFourRelaysKeyOrderWithFailures(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		schema := b.table(t)
		n, nkeys := 8000, 200
		if testing.Short() {
			n = 2000
		}
		n = b.scale(n, 4)
		keys := make([]string, nkeys+1)
		for i := range nkeys {
			keys[i] = "k" + strconv.Itoa(i)
		}
		keys[nkeys] = "" // every 201st event unordered
		b.seed(t, schema, "stress", n, keys)

		seqsOfKey := b.keySequences(t, schema.Table)

		var mu sync.Mutex
		acked := map[int64]bool{}
		var violations []string
		rng := rand.New(rand.NewPCG(1, 2))
		handle := func(msg *message.Message) error {
			seq, _ := strconv.ParseInt(msg.Metadata.Get(outbox.MetadataSequence), 10, 64)
			key := msg.Metadata.Get(outbox.MetadataOrderingKey)
			mu.Lock()
			defer mu.Unlock()
			if key != "" {
				for _, earlier := range seqsOfKey[key] {
					if earlier >= seq {
						break
					}
					if !acked[earlier] {
						violations = append(violations, fmt.Sprintf("key %s: %d delivered before %d was acked", key, seq, earlier))
						break
					}
				}
			}
			if rng.IntN(100) < 5 {
				return errors.New("random failure")
			}
			acked[seq] = true
			return nil
		}
		for r := range 4 {
			cfg := fastCfg(schema)
			cfg.RelayName = fmt.Sprintf("stress-%d", r)
			cfg.BatchSize = 50 + 50*r
			cfg.MaxRunPerKey = 1 + r*3
			cfg.KeyScan = 40
			cfg.RetryBase, cfg.RetryMax = 5*time.Millisecond, 20*time.Millisecond
			cfg.MaxAttempts = 100
			ch, err := b.newSub(t, cfg).Subscribe(ctx, "stress")
			if err != nil {
				t.Fatal(err)
			}
			(&recorder{}).consume(ch, handle)
		}
		deadline := time.Now().Add(120 * time.Second)
		for b.count(t, fmt.Sprintf(`SELECT count(*) FROM %q WHERE published_at IS NULL`, schema.Table)) != 0 {
			if time.Now().After(deadline) {
				var pending, leased, failed, dead int
				b.raw.QueryRowContext(ctx, fmt.Sprintf(`SELECT count(*) FILTER (WHERE published_at IS NULL), count(*) FILTER (WHERE lease_until > %[2]s),
					count(*) FILTER (WHERE attempts > 0 AND published_at IS NULL), count(*) FILTER (WHERE dead_lettered_at IS NOT NULL) FROM %[1]q`, schema.Table, b.at(0))).Scan(&pending, &leased, &failed, &dead)
				t.Fatalf("not drained in 120s: pending=%d leased=%d failed=%d dead=%d", pending, leased, failed, dead)
			}
			time.Sleep(20 * time.Millisecond)
		}
		mu.Lock()
		defer mu.Unlock()
		if len(violations) > 0 {
			sort.Strings(violations)
			t.Fatalf("%d order violations, first: %v", len(violations), violations[:min(5, len(violations))])
		}
		if len(acked) != n {
			t.Fatalf("acked %d distinct events, want %d", len(acked), n)
		}
	})
}

// keySequences returns every sequence of each ordering key of table, ascending.
func (b *backend) keySequences(t *testing.T, table string) map[string][]int64 {
	t.Helper()
	out := map[string][]int64{}
	rows, err := b.raw.QueryContext(ctx, fmt.Sprintf(`SELECT ordering_key, sequence FROM %q WHERE ordering_key IS NOT NULL ORDER BY sequence`, table))
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var k string
		var s int64
		if err := rows.Scan(&k, &s); err != nil {
			t.Fatal(err)
		}
		out[k] = append(out[k], s)
	}
	return out
}
