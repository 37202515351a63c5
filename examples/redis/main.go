// Command redis runs the outbox end to end with Redis Streams: four writers commit 100
// transactions that each insert ten order rows and their ten events (ordering key = order id,
// 50 orders), a forwarder appends the events to a stream (one pipeline per batch, no client
// retries), and the stock watermill-redisstream subscriber reads them back in a consumer
// group. Redis comes from OUTBOX_EXAMPLE_REDIS_ADDR (default 127.0.0.1:6379), PostgreSQL from
// OUTBOX_EXAMPLE_POSTGRES_DSN.
//
//	go run ./examples/redis
//
// It prints one line, "delivered=1000 duplicates=0 reordered=0", and exits non-zero when the
// numbers differ or it does not finish within 25 seconds.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmredis "github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/forwarder"
	"github.com/watermill-outbox/outbox/forwarder/redisstream"
)

const (
	orders     = 50
	txs        = 100
	eventsPerT = 10
	total      = txs * eventsPerT
	writers    = 4
)

func main() {
	dsn := os.Getenv("OUTBOX_EXAMPLE_POSTGRES_DSN")
	if dsn == "" {
		dsn = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
	defer cancel()
	addr := os.Getenv("OUTBOX_EXAMPLE_REDIS_ADDR")
	if addr == "" {
		addr = "127.0.0.1:6379"
	}
	line, ok, err := run(ctx, dsn, addr)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(line)
	if !ok {
		os.Exit(1)
	}
}

// event is the payload of every event: the order and its step (1, 2, … per order).
type event struct {
	Order string `json:"order"`
	Step  int    `json:"step"`
}

func run(ctx context.Context, dsn, addr string) (string, bool, error) {
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return "", false, err
	}
	defer pool.Close()
	suffix := fmt.Sprintf("%d", os.Getpid())
	schema := outbox.SchemaConfig{Table: "example_redis_outbox_" + suffix}
	business := "example_redis_orders_" + suffix
	topic := "outbox-example-orders-" + suffix // the stream
	defer func() {
		_, _ = pool.Exec(context.Background(), fmt.Sprintf(`DROP TABLE IF EXISTS %q; DROP TABLE IF EXISTS %q`, schema.Table, business))
	}()
	if err := outbox.Migrate(ctx, pool, schema); err != nil {
		return "", false, err
	}
	if _, err := pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE %q (order_id text, step int, state text, PRIMARY KEY (order_id, step))`, business)); err != nil {
		return "", false, err
	}

	// A client to delete the stream at the end (the subscriber's Close closes its own client;
	// the relay builds its own, without retries).
	admin := redis.NewClient(&redis.Options{Addr: addr})
	defer admin.Close()
	defer admin.Del(context.Background(), topic)

	// The relay: outbox subscriber → forwarder → Kafka publisher.
	sub, err := outbox.NewSubscriber(pool, outbox.SubscriberConfig{Schema: schema, PollInterval: 50 * time.Millisecond, BatchSize: 500}, nil)
	if err != nil {
		return "", false, err
	}
	pub, err := redisstream.NewPublisher(redisstream.Config{Options: &redis.Options{Addr: addr}}, nil)
	if err != nil {
		return "", false, err
	}
	defer pub.Close()
	fwd, err := forwarder.New(sub, pub, forwarder.Config{}, nil)
	if err != nil {
		return "", false, err
	}
	go func() {
		if err := fwd.Run(ctx); err != nil {
			log.Print(err)
		}
	}()
	defer fwd.Close()

	// The writers: business rows and events in one transaction; writer w owns the orders
	// w, w+4, … so each order's steps commit in step order.
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var own []string
			for o := w; o < orders; o += writers {
				own = append(own, fmt.Sprintf("order-%02d", o))
			}
			step := map[string]int{}
			for n := 0; n*writers+w < txs; n++ {
				order := own[n%len(own)]
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					p, err := outbox.NewPublisher(tx, outbox.PublisherConfig{Schema: schema}, nil)
					if err != nil {
						return err
					}
					var batch []*message.Message
					for range eventsPerT {
						step[order]++
						if _, err := tx.Exec(ctx, fmt.Sprintf(`INSERT INTO %q VALUES ($1, $2, 'placed')`, business), order, step[order]); err != nil {
							return err
						}
						body, _ := json.Marshal(event{Order: order, Step: step[order]})
						msg := outbox.NewMessage(body)
						outbox.SetOrderingKey(msg, order)
						msg.Metadata.Set("source", "examples/redis")
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
	if err := <-errs; err != nil {
		return "", false, err
	}

	// The consumer: watermill-redisstream's own subscriber in a consumer group reading the
	// stream from its start, with its default unmarshaller.
	rsub, err := wmredis.NewSubscriber(wmredis.SubscriberConfig{
		Client: redis.NewClient(&redis.Options{Addr: addr}), ConsumerGroup: "example", OldestId: "0", DisableIndefiniteInitialBlock: true,
	}, watermill.NopLogger{})
	if err != nil {
		return "", false, err
	}
	defer rsub.Close()
	msgs, err := rsub.Subscribe(ctx, topic)
	if err != nil {
		return "", false, err
	}
	seen := map[string]bool{}
	last := map[string]int{}
	delivered, duplicates, reordered := 0, 0, 0
	for delivered < total {
		select {
		case msg := <-msgs:
			var ev event
			_ = json.Unmarshal(msg.Payload, &ev)
			switch {
			case seen[msg.UUID]:
				duplicates++
			default:
				seen[msg.UUID] = true
				delivered++
				if ev.Step != last[ev.Order]+1 {
					reordered++
				}
				last[ev.Order] = ev.Step
			}
			msg.Ack()
		case <-ctx.Done():
			return result(delivered, duplicates, reordered), false, nil
		}
	}
	// Wait for the relay's marks: nothing pending.
	for {
		b, err := sub.Backlog(ctx)
		if err != nil {
			return result(delivered, duplicates, reordered), false, err
		}
		if b.Pending == 0 {
			break
		}
		select {
		case <-ctx.Done():
			return result(delivered, duplicates, reordered), false, nil
		case <-time.After(20 * time.Millisecond):
		}
	}
	return result(delivered, duplicates, reordered), delivered == total && duplicates == 0 && reordered == 0, nil
}

func result(delivered, duplicates, reordered int) string {
	return fmt.Sprintf("delivered=%d duplicates=%d reordered=%d", delivered, duplicates, reordered)
}
