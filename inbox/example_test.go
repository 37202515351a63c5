package inbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/inbox"
)

// A message delivered twice is processed once: the second delivery finds its inbox row and
// is skipped. SQLite, so it runs without a server.
func Example() {
	dir, _ := os.MkdirTemp("", "inbox-example")
	defer os.RemoveAll(dir)
	db, _ := sql.Open("sqlite", outbox.SQLiteDSN(filepath.Join(dir, "app.db")))
	defer db.Close()
	ctx := context.Background()
	sqlite := outbox.SchemaConfig{Dialect: outbox.DialectSQLite}
	_ = outbox.Migrate(ctx, db, sqlite)
	_ = inbox.Migrate(ctx, db, inbox.SchemaConfig{Dialect: outbox.DialectSQLite})
	_, _ = db.Exec(`CREATE TABLE invoices (order_id TEXT PRIMARY KEY)`)

	in, err := inbox.New(inbox.FromSQL(db, nil), inbox.Config{
		Schema:       inbox.SchemaConfig{Dialect: outbox.DialectSQLite},
		Outbox:       outbox.PublisherConfig{Schema: sqlite},
		Consumer:     "billing",
		PublishTopic: "invoices.created",
	}, nil)
	if err != nil {
		panic(err)
	}
	handle := in.Handler(func(msg *message.Message, tx *sql.Tx) ([]*message.Message, error) {
		if _, err := tx.ExecContext(msg.Context(), `INSERT INTO invoices (order_id) VALUES ($1)`, string(msg.Payload)); err != nil {
			return nil, err
		}
		return []*message.Message{outbox.NewMessage([]byte(`{"invoice":"` + string(msg.Payload) + `"}`))}, nil
	})

	order := message.NewMessage(watermill.NewUUID(), []byte("order-1"))
	fmt.Println(handle(order), handle(order.Copy())) // the broker delivered it twice

	var invoices, events int
	_ = db.QueryRow(`SELECT count(*) FROM invoices`).Scan(&invoices)
	_ = db.QueryRow(`SELECT count(*) FROM watermill_outbox`).Scan(&events)
	fmt.Printf("invoices=%d events=%d %+v\n", invoices, events, in.Stats())
	// Output:
	// <nil> <nil>
	// invoices=1 events=1 {Processed:1 Duplicates:1 Retries:0 Failed:0}
}

// Middleware runs an ordinary Watermill handler in the inbox transaction; the handler finds
// the transaction in the message's context, and the messages it returns go to the outbox
// table in that transaction (the router publishes none).
func ExampleInbox_Middleware() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://app@127.0.0.1:5432/app")
	if err != nil {
		panic(err)
	}
	in, err := inbox.New(inbox.FromPgx(pool, pgx.TxOptions{}), inbox.Config{Consumer: "shipping", PublishTopic: "shipments.created"}, nil)
	if err != nil {
		panic(err)
	}
	handler := in.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		tx, _ := inbox.TxFromContext[pgx.Tx](msg.Context())
		if _, err := tx.Exec(msg.Context(), `INSERT INTO shipments (order_id) VALUES ($1)`, msg.UUID); err != nil {
			return nil, err
		}
		return []*message.Message{outbox.NewMessage(msg.Payload)}, nil
	})
	_ = handler // router.AddHandler("shipping", "orders.paid", sub, "", nil, handler) — or AddConsumerHandler
}
