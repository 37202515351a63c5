package main

// TEMPORARY: stand-ins for root-package API that is landing (SchemaConfig.Dialect, SQLiteDSN,
// CheckTable, DeadLetterFilter, ListDeadLettered, PurgeDeadLettered, BacklogByTopic). PostgreSQL
// only, by plain SQL. Replaced by direct calls once the root package has them.

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/watermill-outbox/outbox"
)

// errTableNotFound is matched by checkTable's error when the outbox table does not exist.
var errTableNotFound = errors.New("outbox table not found")

// deadFilter selects dead letters: a topic matching any of Topics or an id in IDs, and
// dead-lettered more than OlderThan ago.
type deadFilter struct {
	Topics    []string
	IDs       []uuid.UUID
	OlderThan time.Duration
}

// deadLetter is one dead-lettered event.
type deadLetter struct {
	outbox.Event
	DeadLetteredAt time.Time
}

// topicBacklog is the backlog of one topic.
type topicBacklog struct {
	Topic string
	outbox.Backlog
}

func schemaFor(kind dbKind, table string) outbox.SchemaConfig {
	return outbox.SchemaConfig{Table: table}
}

func sqliteDSN(path string) string {
	q := url.Values{}
	q.Add("_pragma", "busy_timeout(10000)")
	q.Add("_pragma", "journal_mode(WAL)")
	q.Set("_txlock", "immediate")
	return "file:" + path + "?" + q.Encode()
}

var errSQLiteNotYet = errors.New("SQLite is not supported by this build yet: use a postgres:// URL")

func checkTable(ctx context.Context, d *database) error {
	if d.pool == nil {
		return errSQLiteNotYet
	}
	var ok bool
	if err := d.pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, quoteIdent(d.tableName())).Scan(&ok); err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("%w: %s", errTableNotFound, d.tableName())
	}
	return nil
}

func backlogByTopic(ctx context.Context, d *database, _ *outbox.Subscriber) ([]topicBacklog, error) {
	if d.pool == nil {
		return nil, errSQLiteNotYet
	}
	rows, err := d.pool.Query(ctx, fmt.Sprintf(`SELECT topic,
		count(*) FILTER (WHERE dead_lettered_at IS NULL),
		COALESCE(EXTRACT(EPOCH FROM now() - min(created_at) FILTER (WHERE dead_lettered_at IS NULL)), 0)::float8,
		count(*) FILTER (WHERE dead_lettered_at IS NOT NULL)
		FROM %s WHERE published_at IS NULL GROUP BY topic ORDER BY topic`, quoteIdent(d.tableName())))
	if err != nil {
		return nil, err
	}
	var out []topicBacklog
	for rows.Next() {
		var tb topicBacklog
		var age float64
		if err := rows.Scan(&tb.Topic, &tb.Pending, &age, &tb.DeadLettered); err != nil {
			return nil, err
		}
		tb.OldestPendingAge = time.Duration(age * float64(time.Second))
		out = append(out, tb)
	}
	return out, rows.Err()
}

func listDead(ctx context.Context, d *database, _ *outbox.Subscriber, f deadFilter, limit int) ([]deadLetter, error) {
	if d.pool == nil {
		return nil, errSQLiteNotYet
	}
	if len(f.Topics) == 0 && len(f.IDs) == 0 {
		return nil, outbox.ErrEmptyFilter
	}
	var pats []outbox.TopicPattern
	for _, t := range f.Topics {
		p, err := outbox.ParseTopicPattern(t)
		if err != nil {
			return nil, err
		}
		pats = append(pats, p)
	}
	ids := map[uuid.UUID]bool{}
	for _, id := range f.IDs {
		ids[id] = true
	}
	rows, err := d.pool.Query(ctx, fmt.Sprintf(`SELECT sequence, id, topic, COALESCE(ordering_key, ''), attempts, COALESCE(last_error, ''), created_at, dead_lettered_at
		FROM %s WHERE dead_lettered_at IS NOT NULL AND dead_lettered_at <= now() - $1::interval ORDER BY sequence`, quoteIdent(d.tableName())), f.OlderThan)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []deadLetter
	for rows.Next() {
		var dl deadLetter
		if err := rows.Scan(&dl.Sequence, &dl.ID, &dl.Topic, &dl.OrderingKey, &dl.Attempts, &dl.LastError, &dl.CreatedAt, &dl.DeadLetteredAt); err != nil {
			return nil, err
		}
		sel := ids[dl.ID]
		for _, p := range pats {
			sel = sel || p.Match(dl.Topic)
		}
		if sel && (limit <= 0 || len(out) < limit) {
			out = append(out, dl)
		}
	}
	return out, rows.Err()
}

func purgeDead(ctx context.Context, d *database, sub *outbox.Subscriber, f deadFilter) (int64, error) {
	dls, err := listDead(ctx, d, sub, f, 0)
	if err != nil {
		return 0, err
	}
	var ids []uuid.UUID
	for _, dl := range dls {
		ids = append(ids, dl.ID)
	}
	tag, err := d.pool.Exec(ctx, fmt.Sprintf(`DELETE FROM %s WHERE id = ANY($1) AND dead_lettered_at IS NOT NULL`, quoteIdent(d.tableName())), ids)
	return tag.RowsAffected(), err
}

func retryDead(ctx context.Context, d *database, sub *outbox.Subscriber, f deadFilter) (int64, error) {
	if f.OlderThan == 0 {
		return sub.RetryDeadLettered(ctx, outbox.RetryFilter{Topics: f.Topics, IDs: f.IDs})
	}
	dls, err := listDead(ctx, d, sub, f, 0)
	if err != nil || len(dls) == 0 {
		return 0, err
	}
	var ids []uuid.UUID
	for _, dl := range dls {
		ids = append(ids, dl.ID)
	}
	return sub.RetryDeadLettered(ctx, outbox.RetryFilter{IDs: ids})
}

var _ = pgx.ErrNoRows
