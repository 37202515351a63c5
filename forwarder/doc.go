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
//
// # Failure classes
//
// A destination says what kind of failure it met (outbox.ErrUnavailable, outbox.ErrPermanent),
// and the outbox Subscriber acts on it: unavailable — the destination cannot be
// reached or refuses service as a whole — counts no attempt and pauses the destination;
// permanent — this event can never be delivered as it is — dead-letters the event at once;
// anything else is retried with backoff up to MaxAttempts. The destinations of this module map
// their clients' errors (each package doc lists its mapping): forwarder/kafka,
// forwarder/amqp, forwarder/redisstream, forwarder/asynq, webhook; router names each
// unavailable error after its route. A Func or your own publisher says it by returning outbox.Unavailable(err),
// outbox.Permanent(err) or an *outbox.UnavailableError.
//
// Each destination checks before sending what its transport can carry (pre-flight), so one
// event that cannot go out fails alone, as permanent, instead of failing its neighbours; a
// batch destination then holds back that event's ordering key's later events of the batch
// (ErrHeldBack), and the same when an event fails while the batch is being sent, where the
// transport allows it (see each package for what it can and cannot take back).
//
// # Metadata codec
//
// An event's headers are a map of string to string; Publish refuses names and values that are
// not valid UTF-8 or hold NUL, CR or LF (no transport below carries those faithfully: HTTP
// cannot, PostgreSQL text cannot hold NUL), and the name _watermill_message_uuid. The relay
// adds outbox-event-id, outbox-topic, outbox-ordering-key, outbox-sequence and outbox-attempt.
// Per transport, what an event becomes and what is refused before sending (as permanent):
//
//   - Kafka (forwarder/kafka, watermill-kafka's DefaultMarshaler): each header a record header
//     (name and value as bytes), plus _watermill_message_uuid = event id; the ordering key is
//     the record key, the payload the value. Refused: a record above Producer.MaxMessageBytes
//     or the topic's max.message.bytes (headers count).
//   - RabbitMQ (forwarder/amqp, watermill-amqp's DefaultMarshaler): each header an AMQP
//     field-table entry of type long string, plus _watermill_message_uuid; message-id = event
//     id; the payload is the body. Refused: a header name over 255 bytes (AMQP short string), a
//     value of a type the field table cannot hold (custom marshalers), a content header frame
//     (all properties and headers) over the connection's negotiated frame size (RabbitMQ's
//     frame_max, 128 KiB by default), a body over Config.MaxMessageBytes.
//   - Redis Streams (forwarder/redisstream, watermill-redisstream's marshaller): one entry with
//     fields _watermill_message_uuid, payload, metadata (all headers as one msgpack map),
//     topic and, for ordered events, ordering_key. Refused: an entry over
//     Config.MaxEntryBytes (default 512 MiB, Redis's proto-max-bulk-len).
//   - asynq (forwarder/asynq): the headers are the task's headers, the payload its payload,
//     the event id its task id.
//   - HTTP (webhook): each header a request header, its name canonicalized (net/http's
//     CanonicalHeaderKey; HTTP/2 lowercases it — read headers case-insensitively), plus
//     Outbox-Event-Id and Outbox-Topic; hop-by-hop and framing names are skipped. Refused: a
//     name that is not an RFC 9110 token (a space, a colon …), a value with another control
//     character than tab.
//
// There is no escaping: what a transport cannot carry as it is does not go out altered.
package forwarder
