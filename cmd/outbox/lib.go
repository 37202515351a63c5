package main

// The root package's API the commands use, in one place.

import (
	"context"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/internal/dialect/dburl"
)

// errTableNotFound is matched by checkTable's error when the outbox table does not exist.
var errTableNotFound = outbox.ErrTableNotFound

type (
	deadFilter   = outbox.DeadLetterFilter
	deadLetter   = outbox.DeadLetter
	topicBacklog = outbox.TopicBacklog
)

// schemaFor is the outbox schema of table in u's database.
func schemaFor(u dburl.URL, table string) outbox.SchemaConfig {
	return outbox.SchemaConfig{Table: table, Dialect: u.Dialect()}
}

// sqliteDSN is the DSN of the SQLite file at path, with the settings the outbox needs.
func sqliteDSN(path string) string { return outbox.SQLiteDSN(path) }

// checkTable returns an error wrapping errTableNotFound when d's outbox table does not exist.
func checkTable(ctx context.Context, d *database) error {
	return outbox.CheckTable(ctx, d.Handle(), d.schema)
}

// backlogByTopic returns the backlog of every topic with pending or dead-lettered events.
func backlogByTopic(ctx context.Context, _ *database, sub *outbox.Subscriber) ([]topicBacklog, error) {
	return sub.BacklogByTopic(ctx)
}

// listDead returns up to limit selected dead letters, oldest first.
func listDead(ctx context.Context, _ *database, sub *outbox.Subscriber, f deadFilter, limit int) ([]deadLetter, error) {
	return sub.ListDeadLettered(ctx, f, min(limit, outbox.MaxBatchSize))
}

// purgeDead deletes the selected dead letters.
func purgeDead(ctx context.Context, _ *database, sub *outbox.Subscriber, f deadFilter) (int64, error) {
	return sub.PurgeDeadLettered(ctx, f)
}

// countDead counts the selected dead letters (what purgeDead would delete).
func countDead(ctx context.Context, _ *database, sub *outbox.Subscriber, f deadFilter) (int64, error) {
	return sub.CountDeadLettered(ctx, f)
}

// retryDead gives the selected dead letters fresh attempts.
func retryDead(ctx context.Context, _ *database, sub *outbox.Subscriber, f deadFilter) (int64, error) {
	return sub.RetryDeadLettered(ctx, f)
}
