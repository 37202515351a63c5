// Package forwarder is the outbox relay: it reads committed events from an outbox Subscriber
// and publishes each to a Watermill publisher (Kafka, RabbitMQ, Redis Streams, HTTP, a Go
// function, or a per-topic router.Publisher), keeping the relay semantics of package outbox:
// an event the destination acknowledged is marked published; a failed one is nacked with its
// error recorded in last_error and retried with the outbox's backoff, then dead-lettered at
// MaxAttempts. Watermill's in-process retry loop is never used: retries are the outbox's job.
//
// The destination receives, per event, a message with the event id as UUID, the payload
// unchanged, and the event's headers plus the outbox-* metadata (outbox-event-id, outbox-topic,
// outbox-ordering-key, outbox-sequence, outbox-attempt), on the event's topic or on the topic
// that Config.Topic maps it to. Destinations that take batches (BatchPublisher) receive each
// claimed batch in one call; the others one message per call, ordered per ordering key by the
// subscriber.
//
// Running a relay:
//
//	sub, _ := outbox.NewSubscriber(pool, outbox.SubscriberConfig{}, logger)
//	pub, _ := kafka.NewPublisher(kafka.Config{Brokers: brokers}, logger) // forwarder/kafka
//	fwd, err := forwarder.New(sub, pub, forwarder.Config{}, logger)
//	if err != nil {
//		return err
//	}
//	go fwd.Run(ctx)
//	defer fwd.Close()
//
// Or, with your own Watermill router and middlewares (outbox.RecordError outermost):
//
//	router.AddMiddleware(outbox.RecordError, myMetrics)
//	router.AddConsumerHandler("relay", "*", sub, forwarder.Handler(pub, forwarder.Config{}))
//
// Importing this package pulls in no broker client: each destination lives in its own
// subpackage (forwarder/kafka, forwarder/amqp, forwarder/redisstream).
//
// Delivery is at least once: a relay that stops between publishing and marking publishes the
// event again later. Every message carries the event id so receivers drop repeats.
package forwarder
