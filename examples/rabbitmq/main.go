// Command rabbitmq runs the outbox end to end with RabbitMQ: four writers commit 100
// transactions that each insert ten order rows and their ten events (ordering key = order id,
// 50 orders), a forwarder relays the events to a durable queue through the default exchange
// (persistent messages, publisher confirms, mandatory routing), and the stock watermill-amqp
// subscriber reads them back. RabbitMQ comes from OUTBOX_EXAMPLE_AMQP_URL (default
// amqp://guest:guest@127.0.0.1:5672/), PostgreSQL from OUTBOX_EXAMPLE_POSTGRES_DSN.
//
//	go run ./examples/rabbitmq
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
	wmamqp "github.com/ThreeDotsLabs/watermill-amqp/v2/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/forwarder"
	"github.com/watermill-outbox/outbox/forwarder/amqp"
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
	url := os.Getenv("OUTBOX_EXAMPLE_AMQP_URL")
	if url == "" {
		url = "amqp://guest:guest@127.0.0.1:5672/"
	}
	line, ok, err := run(ctx, dsn, url)
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

func run(ctx context.Context, dsn, url string) (string, bool, error) {
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return "", false, err
	}
	defer pool.Close()
	suffix := fmt.Sprintf("%d", os.Getpid())
	schema := outbox.SchemaConfig{Table: "example_rabbitmq_outbox_" + suffix}
	business := "example_rabbitmq_orders_" + suffix
	topic := "outbox-example-orders-" + suffix // the queue; the routing key on the default exchange
	defer func() {
		_, _ = pool.Exec(context.Background(), fmt.Sprintf(`DROP TABLE IF EXISTS %q; DROP TABLE IF EXISTS %q`, schema.Table, business))
	}()
	if err := outbox.Migrate(ctx, pool, schema); err != nil {
		return "", false, err
	}
	if _, err := pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE %q (order_id text, step int, state text, PRIMARY KEY (order_id, step))`, business)); err != nil {
		return "", false, err
	}

	// The consumer first: the stock subscriber declares the durable queue named after the
	// topic, so the relay's mandatory messages have somewhere to go.
	defer deleteQueue(url, topic) // after the subscriber closed
	asub, err := wmamqp.NewSubscriber(wmamqp.NewDurableQueueConfig(url), watermill.NopLogger{})
	if err != nil {
		return "", false, err
	}
	defer asub.Close()
	msgs, err := asub.Subscribe(ctx, topic)
	if err != nil {
		return "", false, err
	}

	// The relay: outbox subscriber → forwarder → Kafka publisher.
	sub, err := outbox.NewSubscriber(pool, outbox.SubscriberConfig{Schema: schema, PollInterval: 50 * time.Millisecond, BatchSize: 500}, nil)
	if err != nil {
		return "", false, err
	}
	pub, err := amqp.NewPublisher(amqp.Config{URL: url}, nil)
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
						msg.Metadata.Set("source", "examples/rabbitmq")
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

	// Read back what the subscriber (started above) receives.
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

func deleteQueue(url, queue string) {
	conn, err := amqp091.Dial(url)
	if err != nil {
		return
	}
	defer conn.Close()
	if ch, err := conn.Channel(); err == nil {
		_, _ = ch.QueueDelete(queue, false, false, false)
	}
}

func result(delivered, duplicates, reordered int) string {
	return fmt.Sprintf("delivered=%d duplicates=%d reordered=%d", delivered, duplicates, reordered)
}
