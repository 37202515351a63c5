// Package demo is the part the broker examples share: a PostgreSQL outbox and business table,
// four writers that commit orders with their events, the relay, and the tally of what a
// broker's own Watermill subscriber received. Each example adds only its broker.
package demo

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/forwarder"
)

// The load every example writes: Transactions transactions of EventsPerTx events each, over
// Orders ordering keys, from Writers concurrent writers.
const (
	Orders       = 50
	Transactions = 100
	EventsPerTx  = 10
	Total        = Transactions * EventsPerTx
	Writers      = 4
	// Timeout bounds a whole example run.
	Timeout = 25 * time.Second
)

// Env returns the environment variable name, or def when it is unset.
func Env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// Main runs run with a Timeout context, prints its line and exits non-zero when run fails or
// reports a mismatch.
func Main(run func(ctx context.Context) (line string, ok bool, err error)) {
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	line, ok, err := run(ctx)
	cancel()
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(line)
	if !ok {
		os.Exit(1)
	}
}

// Run is one example's database side.
type Run struct {
	Pool     *pgxpool.Pool
	Schema   outbox.SchemaConfig
	business string
	sub      *outbox.Subscriber
}

// Setup connects to OUTBOX_EXAMPLE_POSTGRES_DSN (default the local test database) and creates
// fresh outbox and business tables named after name and the process id. Close drops them.
func Setup(ctx context.Context, name string) (*Run, error) {
	pool, err := pgxpool.New(ctx, Env("OUTBOX_EXAMPLE_POSTGRES_DSN", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"))
	if err != nil {
		return nil, err
	}
	suffix := fmt.Sprint(os.Getpid())
	r := &Run{Pool: pool, Schema: outbox.SchemaConfig{Table: "example_" + name + "_outbox_" + suffix}, business: "example_" + name + "_orders_" + suffix}
	if err := outbox.Migrate(ctx, pool, r.Schema); err != nil {
		r.Close()
		return nil, err
	}
	if _, err := pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE %q (order_id text, step int, state text, PRIMARY KEY (order_id, step))`, r.business)); err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

// Close drops the tables and closes the pool.
func (r *Run) Close() {
	_, _ = r.Pool.Exec(context.Background(), fmt.Sprintf(`DROP TABLE IF EXISTS %q; DROP TABLE IF EXISTS %q`, r.Schema.Table, r.business))
	r.Pool.Close()
}

// Relay starts the relay — outbox subscriber → forwarder → pub — until stop is called.
func (r *Run) Relay(ctx context.Context, pub message.Publisher) (stop func(), err error) {
	r.sub, err = outbox.NewSubscriber(r.Pool, outbox.SubscriberConfig{Schema: r.Schema, PollInterval: 50 * time.Millisecond, BatchSize: 500}, nil)
	if err != nil {
		return nil, err
	}
	fwd, err := forwarder.New(r.sub, pub, forwarder.Config{}, nil)
	if err != nil {
		return nil, err
	}
	go func() {
		if err := fwd.Run(ctx); err != nil {
			log.Print(err)
		}
	}()
	return func() { _ = fwd.Close() }, nil
}

// event is the payload of every event: the order and its step (1, 2, … per order).
type event struct {
	Order string `json:"order"`
	Step  int    `json:"step"`
}

// Write commits the load on topic: each transaction inserts business rows and their events
// (ordering key = order id, metadata source = source). Writer w owns the orders w, w+4, … so
// each order's steps commit in step order.
func (r *Run) Write(ctx context.Context, topic, source string) error {
	var wg sync.WaitGroup
	errs := make(chan error, Writers)
	for w := range Writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var own []string
			for o := w; o < Orders; o += Writers {
				own = append(own, fmt.Sprintf("order-%02d", o))
			}
			step := map[string]int{}
			for n := 0; n*Writers+w < Transactions; n++ {
				order := own[n%len(own)]
				err := pgx.BeginFunc(ctx, r.Pool, func(tx pgx.Tx) error {
					p, err := outbox.NewPublisher(tx, outbox.PublisherConfig{Schema: r.Schema}, nil)
					if err != nil {
						return err
					}
					var batch []*message.Message
					for range EventsPerTx {
						step[order]++
						if _, err := tx.Exec(ctx, fmt.Sprintf(`INSERT INTO %q VALUES ($1, $2, 'placed')`, r.business), order, step[order]); err != nil {
							return err
						}
						body, _ := json.Marshal(event{Order: order, Step: step[order]})
						msg := outbox.NewMessage(body)
						outbox.SetOrderingKey(msg, order)
						msg.Metadata.Set("source", source)
						batch = append(batch, msg)
					}
					return p.Publish(topic, batch...)
				})
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// Tally reads Total distinct events from msgs (acking each), counts duplicates and per-order
// step gaps, waits until the relay has marked everything, and returns the line
// "delivered=N duplicates=N reordered=N" and whether it is the expected one.
func (r *Run) Tally(ctx context.Context, msgs <-chan *message.Message) (string, bool, error) {
	seen := map[string]bool{}
	last := map[string]int{}
	delivered, duplicates, reordered := 0, 0, 0
	line := func() string {
		return fmt.Sprintf("delivered=%d duplicates=%d reordered=%d", delivered, duplicates, reordered)
	}
	for delivered < Total {
		select {
		case msg := <-msgs:
			var ev event
			_ = json.Unmarshal(msg.Payload, &ev)
			if seen[msg.UUID] {
				duplicates++
			} else {
				seen[msg.UUID] = true
				delivered++
				if ev.Step != last[ev.Order]+1 {
					reordered++
				}
				last[ev.Order] = ev.Step
			}
			msg.Ack()
		case <-ctx.Done():
			return line(), false, nil
		}
	}
	// Wait for the relay's marks: nothing pending.
	for {
		b, err := r.sub.Backlog(ctx)
		if err != nil {
			return line(), false, err
		}
		if b.Pending == 0 {
			break
		}
		select {
		case <-ctx.Done():
			return line(), false, nil
		case <-time.After(20 * time.Millisecond):
		}
	}
	return line(), duplicates == 0 && reordered == 0, nil
}
