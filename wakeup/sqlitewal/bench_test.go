package sqlitewal_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/wakeup/sqlitewal"
)

// BenchmarkCrossProcessLatency: writers in 4 other processes (OUTBOX_BENCH_WRITERS) commit 1,000 events/s in all
// (one event per transaction) for 10 s; a relay in this process delivers them. It reports the
// commit → handler delay's p50 and p99 in milliseconds (the writer's clock just before COMMIT
// to the handler's receipt; same machine, so one clock), with the file-notification wakeup and,
// as the comparator, polling only (PollInterval 5s, the default):
//
//	go test -run '^$' -bench CrossProcessLatency -benchtime 1x ./wakeup/sqlitewal/
func BenchmarkCrossProcessLatency(b *testing.B) {
	for _, wake := range []bool{true, false} {
		b.Run(fmt.Sprintf("wakeup=%v", wake), func(b *testing.B) {
			for range b.N {
				p50, p99, n := crossProcessRun(b, wake, benchWriters, 1000/benchWriters, 10*time.Second)
				b.ReportMetric(p50, "p50-ms")
				b.ReportMetric(p99, "p99-ms")
				b.ReportMetric(float64(n), "events")
			}
		})
	}
}

func crossProcessRun(b *testing.B, wake bool, writers, ratePerWriter int, d time.Duration) (p50, p99 float64, n int) {
	path, db := openDB(b)
	cfg := outbox.SubscriberConfig{Schema: schema}
	if wake {
		w, err := sqlitewal.New(path, nil)
		if err != nil {
			b.Fatal(err)
		}
		defer w.Close()
		cfg.Wakeup = w
	}
	sub, err := outbox.NewSubscriber(db, cfg, watermill.NopLogger{})
	if err != nil {
		b.Fatal(err)
	}
	defer sub.Close()
	ctx, cancel := context.WithTimeout(context.Background(), d+time.Minute)
	defer cancel()
	msgs, err := sub.Subscribe(ctx, "walwake")
	if err != nil {
		b.Fatal(err)
	}
	per := ratePerWriter * int(d/time.Second)
	var waits []func() error
	for i := range writers {
		waits = append(waits, startWriter(b, path, i*per, per, ratePerWriter))
	}
	lags := make([]time.Duration, 0, writers*per)
	for len(lags) < writers*per {
		select {
		case m := <-msgs:
			now := time.Now()
			var seq, sent int64
			if _, err := fmt.Sscanf(string(m.Payload), "[%d, %d]", &seq, &sent); err != nil {
				b.Fatal(err)
			}
			lags = append(lags, now.Sub(time.Unix(0, sent)))
			m.Ack()
		case <-ctx.Done():
			b.Fatalf("%d of %d events delivered", len(lags), writers*per)
		}
	}
	for _, w := range waits {
		if err := w(); err != nil {
			b.Fatal(err)
		}
	}
	slices.Sort(lags)
	ms := func(q float64) float64 { return float64(lags[int(q*float64(len(lags)-1))]) / 1e6 }
	return ms(0.50), ms(0.99), len(lags)
}

// benchWriters is the number of writer processes (OUTBOX_BENCH_WRITERS, default 4); they share
// the 1,000 events/s.
var benchWriters = func() int {
	if n, err := strconv.Atoi(os.Getenv("OUTBOX_BENCH_WRITERS")); err == nil && n > 0 && n <= 1000 {
		return n
	}
	return 4
}()
