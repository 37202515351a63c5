package outbox_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "modernc.org/sqlite"

	"github.com/watermill-outbox/outbox"
)

// postgresDSN is the PostgreSQL of the examples: OUTBOX_TEST_POSTGRES_DSN, or the local
// test database.
func postgresDSN() string {
	if dsn := os.Getenv("OUTBOX_TEST_POSTGRES_DSN"); dsn != "" {
		return dsn
	}
	return "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
}

// uniqueName returns prefix plus a random suffix, so that examples running beside other
// programs on one database never share a table.
func uniqueName(prefix string) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return prefix + "_" + hex.EncodeToString(b)
}

// openSQLite opens a new SQLite file in a temporary directory; the returned func closes the
// database and removes the directory.
func openSQLite() (*sql.DB, func()) {
	dir, err := os.MkdirTemp("", "outbox-example")
	if err != nil {
		panic(err)
	}
	db, err := sql.Open("sqlite", outbox.SQLiteDSN(filepath.Join(dir, "app.db")))
	if err != nil {
		panic(err)
	}
	return db, func() { _ = db.Close(); _ = os.RemoveAll(dir) }
}

// waitDrained waits until the subscriber's table has no pending event, for at most 10 s.
func waitDrained(ctx context.Context, backlog func(context.Context) (outbox.Backlog, error)) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, err := backlog(ctx)
		if err == nil && b.Pending == 0 {
			return
		}
		if time.Now().After(deadline) {
			panic(fmt.Sprintf("not drained: %+v, %v", b, err))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Publish an event in the pgx transaction that writes the business row: both commit together,
// or neither does.
func ExampleNewPublisher() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, postgresDSN())
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	schema := outbox.SchemaConfig{Table: uniqueName("example_outbox")}
	if err := outbox.Migrate(ctx, pool, schema); err != nil {
		panic(err)
	}
	defer pool.Exec(ctx, `DROP TABLE `+schema.Table)
	orders := uniqueName("example_orders")
	if _, err := pool.Exec(ctx, `CREATE TABLE `+orders+` (id TEXT PRIMARY KEY, total NUMERIC NOT NULL)`); err != nil {
		panic(err)
	}
	defer pool.Exec(ctx, `DROP TABLE `+orders)

	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO `+orders+` (id, total) VALUES ('order-1', 42.50)`); err != nil {
			return err
		}
		pub, err := outbox.NewPublisher(tx, outbox.PublisherConfig{Schema: schema}, nil)
		if err != nil {
			return err
		}
		msg := outbox.NewMessage([]byte(`{"id":"order-1","total":42.50}`))
		outbox.SetOrderingKey(msg, "order-1")
		return pub.Publish("orders.created", msg)
	})
	if err != nil {
		panic(err) // the order and its event both rolled back
	}

	var topic, key, payload string
	err = pool.QueryRow(ctx, `SELECT topic, ordering_key, payload::text FROM `+schema.Table).Scan(&topic, &key, &payload)
	fmt.Println(topic, key, payload, err)
	// Output:
	// orders.created order-1 {"id":"order-1","total":42.50} <nil>
}

// Publish through database/sql: the Publisher takes the *sql.Tx. A rolled-back transaction
// leaves no event. SQLite, so it runs without a server; PostgreSQL (pgx stdlib) and
// MariaDB/MySQL take the same calls with their SchemaConfig.Dialect.
func ExampleNewPublisher_sqlTx() {
	db, done := openSQLite()
	defer done()
	ctx := context.Background()
	schema := outbox.SchemaConfig{Dialect: outbox.DialectSQLite}
	if err := outbox.Migrate(ctx, db, schema); err != nil {
		panic(err)
	}

	publish := func(topic string, commit bool) {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			panic(err)
		}
		pub, err := outbox.NewPublisher(tx, outbox.PublisherConfig{Schema: schema}, nil)
		if err != nil {
			panic(err)
		}
		if err := pub.Publish(topic, outbox.NewMessage([]byte(`{"id":1}`))); err != nil {
			panic(err)
		}
		if commit {
			err = tx.Commit()
		} else {
			err = tx.Rollback()
		}
		if err != nil {
			panic(err)
		}
	}
	publish("orders.created", true)
	publish("orders.cancelled", false)

	rows, err := db.QueryContext(ctx, `SELECT topic FROM watermill_outbox`)
	if err != nil {
		panic(err)
	}
	defer rows.Close()
	for rows.Next() {
		var topic string
		_ = rows.Scan(&topic)
		fmt.Println(topic)
	}
	// Output:
	// orders.created
}

// The outbox Subscriber is an ordinary Watermill subscriber: run it in a Router, Ack marks the
// event published, Nack (a handler error) retries it with backoff. Events of one ordering key
// arrive one after another in commit order.
func ExampleNewSubscriber() {
	db, done := openSQLite()
	defer done()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	schema := outbox.SchemaConfig{Dialect: outbox.DialectSQLite}
	if err := outbox.Migrate(ctx, db, schema); err != nil {
		panic(err)
	}
	pub, err := outbox.NewPublisher(db, outbox.PublisherConfig{Schema: schema}, nil) // each Publish commits alone
	if err != nil {
		panic(err)
	}
	for _, step := range []string{"created", "paid", "shipped"} {
		msg := outbox.NewMessage([]byte(`{"step":"` + step + `"}`))
		outbox.SetOrderingKey(msg, "order-1")
		if err := pub.Publish("orders."+step, msg); err != nil {
			panic(err)
		}
	}

	sub, err := outbox.NewSubscriber(db, outbox.SubscriberConfig{Schema: schema, PollInterval: 50 * time.Millisecond}, nil)
	if err != nil {
		panic(err)
	}
	router, err := message.NewRouter(message.RouterConfig{}, nil)
	if err != nil {
		panic(err)
	}
	router.AddMiddleware(outbox.RecordError) // a handler's error lands in last_error
	router.AddConsumerHandler("print", "orders.*", sub, func(msg *message.Message) error {
		fmt.Println(msg.Metadata.Get(outbox.MetadataTopic), string(msg.Payload))
		return nil
	})
	go func() { _ = router.Run(ctx) }()
	<-router.Running()
	waitDrained(ctx, sub.Backlog)
	_ = router.Close()
	// Output:
	// orders.created {"step":"created"}
	// orders.paid {"step":"paid"}
	// orders.shipped {"step":"shipped"}
}

// One MultiSubscriber relays several outbox tables (a table or schema per tenant) and tags
// each message with its table.
func ExampleNewMultiSubscriber() {
	db, done := openSQLite()
	defer done()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	tables := []string{"tenant_a_outbox", "tenant_b_outbox"}
	for _, table := range tables {
		schema := outbox.SchemaConfig{Dialect: outbox.DialectSQLite, Table: table}
		if err := outbox.Migrate(ctx, db, schema); err != nil {
			panic(err)
		}
		pub, err := outbox.NewPublisher(db, outbox.PublisherConfig{Schema: schema}, nil)
		if err != nil {
			panic(err)
		}
		if err := pub.Publish("invoices.created", outbox.NewMessage([]byte(`{"tenant":"`+table+`"}`))); err != nil {
			panic(err)
		}
	}

	m, err := outbox.NewMultiSubscriber(db, outbox.MultiSubscriberConfig{
		Tables:     tables,
		Subscriber: outbox.SubscriberConfig{Schema: outbox.SchemaConfig{Dialect: outbox.DialectSQLite}, PollInterval: 50 * time.Millisecond},
	}, nil)
	if err != nil {
		panic(err)
	}
	defer m.Close()
	msgs, err := m.Subscribe(ctx, "*")
	if err != nil {
		panic(err)
	}
	var seen []string
	for range tables {
		msg := <-msgs
		seen = append(seen, msg.Metadata.Get(outbox.MetadataTable)+" "+string(msg.Payload))
		msg.Ack() // marks it published in its own table
	}
	waitDrained(ctx, m.Backlog)
	sort.Strings(seen)
	for _, s := range seen {
		fmt.Println(s)
	}
	// Output:
	// tenant_a_outbox {"tenant":"tenant_a_outbox"}
	// tenant_b_outbox {"tenant":"tenant_b_outbox"}
}
