package redisstream_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/redis/go-redis/v9"
	_ "modernc.org/sqlite"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/forwarder"
	"github.com/watermill-outbox/outbox/forwarder/redisstream"
	_ "github.com/watermill-outbox/outbox/sqlite"
)

// Relay the outbox to Redis Streams: each event is appended to the stream named after its
// topic (Config.Stream sends everything to one stream), with the fields payload, metadata,
// topic and, for ordered events, ordering_key. Redis at 127.0.0.1:6379 (or OUTBOX_TEST_REDIS_ADDR).
func ExampleNewPublisher() {
	ctx := context.Background()
	addr := os.Getenv("OUTBOX_TEST_REDIS_ADDR")
	if addr == "" {
		addr = "127.0.0.1:6379"
	}
	stream := fmt.Sprintf("orders.created.example-%d", time.Now().UnixNano()) // a topic of its own
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	defer rdb.Del(ctx, stream)

	dir, _ := os.MkdirTemp("", "outbox-example")
	defer os.RemoveAll(dir)
	db, _ := sql.Open("sqlite", outbox.SQLiteDSN(filepath.Join(dir, "app.db")))
	defer db.Close()
	schema := outbox.SchemaConfig{Dialect: outbox.DialectSQLite}
	if err := outbox.Migrate(ctx, db, schema); err != nil {
		panic(err)
	}
	writer, _ := outbox.NewPublisher(db, outbox.PublisherConfig{Schema: schema}, nil)
	msg := outbox.NewMessage([]byte(`{"id":"order-1","total":42.50}`))
	outbox.SetOrderingKey(msg, "order-1")
	if err := writer.Publish(stream, msg); err != nil {
		panic(err)
	}

	pub, err := redisstream.NewPublisher(redisstream.Config{Options: &redis.Options{Addr: addr}}, nil)
	if err != nil {
		panic(err)
	}
	defer pub.Close()
	sub, _ := outbox.NewSubscriber(db, outbox.SubscriberConfig{Schema: schema}, nil)
	fwd, err := forwarder.New(sub, pub, forwarder.Config{}, nil)
	if err != nil {
		panic(err)
	}
	go func() { _ = fwd.Run(ctx) }()
	defer fwd.Close()

	// Read the stream back (a consumer would use XREADGROUP, or watermill-redisstream).
	res, err := rdb.XRead(ctx, &redis.XReadArgs{Streams: []string{stream, "0"}, Count: 1, Block: 5 * time.Second}).Result()
	if err != nil {
		panic(err)
	}
	entry := res[0].Messages[0].Values
	fmt.Println(entry["payload"], entry["ordering_key"], entry["topic"] == stream)
	// Output:
	// {"id":"order-1","total":42.50} order-1 true
}
