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
	"github.com/watermill-outbox/outbox/internal/dialect"
	"github.com/watermill-outbox/outbox/wakeup/sqlitewal"
)

// BenchmarkCrossProcessLatency: writers in 4 other processes (OUTBOX_BENCH_WRITERS) commit 1,000
// events/s in all (one event per transaction) for 10 s; a relay in this process delivers them.
// It reports the commit → handler delay's p50 and p99 in milliseconds (the writer's clock just
// before COMMIT to the handler's receipt; same machine, so one clock), and the writers' side:
// their transactions per second in all (paced at 1,000: less means they fell behind), the worst
// writer's p99 wait for the write lock (begin-p99-ms, BEGIN IMMEDIATE through SQLite's busy
// handler) and its p99 COMMIT (commit-p99-ms). Variants, in this order: the file-notification
// wakeup with the relays' eager locking policies (eager=woken, the default: every claim while
// writers commit; eager=first: only the first claim after each wakeup, as before; eager=never:
// SQLite's busy handler only), with and without claims that look for work before taking the
// write lock (readfirst, on by default), and, as the comparator, polling only (PollInterval 5s,
// the default). -count runs each variant that many times in a row: for interleaved rounds run
// the command in a loop.
//
//	go test -run '^$' -bench CrossProcessLatency -benchtime 1x ./wakeup/sqlitewal/
func BenchmarkCrossProcessLatency(b *testing.B) {
	variants := []struct {
		name        string
		wake        bool
		eager       int32
		noReadFirst bool
	}{
		{"wakeup=true/eager=woken", true, dialect.EagerWhileWoken, false},
		{"wakeup=true/eager=woken/readfirst=false", true, dialect.EagerWhileWoken, true},
		{"wakeup=true/eager=first/readfirst=false", true, dialect.EagerFirstAfterWake, true},
		{"wakeup=true/eager=never", true, dialect.EagerNever, false},
		{"wakeup=false", false, dialect.EagerWhileWoken, false},
	}
	defer dialect.SQLiteEager.Store(dialect.EagerWhileWoken)
	defer dialect.SQLiteNoReadFirst.Store(false)
	for _, v := range variants {
		b.Run(v.name, func(b *testing.B) {
			dialect.SQLiteEager.Store(v.eager)
			dialect.SQLiteNoReadFirst.Store(v.noReadFirst)
			for range b.N {
				r := crossProcessRun(b, v.wake, benchWriters, 1000/benchWriters, 10*time.Second)
				b.ReportMetric(r.p50, "p50-ms")
				b.ReportMetric(r.p99, "p99-ms")
				b.ReportMetric(float64(r.events), "events")
				b.ReportMetric(r.writerTxs, "writer-tx/s")
				b.ReportMetric(r.beginP99, "begin-p99-ms")
				b.ReportMetric(r.commitP99, "commit-p99-ms")
			}
		})
	}
}

// crossRun is one crossProcessRun's figures.
type crossRun struct {
	p50, p99  float64 // commit → handler, ms
	events    int
	writerTxs float64 // the writers' transactions per second, summed
	beginP99  float64 // the worst writer's p99 wait for the write lock, ms
	commitP99 float64 // the worst writer's p99 COMMIT, ms
}

func crossProcessRun(b *testing.B, wake bool, writers, ratePerWriter int, d time.Duration) crossRun {
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
	var waits []func() (writerStats, error)
	for i := range writers {
		waits = append(waits, startWriterStats(b, path, i*per, per, ratePerWriter))
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
	var r crossRun
	for _, w := range waits {
		st, err := w()
		if err != nil {
			b.Fatal(err)
		}
		r.writerTxs += float64(st.Events) / st.Elapsed.Seconds()
		r.beginP99 = max(r.beginP99, float64(st.BeginP99)/1e6)
		r.commitP99 = max(r.commitP99, float64(st.CommitP99)/1e6)
	}
	slices.Sort(lags)
	ms := func(q float64) float64 { return float64(lags[int(q*float64(len(lags)-1))]) / 1e6 }
	r.p50, r.p99, r.events = ms(0.50), ms(0.99), len(lags)
	return r
}

// benchWriters is the number of writer processes (OUTBOX_BENCH_WRITERS, default 4); they share
// the 1,000 events/s.
var benchWriters = func() int {
	if n, err := strconv.Atoi(os.Getenv("OUTBOX_BENCH_WRITERS")); err == nil && n > 0 && n <= 1000 {
		return n
	}
	return 4
}()
