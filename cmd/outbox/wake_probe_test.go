package main

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/internal/pgtest"
	"github.com/watermill-outbox/outbox/internal/privatepgbouncer"
)

// TestRelayPostgresWakesOnCommit: `outbox relay` with default flags (--poll-interval 5s) in its
// own process delivers each event that this process commits through a plain outbox.Publisher
// on a pgx.Tx well within a second: the relay probes the table's sequence, with no signal from
// the writer. Each event is committed right after the previous one arrived, so the relay's next
// poll is 5 s away: only the wakeup can deliver it within a second. The same through PgBouncer
// in transaction mode (the probe is a plain statement; no LISTEN).
func TestRelayPostgresWakesOnCommit(t *testing.T) {
	for _, b := range []backend{
		postgresBackend(),
		dsnBackend("pgbouncer", func(t *testing.T) string {
			return privatepgbouncer.Start(t, pgtest.DSN()).DSN("default_query_exec_mode=exec")
		}),
	} {
		t.Run(b.name, func(t *testing.T) {
			db, table := b.fresh(t)
			mustRun(t, nil, "migrate", "--db", db, "--table", table)
			rcv := newReceiver(t, http.StatusOK)
			p := start(t, []string{"OUTBOX_SECRET=" + rcv.secret}, "relay", "--db", db, "--table", table, "--to", rcv.URL+"/hook",
				"--allow-prefix", "127.0.0.0/8")
			for i := range 10 {
				ids := b.publish(t, db, table, []testEvent{{topic: "orders.created", key: "k", n: i}})
				committed := time.Now()
				waitFor(t, 20*time.Second, fmt.Sprintf("event %d delivered", i), func() bool {
					if !p.running() {
						t.Fatalf("relay exited")
					}
					_, ok := rcv.arrived(ids[0])
					return ok
				})
				// The first event may be found by the relay's first poll.
				if at, _ := rcv.arrived(ids[0]); i > 0 && at.Sub(committed) > time.Second {
					t.Fatalf("event %d arrived %s after COMMIT; want well within 1s (--poll-interval is 5s)", i, at.Sub(committed))
				}
			}
			if code := p.stop(t); code != 0 {
				t.Fatalf("relay exit status %d", code)
			}
			if want := `wake-probe=5ms wake-probe-idle=50ms wakeup=probe`; !strings.Contains(p.errb.String(), want) {
				t.Fatalf("relay log lacks %q", want)
			}
		})
	}
}

// BenchmarkRelayCommitToDelivery measures commit → delivery latency across processes with
// default settings on both sides: writers in this process commit one event per transaction
// through a plain outbox.Publisher at 1,000 events/s for 10 s (8 connections); `outbox relay`
// with default flags delivers them to a webhook receiver here. It reports the median and the
// 99th percentile of (arrival − COMMIT returned), in ms. Run with -benchtime=1x.
func BenchmarkRelayCommitToDelivery(b *testing.B) {
	pool := pgtest.Require(b)
	table := pgtest.Table(b)
	schema := schemaFor(kindPostgres, table)
	if err := outbox.Migrate(context.Background(), pool, schema); err != nil {
		b.Fatal(err)
	}
	rcv := newReceiver(b, http.StatusOK)
	p := start(b, []string{"OUTBOX_SECRET=" + rcv.secret}, "relay", "--db", pgtest.DSN(), "--table", table, "--to", rcv.URL+"/hook",
		"--allow-prefix", "127.0.0.0/8")
	const (
		rate     = 1000
		duration = 10 * time.Second
		writers  = 8
	)
	for range b.N {
		jobs := make(chan struct{}, rate)
		var (
			mu        sync.Mutex
			committed = map[string]time.Time{}
			wg        sync.WaitGroup
		)
		for range writers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range jobs {
					var id string
					err := pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error {
						pub, err := outbox.NewPublisher(tx, outbox.PublisherConfig{Schema: schema}, nil)
						if err != nil {
							return err
						}
						msg := outbox.NewMessage([]byte(`{"key":"","n":0}`))
						id = msg.UUID
						return pub.Publish("bench.latency", msg)
					})
					if err != nil {
						b.Error(err)
						return
					}
					now := time.Now()
					mu.Lock()
					committed[id] = now
					mu.Unlock()
				}
			}()
		}
		tick := time.NewTicker(time.Second / rate)
		end := time.Now().Add(duration)
		for time.Now().Before(end) {
			<-tick.C
			jobs <- struct{}{}
		}
		tick.Stop()
		close(jobs)
		wg.Wait()
		deadline := time.Now().Add(30 * time.Second)
		for {
			mu.Lock()
			n := len(committed)
			mu.Unlock()
			if len(rcv.received()) >= n {
				break
			}
			if time.Now().After(deadline) {
				b.Fatalf("%d of %d delivered within 30s", len(rcv.received()), n)
			}
			time.Sleep(10 * time.Millisecond)
		}
		var lat []time.Duration
		for id, c := range committed {
			at, _ := rcv.arrived(id)
			lat = append(lat, at.Sub(c))
		}
		slices.Sort(lat)
		b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
		b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
		b.ReportMetric(float64(len(lat))/duration.Seconds(), "events/s")
	}
	if code := p.stop(b); code != 0 {
		b.Fatalf("relay exit status %d", code)
	}
}
