// Package wal is the WAL path of change capture: a Source reads the committed changes of the
// captured tables from a PostgreSQL logical replication slot (pgoutput, through
// github.com/jackc/pglogrepl), turns each row change into the same envelope the capture
// triggers write (capture.Decode reads both), and publishes it to a Watermill
// message.Publisher (a forwarder, Kafka, …) in commit order per ordering key. The writers'
// transactions write nothing more than their rows: a bulk UPDATE costs what it costs without
// capture, plus the old row images REPLICA IDENTITY FULL logs (see docs/design/wal.md in the
// repository for the measurements).
//
//	_ = outbox.Migrate(ctx, pool, outbox.SchemaConfig{}) // where failed changes are parked
//	cfg := wal.Config{Tables: []capture.Table{{Name: "public.loan"}}, Destination: kafkaPublisher}
//	_ = wal.Setup(ctx, pool, cfg)        // publication, REPLICA IDENTITY FULL, slot (idempotent)
//	src, _ := wal.New(pool, cfg)
//	_ = prometheus.Register(wal.NewCollector(src))
//	err := src.Run(ctx)                  // until ctx ends, or a *SlotError
//
// # Envelope
//
// As the triggers' (package capture, "Envelope" and "JSON form of values"), for the types the
// source knows: integers, floats, numeric, bool, text types, uuid, inet/cidr/macaddr, enums,
// domains of these, date, time, timetz, timestamp, timestamptz, bytea, json, jsonb. A carried
// or key column of another type (arrays, ranges, interval, …) is refused when its table's
// first change arrives, with a *capture.UnsupportedTypeError: leave it out with Exclude.
// Differences: "occurred_at" is the commit time (the trigger writes the transaction's start);
// the event id is a UUIDv7 of the commit time whose other bits hash the commit's LSN and the
// change's position in its transaction, so a change delivered again after a restart carries
// the same id (an inbox drops it). Table options that need the writer's transaction (Extend,
// OrderingKeySQL, LockOrderingKey) are refused; TRUNCATE writes a "truncated" event with
// TruncateCapture and nothing otherwise (the log cannot refuse it). Partitions are published
// as their partitioned table (publish_via_partition_root), and writes in sessions with
// session_replication_role = replica are in the log like any other.
//
// # Delivery, order, parking
//
// Changes are delivered in batches of up to BatchSize, the changes of one ordering key in
// commit order, up to Concurrency keys at once (a forwarder.BatchPublisher gets the whole batch
// in one PublishBatch call first). A Publish that fails is retried with backoff
// (RetryBackoff doubling up to MaxBackoff) up to MaxAttempts; then the change is parked: written
// as a row of the outbox table (Config.Schema) with its id, topic, payload and ordering key,
// so the outbox relay (outbox.Subscriber) retries and dead-letters it like any event. Every
// later change of that key is parked behind it, without trying the destination, while the
// outbox table holds an unpublished row of the key (published_at IS NULL, dead letters
// included), so the stream moves on and the key's order holds. Run a relay on the outbox table
// to the same destination. The slot's position is confirmed (standby status updates every
// StatusInterval) only up to the end of the last batch whose changes are all delivered or
// parked.
//
// # Restarts
//
// Run reconnects after a lost connection or a server restart (from the slot's confirmed
// position) and a new process resumes from it: changes delivered but not yet confirmed are
// delivered again — duplicates after a crash, with the same ids; nothing confirmed was
// undelivered, so nothing is lost. A server restart can rewind the slot to the position its
// last checkpoint saved (more duplicates, no loss).
//
// # Slot safety
//
// A slot keeps WAL on the server's disk until it is confirmed. While the captured tables are
// idle and others are written, the source confirms the log's end from keepalives and from a
// heartbeat it writes every Heartbeat (pg_logical_emit_message, not transactional). Stats and
// the Prometheus Collector export the lag in bytes (pg_current_wal_lsn() - confirmed_flush_lsn)
// and seconds (age of the oldest pending change) and the retained WAL (pg_current_wal_lsn() -
// restart_lsn). MaxRetainedWAL bounds the retained WAL while a source runs: above it the
// source logs an error, sets outbox_wal_over_bound, and parks every change (the stuck one
// included) without trying the destination, so the slot follows the log at the speed of local
// inserts; it tries the destination again below three quarters of the bound. While no source
// runs only the server can bound it: set max_slot_wal_keep_size, which invalidates the slot
// rather than fill the disk.
//
// # Recovery
//
// A slot that is missing (dropped; or a standby promoted after a failover: before PostgreSQL
// 17's failover slots a standby has no copy of the primary's logical slots) or invalidated
// (wal_status "lost") makes Run return a *SlotError (errors.Is ErrSlotLost). The changes
// committed between the slot's last confirmed position and a new slot's creation are in no
// slot: the WAL path cannot replay them. Parked changes are safe (they are outbox rows).
// Recovery of a business-table capture is therefore a re-snapshot: create a new slot (Setup;
// changes committed after it are streamed), then emit the current state of the rows that may
// have changed since the last delivered change — with Table.EmitUnchanged set, an UPDATE … SET
// id = id of those rows (by an updated_at column after the last delivered occurred_at, or all
// rows for consumers that upsert). What cannot be recovered: the intermediate versions of a
// row changed several times in the gap, and rows deleted in the gap (no row is left to
// re-emit). Consumers that must see every change should use the trigger path, whose events are
// rows of the outbox table and so survive a failover to a synchronous standby.
//
// # Outbox-table mode
//
// OutboxRelay reads the outbox table's own inserts (a publication of that table, inserts only,
// made by SetupOutbox) instead of polling, and delivers them as the Subscriber and forwarder
// would (same id, payload, headers and outbox metadata). The table stays the source of truth:
// the stream leases each batch's rows as a relay's claim does, delivers a key's rows only from
// its oldest unpublished row on, marks what it delivered published, and confirms the slot only
// past rows so recorded. What it leaves (rows older than the slot, an event that failed
// MaxAttempts times with its key's later rows, rows behind another relay's) stays pending: the
// polling relay (outbox.Subscriber through a forwarder) delivers it in short sweep windows,
// opened when such a row is older than SweepAge. On a lost slot (*SlotError) OutboxRelay logs
// one Error line, counts it (outbox_wal_fallbacks_total) and runs the polling relay at its own
// settings, losing nothing, until a usable slot exists again.
//
// # Permissions
//
// wal_level = logical, which needs a server restart (Amazon RDS and Aurora: the parameter
// rds.logical_replication = 1; Cloud SQL: the flag cloudsql.logical_decoding = on). The role
// needs the REPLICATION attribute (Amazon RDS: GRANT rds_replication TO role instead; Cloud
// SQL: ALTER USER … WITH REPLICATION), ownership of the captured tables (REPLICA IDENTITY,
// CREATE PUBLICATION … FOR TABLE; or a superuser), the CREATE privilege on the database for
// the publication, and INSERT and SELECT on the outbox table. SetupSQL prints the statements
// for a migration tool.
package wal
