// Command mysql is a MariaDB/MySQL-only program: TestDialectDeps lists what it links.
package main

import (
	"context"
	"database/sql"

	"github.com/watermill-outbox/outbox"
	_ "github.com/watermill-outbox/outbox/mysql"
)

func main() {
	db, err := sql.Open("mysql", "root@tcp(localhost:3306)/app?parseTime=true")
	if err != nil {
		panic(err)
	}
	schema := outbox.SchemaConfig{Dialect: outbox.DialectMySQL}
	if err := outbox.Migrate(context.Background(), db, schema); err != nil {
		panic(err)
	}
	if _, err := outbox.NewSubscriber(db, outbox.SubscriberConfig{Schema: schema}, nil); err != nil {
		panic(err)
	}
}
