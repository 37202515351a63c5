package router_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"github.com/ThreeDotsLabs/watermill/message"
	_ "modernc.org/sqlite"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/forwarder"
	"github.com/watermill-outbox/outbox/router"
	_ "github.com/watermill-outbox/outbox/sqlite"
)

// One relay, several destinations: a router.Publisher picks a destination per topic (an exact
// route first, then the first matching pattern, then Default). Here the destinations are
// functions; in production they are a Kafka, RabbitMQ, Redis or webhook publisher each.
func ExampleNew() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "outbox-example")
	defer os.RemoveAll(dir)
	db, _ := sql.Open("sqlite", outbox.SQLiteDSN(filepath.Join(dir, "app.db")))
	defer db.Close()
	schema := outbox.SchemaConfig{Dialect: outbox.DialectSQLite}
	if err := outbox.Migrate(ctx, db, schema); err != nil {
		panic(err)
	}
	writer, _ := outbox.NewPublisher(db, outbox.PublisherConfig{Schema: schema}, nil)
	for _, topic := range []string{"orders.created", "orders.audit", "users.signed_up"} {
		if err := writer.Publish(topic, outbox.NewMessage([]byte(`{}`))); err != nil {
			panic(err)
		}
	}

	got := make(chan string, 3)
	to := func(name string) forwarder.Func {
		return func(ctx context.Context, msg *message.Message) error {
			topic, _ := forwarder.TopicFromContext(ctx)
			got <- topic + " -> " + name
			return nil
		}
	}
	dest, err := router.New(router.Config{
		Routes: []router.Route{
			{Topic: "orders.audit", Publisher: to("audit log")}, // exact routes win over patterns
			{Topic: "orders.*", Publisher: to("kafka")},
		},
		Default: to("webhook"),
	}, nil)
	if err != nil {
		panic(err)
	}
	sub, _ := outbox.NewSubscriber(db, outbox.SubscriberConfig{Schema: schema}, nil)
	fwd, err := forwarder.New(sub, dest, forwarder.Config{}, nil)
	if err != nil {
		panic(err)
	}
	go func() { _ = fwd.Run(ctx) }()
	lines := []string{<-got, <-got, <-got}
	_ = fwd.Close()
	sort.Strings(lines) // keys differ, so the three are delivered concurrently
	for _, l := range lines {
		fmt.Println(l)
	}
	// Output:
	// orders.audit -> audit log
	// orders.created -> kafka
	// users.signed_up -> webhook
}
