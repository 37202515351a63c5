package outbox_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/watermill-outbox/outbox"
)

// TestMissingTable: on a table that was never migrated, Subscribe and SubscribeBatches fail at
// once with a *TableNotFoundError that says to run Migrate (they returned a channel, and every
// claim failed later), and a publish fails with one too, the database's own error kept in the
// chain (it said only `relation … does not exist`).
func TestMissingTable(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		cfg := outbox.SchemaConfig{Table: b.tableName(t, "never_migrated"), Dialect: b.dialect}
		sub := b.newSub(t, outbox.SubscriberConfig{Schema: cfg})
		check := func(what string, err error, cause bool) {
			t.Helper()
			var tnf *outbox.TableNotFoundError
			if !errors.Is(err, outbox.ErrTableNotFound) || !errors.As(err, &tnf) || !strings.Contains(err.Error(), "does not exist: create it with Migrate (or `outbox migrate`)") {
				t.Fatalf("%s: %v, want a *TableNotFoundError naming Migrate", what, err)
			}
			if !cause {
				return
			}
			var (
				pe *pgconn.PgError
				me *mysql.MySQLError
			)
			switch {
			case b.dialect == outbox.DialectPostgreSQL && errors.As(err, &pe) && pe.Code == "42P01":
			case b.dialect == outbox.DialectMySQL && errors.As(err, &me) && me.Number == 1146:
			case b.dialect == outbox.DialectSQLite && strings.Contains(errors.Unwrap(err).Error(), "no such table"):
			default:
				t.Fatalf("%s: the database's error is not in the chain: %#v", what, errors.Unwrap(err))
			}
		}
		ch, err := sub.Subscribe(ctx, "*")
		if ch != nil {
			t.Fatal("Subscribe returned a channel")
		}
		check("Subscribe", err, false)
		_, err = sub.SubscribeBatches(ctx, "*")
		check("SubscribeBatches", err, false)
		_, err = b.publisher(t, outbox.PublisherConfig{Schema: cfg}).Enqueue(ctx, outbox.EventInput{Topic: "t", Payload: map[string]int{"n": 1}})
		check("Enqueue", err, true)
		_, err = b.publisher(t, outbox.PublisherConfig{Schema: cfg}).Enqueue(ctx, outbox.EventInput{Topic: "t", OrderingKey: "k", Payload: map[string]int{"n": 1}})
		check("Enqueue with a key", err, true)
	})
}
