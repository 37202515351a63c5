package inbox_test

import (
	"fmt"
	"os"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/inbox"
	"github.com/watermill-outbox/outbox/internal/pgtest"
)

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// BenchmarkInboxOverhead: the cost per message of a handler run through the inbox against the
// same handler without it, in the same run on the same database, 8 concurrent handlers. The
// handler inserts a business row and returns one follow-up message, written to the outbox
// table in the handler's transaction; without the inbox that is BEGIN, the business INSERT,
// the outbox INSERT, COMMIT; the inbox adds its INSERT … ON CONFLICT DO NOTHING. The two
// alternate for OUTBOX_BENCH_ROUNDS rounds (default 3) of OUTBOX_BENCH_MSGS messages (default
// 4000) each; it reports each one's median µs per message (wall time × handlers / messages)
// and the ratio inbox/plain (target ≤ 1.3).
func BenchmarkInboxOverhead(b *testing.B) {
	pool := pgtest.Require(b)
	total := envInt("OUTBOX_BENCH_MSGS", 4000)
	rounds := envInt("OUTBOX_BENCH_ROUNDS", 3)
	const handlers = 8
	e := pgEnv(b, "pgx", pool)
	handler := func(msg *message.Message, tx pgx.Tx) ([]*message.Message, error) {
		if _, err := tx.Exec(msg.Context(), fmt.Sprintf(`INSERT INTO %s (id) VALUES ($1)`, e.biz), msg.UUID); err != nil {
			return nil, err
		}
		return []*message.Message{outbox.NewMessage([]byte(`{"done":true}`))}, nil
	}
	plain := func(msg *message.Message) error {
		return pgx.BeginFunc(msg.Context(), pool, func(tx pgx.Tx) error {
			out, err := handler(msg, tx)
			if err != nil {
				return err
			}
			pub, err := outbox.NewPublisher(tx, outbox.PublisherConfig{Schema: e.outbox}, nil)
			if err != nil {
				return err
			}
			return pub.Publish("followups", out...)
		})
	}
	in, err := inbox.New(inbox.FromPgx(pool, pgx.TxOptions{}), e.config("bench"), nil)
	if err != nil {
		b.Fatal(err)
	}
	withInbox := func(msg *message.Message) error {
		_, err := in.Process(msg, handler)
		return err
	}
	run := func(process func(*message.Message) error) float64 {
		var next atomic.Int64
		var wg sync.WaitGroup
		start := time.Now()
		for range handlers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for next.Add(1) <= int64(total) {
					if err := process(outbox.NewMessage([]byte(`{}`))); err != nil {
						b.Error(err)
						return
					}
				}
			}()
		}
		wg.Wait()
		return float64(time.Since(start).Microseconds()) * handlers / float64(total)
	}
	for range b.N {
		var p, w []float64
		for range rounds {
			p = append(p, run(plain))
			w = append(w, run(withInbox))
		}
		sort.Float64s(p)
		sort.Float64s(w)
		b.ReportMetric(p[len(p)/2], "plain-µs/msg")
		b.ReportMetric(w[len(w)/2], "inbox-µs/msg")
		b.ReportMetric(w[len(w)/2]/p[len(p)/2], "ratio")
	}
}
