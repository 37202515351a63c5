// Package wakeup makes outbox relays poll right after events commit instead of waiting for
// their next poll. Polling stays the safety net: a lost signal only delays delivery
// until the relay's next PollInterval.
//
// On PostgreSQL a Subscriber needs none of these to claim within milliseconds of a commit by
// any writer: by default it probes the table's sequence (SubscriberConfig.WakeProbeInterval).
// A wakeup adds topic-aware signals (a relay wakes only for the topics it serves) and serves
// SQLite (sqlitewal) and MariaDB/MySQL relays.
//
// One value serves both sides. The writer side signals the topics a transaction wrote, after
// COMMIT (RunInTx, RunInSQLTx or a Collector do that, since Go's database drivers have no
// after-commit hook); the relay side is an outbox.Wakeup given to SubscriberConfig.Wakeup, so
// each subscription polls on "signal or PollInterval, whichever comes first", and only for
// signals of topics it serves.
//
//	w := wakeup.NewInProcess() // or pgnotify.New, redispubsub.New, amqpfanout.New, kafkasignal.New
//	defer w.Close()
//	sub, _ := outbox.NewSubscriber(pool, outbox.SubscriberConfig{Wakeup: w}, logger)
//	err := wakeup.RunInTx(ctx, pool, w, outbox.PublisherConfig{}, func(tx pgx.Tx, pub *outbox.Publisher) error {
//		if _, err := tx.Exec(ctx, "UPDATE accounts SET …"); err != nil {
//			return err
//		}
//		return pub.Publish("accounts.updated", outbox.NewMessage(payload))
//	}) // COMMIT, then one signal for "accounts.updated"; nothing after a rollback
//
// Implementations: NewInProcess (this package: relays in the same process), and, in their own
// packages so that importing wakeup pulls no broker client, pgnotify (PostgreSQL
// LISTEN/NOTIFY), redispubsub (Redis pub/sub), amqpfanout (RabbitMQ fanout exchange) and
// kafkasignal (a Kafka signal topic). The building blocks Hub, Coalescer and RunListener are
// exported for custom transports.
//
// Guarantees common to every implementation:
//   - signals of one transaction are coalesced (one per topic) and sent after COMMIT, none
//     after a rollback or an error;
//   - the writer never blocks on the transport: Signal hands topics to one shared Coalescer
//     per value, which sends at most one batch per Window;
//   - every Listen channel receives one value as soon as its listener is subscribed, and again
//     after every reconnect, so a subscription polls for what was committed while it was not
//     listening;
//   - a listener that drops reconnects with exponential, capped backoff; each failure from the
//     fifth in a row on is logged at ERROR, and relays keep polling meanwhile.
package wakeup
