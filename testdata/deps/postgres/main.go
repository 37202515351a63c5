// Command postgres is a PostgreSQL-only program: TestDialectDeps lists what it links.
package main

import (
	"context"
	"database/sql"

	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/watermill-outbox/outbox"
)

func main() {
	db, err := sql.Open("pgx", "postgres://localhost/app")
	if err != nil {
		panic(err)
	}
	if err := outbox.Migrate(context.Background(), db, outbox.SchemaConfig{}); err != nil {
		panic(err)
	}
	if _, err := outbox.NewSubscriber(db, outbox.SubscriberConfig{}, nil); err != nil {
		panic(err)
	}
}
