// Package outbox is a transactional outbox for Watermill on PostgreSQL, on SQLite (the
// embedded default of the outbox command: SchemaConfig.Dialect = DialectSQLite with a pure-Go
// database/sql driver, see SQLiteDSN) and on MariaDB/MySQL (DialectMySQL): an event written with
// Publisher commits or rolls back with the caller's transaction, and a relay (Subscriber, or
// package forwarder) delivers every committed event at least once, in sequence order per
// ordering key. PostgreSQL is built in; a program using SQLite or MariaDB/MySQL imports package
// github.com/watermill-outbox/outbox/sqlite or github.com/watermill-outbox/outbox/mysql for its
// side effect.
//
// Writing, inside the transaction that changes business rows:
//
//	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
//		if _, err := tx.Exec(ctx, `UPDATE orders SET state = 'paid' WHERE id = $1`, id); err != nil {
//			return err
//		}
//		pub, err := outbox.NewPublisher(tx, outbox.PublisherConfig{}, logger)
//		if err != nil {
//			return err
//		}
//		msg := outbox.NewMessage([]byte(`{"order":"` + id + `","state":"paid"}`))
//		outbox.SetOrderingKey(msg, id)             // per-order sequence
//		outbox.SetIdempotencyKey(msg, "paid-"+id) // a retried handler writes it once
//		return pub.Publish("orders.paid", msg)
//	})
//
// Relaying, in any number of processes sharing the table:
//
//	sub, _ := outbox.NewSubscriber(pool, outbox.SubscriberConfig{}, logger)
//	msgs, _ := sub.Subscribe(ctx, "orders.*") // Ack = published, Nack = retry with backoff
//
// The table is created by Migrate (or SchemaSQL for migration tools). Messages are emitted with
// the event id as UUID and the headers plus outbox-* metadata (MetadataEventID …); the full row
// is available through EventFromContext. Put RecordError on the router so handler errors are
// stored in last_error.
//
// Delivery is at least once: receivers drop repeats by event id.
package outbox
