package dialect

import (
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
)

// Time scans a time column of any dialect: a time.Time as the driver decodes it (PostgreSQL,
// MySQL with parseTime: the instant, in the driver's location), INTEGER microseconds since the
// Unix epoch (SQLite, into UTC), or DATETIME text (MySQL without parseTime,
// "2006-01-02 15:04:05.999999", read as UTC). NULL leaves the zero time.
type Time time.Time

// ScanTimestamptz implements pgtype.TimestamptzScanner: pgx then decodes a timestamptz into it
// directly instead of through database/sql's conversion (an allocation per row).
// PostgreSQL's infinity and -infinity are an error, as they are for Scan.
func (m *Time) ScanTimestamptz(v pgtype.Timestamptz) error {
	*m = Time{}
	if !v.Valid {
		return nil
	}
	if v.InfinityModifier != pgtype.Finite {
		return fmt.Errorf("outbox: time column: %s is not a time", v.InfinityModifier)
	}
	*m = Time(v.Time)
	return nil
}

// Scan implements sql.Scanner.
func (m *Time) Scan(src any) error {
	switch v := src.(type) {
	case nil:
		*m = Time{}
	case int64:
		*m = Time(time.UnixMicro(v).UTC())
	case float64:
		*m = Time(time.UnixMicro(int64(v)).UTC())
	case time.Time:
		*m = Time(v)
	case []byte:
		return m.Scan(string(v))
	case string:
		if n, err := strconv.ParseInt(v, 10, 64); err == nil {
			*m = Time(time.UnixMicro(n).UTC())
			return nil
		}
		t, err := time.ParseInLocation("2006-01-02 15:04:05.999999", v, time.UTC)
		if err != nil {
			return fmt.Errorf("outbox: time column: %q is neither microseconds nor a DATETIME", v)
		}
		*m = Time(t)
	default:
		return fmt.Errorf("outbox: time column: unsupported type %T", src)
	}
	return nil
}

// ScanClaimed reads a claim's rows in the layout every dialect's claim returns: marker, sequence,
// id, topic, payload, headers, ordering_key, created_at, attempts, last_error, rank,
// delivery_starts, the extra columns, then the marker row's cursor, scanned and walked, then one
// column for each of trailer (pointers to nullable values, set from the marker row). The marker
// row (marker true) carries only those after the extra columns. capacity is how many events the
// claim is expected to return (ClaimParams.SizeHint): the events' slice is allocated for that
// many with the first one, and grows past it as needed.
func ScanClaimed(rs Rows, nExtra, capacity int, trailer ...any) (*ClaimResult, error) {
	defer rs.Close()
	res := &ClaimResult{Walked: -1}
	// One set of destinations for every row: pgtype's nullable values scan without an
	// allocation under pgx (a **int64 destination allocates for each non-NULL value) and are
	// sql.Scanners for database/sql drivers. A claim returns up to BatchSize rows; these
	// allocations were a fifth of a relay's CPU in a 200k drain.
	var (
		marker                                bool
		seq, rank, walked, scanned            pgtype.Int8
		id, topic, hdrs, key, lastErr, cursor pgtype.Text
		attempts, starts                      pgtype.Int4
		payload                               []byte
		created                               Time
	)
	extra := make([]any, nExtra)
	dest := make([]any, 0, 15+nExtra+len(trailer))
	dest = append(dest, &marker, &seq, &id, &topic, &payload, &hdrs, &key, &created, &attempts, &lastErr, &rank, &starts)
	for i := range extra {
		dest = append(dest, &extra[i])
	}
	dest = append(dest, &cursor, &scanned, &walked)
	dest = append(dest, trailer...)
	for rs.Next() {
		// Each event keeps its payload: pgx and database/sql scan a []byte into a new slice,
		// and a nil one leaves no buffer for any driver to reuse.
		payload = nil
		if err := rs.Scan(dest...); err != nil {
			return nil, fmt.Errorf("scan: %w", err)
		}
		if marker || !seq.Valid {
			if walked.Valid {
				res.Walked = walked.Int64
			}
			res.Cursor, res.Scanned = textPtr(cursor), int8Ptr(scanned)
			continue
		}
		c := Claimed{Sequence: seq.Int64, ID: id.String, Topic: topic.String, Payload: payload, Headers: hdrs.String,
			OrderingKey: textPtr(key), CreatedAt: time.Time(created), Attempts: int(attempts.Int32), LastError: textPtr(lastErr),
			Rank: -1, DeliveryStarts: int(starts.Int32)}
		if rank.Valid {
			c.Rank = rank.Int64
		}
		if nExtra > 0 {
			c.Extra = slices.Clone(extra)
		}
		if res.Events == nil {
			res.Events = make([]Claimed, 0, max(capacity, 1))
		}
		res.Events = append(res.Events, c)
	}
	if err := rs.Err(); err != nil {
		return nil, err
	}
	return res, nil
}

// textPtr returns t's string, or nil for NULL.
func textPtr(t pgtype.Text) *string {
	if !t.Valid {
		return nil
	}
	return &t.String
}

// int8Ptr returns n's value, or nil for NULL.
func int8Ptr(n pgtype.Int8) *int64 {
	if !n.Valid {
		return nil
	}
	return &n.Int64
}
