package inbox

import (
	"context"
	"fmt"
	"time"

	"github.com/watermill-outbox/outbox"
)

// DefaultCleanupBatch is how many rows Cleanup deletes per statement.
const DefaultCleanupBatch = 1000

// Cleanup deletes inbox rows processed more than olderThan ago (database clock on PostgreSQL),
// of consumer only when consumer is not "", in statements of DefaultCleanupBatch rows so no
// lock is held long, and returns how many it deleted. A message redelivered after its row is
// gone is processed again: keep rows longer than any redelivery can come (the broker's
// retention, a relay's retries). db is any handle Migrate takes. Errors: an
// *outbox.ConfigError for a negative olderThan or an invalid config or handle, else the
// database error (with the count deleted so far).
func Cleanup(ctx context.Context, db any, cfg SchemaConfig, consumer string, olderThan time.Duration) (int64, error) {
	if olderThan < 0 {
		return 0, &outbox.ConfigError{Field: "olderThan", Reason: "must not be negative"}
	}
	s, ex, err := open(db, cfg)
	if err != nil {
		return 0, err
	}
	cutoff, arg := s.d.cutoff(olderThan)
	args := []any{arg}
	where := `"processed_at" < ` + cutoff
	if consumer != "" {
		args = append(args, consumer)
		where += ` AND "consumer" = $2`
	}
	q := fmt.Sprintf(`DELETE FROM %[1]s WHERE ("consumer", "message_id") IN (SELECT "consumer", "message_id" FROM %[1]s WHERE %[2]s ORDER BY "processed_at" LIMIT %[3]d)`,
		s.table, where, DefaultCleanupBatch)
	var total int64
	for {
		n, err := ex.exec(ctx, q, args...)
		total += n
		if err != nil {
			return total, fmt.Errorf("outbox inbox: cleanup %s: %w", s.table, err)
		}
		if n < DefaultCleanupBatch {
			return total, nil
		}
	}
}

// ConsumerStatus is what the inbox table holds for one consumer.
type ConsumerStatus struct {
	Consumer string
	// Messages counts the recorded (processed) messages.
	Messages int64
	// Oldest and Newest are the earliest and latest processed_at (UTC on SQLite).
	Oldest, Newest time.Time
}

// Status returns, per consumer sorted by name, how many messages the inbox table records and
// the range of their processing times. It reads the whole table (for status pages and the
// command line, not for frequent metrics: use Count). db is any handle Migrate takes. Errors:
// an *outbox.ConfigError for an invalid config or handle, else the database error.
func Status(ctx context.Context, db any, cfg SchemaConfig) ([]ConsumerStatus, error) {
	s, ex, err := open(db, cfg)
	if err != nil {
		return nil, err
	}
	rs, err := ex.query(ctx, fmt.Sprintf(`SELECT "consumer", count(*), min("processed_at"), max("processed_at") FROM %s GROUP BY "consumer" ORDER BY "consumer"`, s.table))
	if err != nil {
		return nil, fmt.Errorf("outbox inbox: status of %s: %w", s.table, err)
	}
	defer rs.Close()
	var out []ConsumerStatus
	for rs.Next() {
		var c ConsumerStatus
		if err := rs.Scan(&c.Consumer, &c.Messages, timeDest(s, &c.Oldest), timeDest(s, &c.Newest)); err != nil {
			return nil, fmt.Errorf("outbox inbox: status of %s: %w", s.table, err)
		}
		out = append(out, c)
	}
	if err := rs.Err(); err != nil {
		return nil, fmt.Errorf("outbox inbox: status of %s: %w", s.table, err)
	}
	return out, nil
}

// Count returns how many messages the inbox table records for consumer, or for every consumer
// when consumer is "". Errors as Status.
func Count(ctx context.Context, db any, cfg SchemaConfig, consumer string) (int64, error) {
	s, ex, err := open(db, cfg)
	if err != nil {
		return 0, err
	}
	q, args := fmt.Sprintf(`SELECT count(*) FROM %s`, s.table), []any{}
	if consumer != "" {
		q += ` WHERE "consumer" = $1`
		args = append(args, consumer)
	}
	rs, err := ex.query(ctx, q, args...)
	if err != nil {
		return 0, fmt.Errorf("outbox inbox: count %s: %w", s.table, err)
	}
	defer rs.Close()
	var n int64
	if rs.Next() {
		if err := rs.Scan(&n); err != nil {
			return 0, fmt.Errorf("outbox inbox: count %s: %w", s.table, err)
		}
	}
	if err := rs.Err(); err != nil {
		return 0, fmt.Errorf("outbox inbox: count %s: %w", s.table, err)
	}
	return n, nil
}

// open validates cfg and adapts db for the operations.
func open(db any, cfg SchemaConfig) (*schema, execer, error) {
	s, err := cfg.compile()
	if err != nil {
		return nil, nil, err
	}
	ex, err := newExecer(db, cfg.Dialect)
	if err != nil {
		return nil, nil, err
	}
	return s, ex, nil
}

// microTime scans a time column: a time.Time (PostgreSQL) or INTEGER microseconds since the
// Unix epoch (SQLite), into UTC.
type microTime time.Time

// Scan implements sql.Scanner.
func (m *microTime) Scan(src any) error {
	switch v := src.(type) {
	case nil:
		*m = microTime{}
	case int64:
		*m = microTime(time.UnixMicro(v).UTC())
	case time.Time:
		*m = microTime(v)
	default:
		return fmt.Errorf("outbox inbox: time column: unsupported type %T", src)
	}
	return nil
}

func timeDest(s *schema, t *time.Time) any { return s.d.timeDest(t) }
