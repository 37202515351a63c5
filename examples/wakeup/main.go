// Command wakeup shows a relay woken by PostgreSQL LISTEN/NOTIFY: the relay polls only once a
// minute, yet an event committed through wakeup.RunInTx is delivered within milliseconds.
//
//	OUTBOX_POSTGRES_DSN=postgres://postgres@127.0.0.1:5432/test go run ./examples/wakeup
//
// It ends with one line, "wakeup example: delivered <topic> <n>ms after COMMIT", or exits
// non-zero.
package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/wakeup"
	"github.com/watermill-outbox/outbox/wakeup/pgnotify"
)

func main() {
	dsn := os.Getenv("OUTBOX_POSTGRES_DSN")
	if dsn == "" {
		dsn = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := run(ctx, dsn); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context, dsn string) error {
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return err
	}
	defer pool.Close()
	schema := outbox.SchemaConfig{Table: "wakeup_example_outbox"}
	if err := outbox.Migrate(ctx, pool, schema); err != nil {
		return err
	}

	// One value for both sides. The listener needs a direct connection (not a
	// transaction-mode pooler): the pool's connection config is reused for it.
	w, err := pgnotify.New(ctx, pool.Config().ConnConfig, pgnotify.Config{Channel: "wakeup_example"}, nil)
	if err != nil {
		return err
	}
	defer w.Close()

	sub, err := outbox.NewSubscriber(pool, outbox.SubscriberConfig{
		Schema:       schema,
		PollInterval: time.Minute, // the safety net; the wakeup does the work
		Wakeup:       w,
	}, nil)
	if err != nil {
		return err
	}
	defer sub.Close()
	msgs, err := sub.Subscribe(ctx, "orders.*")
	if err != nil {
		return err
	}
	// Wait until the listener is subscribed (its channel receives one value then).
	lctx, stop := context.WithCancel(ctx)
	defer stop()
	select {
	case <-w.Listen(lctx, nil):
	case <-ctx.Done():
		return ctx.Err()
	}

	err = wakeup.RunInTx(ctx, pool, w, outbox.PublisherConfig{Schema: schema}, func(tx pgx.Tx, pub *outbox.Publisher) error {
		return pub.Publish("orders.created", outbox.NewMessage([]byte(`{"order":42}`)))
	})
	if err != nil {
		return err
	}
	committed := time.Now()

	select {
	case msg := <-msgs:
		msg.Ack()
		fmt.Printf("wakeup example: delivered %s %dms after COMMIT\n", msg.Metadata.Get(outbox.MetadataTopic), time.Since(committed).Milliseconds())
		return nil
	case <-ctx.Done():
		return fmt.Errorf("not delivered: %w", ctx.Err())
	}
}
