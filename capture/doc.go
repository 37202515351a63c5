// Package capture writes an outbox event for every row change of declared tables, from
// database triggers generated at install time: every INSERT, UPDATE and DELETE — raw SQL,
// COPY, migrations and the database's own cascades included — writes its event in the same
// transaction, and the events flow through the same relay, ordering, retries and dead letters
// as published ones (a captured row is an ordinary outbox row: a UUIDv7 id, a topic, a JSON
// envelope as payload, headers, an ordering key).
//
//	_ = outbox.Migrate(ctx, pool, schema)
//	err := capture.Install(ctx, pool, schema, capture.Table{Name: "public.loan", Exclude: []string{"token"}})
//	// … any write to public.loan now writes an event; downstream:
//	change, err := capture.Decode(msg) // change.Operation, change.PK, change.After …
//
// # Envelope
//
// The payload of a captured event is one JSON object:
//
//		{"table": "public.loan", "operation": "updated", "pk": 7, "changed": ["status"],
//		 "before": {…}, "after": {…}, "occurred_at": "2026-12-01T19:04:27.123456+00:00"}
//
//	  - table: the schema-qualified table ("main.loan" on SQLite).
//	  - operation: "inserted", "updated", "deleted" (or "truncated", see Table.Truncate).
//	  - pk: the key column's value (JSON form below), or an object of the key columns for a
//	    composite key; null without a key.
//	  - changed: for an UPDATE, the carried columns whose value differs (IS DISTINCT FROM; json
//	    compared as text); for INSERT and DELETE, all carried columns. An UPDATE that changes
//	    none of them writes no event unless Table.EmitUnchanged.
//	  - before/after: by Table.Payload. PayloadAfter (default): "after" on insert and update,
//	    "before" on delete. PayloadBeforeAndAfter: both, "before" null on insert and "after"
//	    null on delete. PayloadKeys: neither. A primary-key change is captured under the new key
//	    (pk, ordering key) with the old key columns in "before" (PayloadAfter and PayloadKeys).
//	  - occurred_at: the writing transaction's start (PostgreSQL now()) or the statement's
//	    time (SQLite, millisecond clock), ISO 8601 in UTC with six fractional digits.
//	  - Extension keys (Table.Extend.Payload, Extension.Payload) are further top-level keys.
//
// Topic: Table.Topic, a template of {schema}, {table}, {operation} (default
// "{table}.{operation}", lower case). Ordering key: Table.OrderingKey, a template of
// {schema}, {table}, {pk} (key columns as text joined by ':'; default "{table}:{pk}"), or
// Table.OrderingKeySQL, or none (Table.Unordered).
//
// # JSON form of values
//
// The same on PostgreSQL and SQLite where the type exists:
//
//   - integers, booleans, float/double: JSON numbers and booleans; NaN, Infinity and
//     -Infinity as the strings "NaN", "Infinity", "-Infinity" (SQLite stores NaN as NULL).
//   - numeric/decimal: its exact text as a string ("12.50"; "NaN"). SQLite has no exact
//     decimal (NUMERIC affinity stores 12.50 as 12.5), so a NUMERIC/DECIMAL column there has no
//     rule.
//   - text, varchar, char, citext, uuid, inet, cidr, macaddr, enum: strings.
//   - timestamptz: ISO 8601 in UTC, six fractional digits ("2024-01-02T01:04:05.123456+00:00");
//     timestamp, date, time, timetz: ISO 8601 as PostgreSQL's to_jsonb writes them
//     ("2024-01-02T03:04:05", "2024-01-02", "03:04:05"). SQLite DATE/TIME/DATETIME/TIMESTAMP
//     columns: text as stored (store ISO 8601), Unix seconds as "…T…+00:00".
//   - interval: seconds, a JSON number (86402.5).
//   - bytea / BLOB: standard base64 with padding, one line. (SQLite has no base64 function:
//     this package registers SQLiteBase64 with modernc.org/sqlite.)
//   - json, jsonb, SQLite JSON: the value itself.
//   - arrays: lists of their elements' forms (a multi-dimensional array of a type whose rule
//     is not to_jsonb's is flattened).
//   - ranges: {"lower", "upper", "lower_inc", "upper_inc", "is_empty"} with bounds in their
//     elements' forms (null when unbounded or empty).
//   - domains: their base type's rule.
//   - NULL: null.
//
// A carried column (or key column) of any other type is refused at install with an
// *UnsupportedTypeError naming it, never stringified silently: leave it out with Exclude.
//
// # Triggers
//
// PostgreSQL: one PL/pgSQL function per table and one statement-level AFTER trigger per
// captured operation with transition tables, so a statement writes all its events with one
// INSERT … SELECT. Measured on one 10,000-row UPDATE (2 cores shared with other load; the same
// UPDATE without capture took 0.28–0.31 s): row-level trigger 5.6 s, statement-level 2.7 s,
// statement-level with the row image from one to_jsonb(row) call and the events streamed into
// the INSERT 1.5–1.9 s — most of which is the outbox INSERT itself (10,000 rows with their
// index entries: 1.0–1.1 s alone). A TRUNCATE statement trigger follows Table.Truncate. SQLite: three row triggers per table. The code is generated from the
// catalog when Install runs (column types are known; no catalog lookup per row): re-run
// Install after ALTER TABLE — a column added later is not carried until then, and a dropped
// column makes the trigger (so the write) fail loudly.
//
// # Partitions, replica sessions, Verify (PostgreSQL)
//
// A statement runs the statement triggers of the table it names only. So Install puts the
// capture triggers on a partitioned table and on each of its partitions (sub-partitions
// included): a write naming a partition (INSERT, COPY, UPDATE, DELETE) writes the same events
// as one through the partitioned table — its "table", topic and ordering key. Partitions
// created (CREATE TABLE … PARTITION OF) or attached (ALTER TABLE … ATTACH PARTITION) later get
// them from the event trigger PartitionsEventTrigger, which Install creates once per database
// and which only a superuser may create (Install by another role is refused with
// ErrEventTrigger until a superuser has run it once); a detached partition loses them and is
// no longer captured. TRUNCATE of a partition is refused like the table's (TruncateRefuse);
// with TruncateCapture each truncated partition writes one "truncated" event with the key
// "partition" ("schema.partition"). A partition cannot be declared itself (ErrPartition),
// nor a table with table inheritance (INHERITS) parents or children (ErrInheritance).
//
// The triggers are enabled ALWAYS (ALTER TABLE … ENABLE ALWAYS TRIGGER): sessions with
// session_replication_role = replica skip ordinary triggers, and those are pg_restore
// --disable-triggers, logical replication apply, pgcopydb and bulk loaders, whose writes
// would otherwise change rows without events. Table.SkipReplicaSessions opts out, for
// replica sessions that must not write events (a logical-replication subscriber whose
// publisher already captured the change).
//
// Verify reports every captured table or partition whose triggers are missing, disabled, or
// not enabled ALWAYS as installed, as a *VerifyError listing them; Install ends by running it.
// Run it after migrations and restores (or "outbox capture verify"): a trigger dropped or
// disabled by hand is otherwise a silent hole.
//
// SQLite: REPLACE (INSERT OR REPLACE, UPDATE OR REPLACE, ON CONFLICT REPLACE) deletes the
// conflicting rows without running delete triggers unless the writing connection sets PRAGMA
// recursive_triggers = ON: set it on every connection that may replace rows of a captured
// table, or those deletions write no event.
//
// # Ordering
//
// A captured event is written inside the writing statement's transaction while it holds the
// changed rows' locks, so the events of one row get sequences in commit order, and the
// relay's per-key order delivers them in that order. With an ordering key that is not the
// default "{table}:{pk}" (or with Table.LockOrderingKey), the trigger also takes the
// Publisher's per-key transaction lock before it writes — pg_advisory_xact_lock of
// hashtextextended(key, seed) where seed is the signed 64-bit FNV-1a hash of the quoted
// outbox table name (the seed the root package's Publisher and Migrate use), keys locked in
// hash order in the INSERT's own statement — so captured and published events of one key
// stay in commit order together. The default key takes no lock (a statement changing 100,000
// rows would need 100,000 slots of the shared lock table): an explicit Publish on a row's
// default key is ordered with the row's captured events only when its transaction also
// locks the row (SELECT … FOR UPDATE) or the table sets LockOrderingKey. SQLite has one
// writer at a time: commit order is sequence order without locks.
//
// # Extensions
//
// Table.Extend adds SQL expressions evaluated in the trigger (payload keys, headers, the
// outbox's extra columns). SetExtension (PostgreSQL, transaction-scoped through
// set_config(…, true)) and WithExtension (both dialects, scoped to a function inside the
// transaction) attach Go values — the author of a change, a request id — to every event
// captured in that scope.
package capture
