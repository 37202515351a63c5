// Command sqlite is a SQLite-only program: TestDialectDeps lists what it links.
package main

import (
	"context"
	"database/sql"

	_ "modernc.org/sqlite"

	"github.com/watermill-outbox/outbox"
	_ "github.com/watermill-outbox/outbox/sqlite"
)

func main() {
	db, err := sql.Open("sqlite", outbox.SQLiteDSN("app.db"))
	if err != nil {
		panic(err)
	}
	schema := outbox.SchemaConfig{Dialect: outbox.DialectSQLite}
	if err := outbox.Migrate(context.Background(), db, schema); err != nil {
		panic(err)
	}
	if _, err := outbox.NewSubscriber(db, outbox.SubscriberConfig{Schema: schema}, nil); err != nil {
		panic(err)
	}
}
