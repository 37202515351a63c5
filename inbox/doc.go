// Package inbox is the consumer side of the outbox: an idempotent consumer that runs
// consume → process → produce in one database transaction per message.
//
// For each message the Inbox begins a transaction, records (consumer, key) in the inbox table
// with INSERT … ON CONFLICT DO NOTHING, and then either skips the message (its key is recorded:
// a redelivery; nothing else is written, the message is acked and counted in Stats.Duplicates)
// or calls the handler with the transaction. The handler's own writes, the inbox row and the
// messages the handler returns — written to the outbox table through an outbox.Publisher in
// that same transaction — commit together or not at all; the router acks after the commit and
// nacks after a rollback. A message delivered twice at once: the second delivery's INSERT waits
// for the first transaction, then skips (it committed) or processes (it rolled back).
// Serialization failures and deadlocks (SQLSTATE 40001 / 40P01) rerun the transaction,
// handler included, with bounded backoff (Config.MaxRetries).
//
// The dedup key is msg.UUID unless Config.Key says otherwise (KeyFromMetadata, or package
// kafkakey for a Kafka record's position). Keys are per Config.Consumer, so several consumers
// of one message each process it once.
//
//	in, _ := inbox.New(inbox.FromPgx(pool, pgx.TxOptions{}), inbox.Config{Consumer: "billing", PublishTopic: "invoices"}, logger)
//	router.AddConsumerHandler("billing", "orders", sub, in.Handler(
//		func(msg *message.Message, tx pgx.Tx) ([]*message.Message, error) {
//			_, err := tx.Exec(msg.Context(), `INSERT INTO invoices (order_id) VALUES ($1)`, msg.UUID)
//			return []*message.Message{outbox.NewMessage(msg.Payload)}, err
//		}))
//
// Databases: PostgreSQL through pgx (FromPgx: a pool's BEGIN and inbox INSERT share one round
// trip) or database/sql with the pgx stdlib driver (FromSQL), and SQLite through database/sql
// (FromSQL with outbox.DialectSQLite in both schemas). The inbox table: Migrate or SchemaSQL;
// keep it small with Cleanup (a message redelivered after its row is gone is processed again),
// watch it with Count and Status, or use the command `outbox inbox migrate|status|cleanup`.
package inbox
