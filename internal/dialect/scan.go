package dialect

import (
	"fmt"
	"strconv"
	"time"
)

// Time scans a time column of any dialect into UTC: a time.Time (PostgreSQL, MySQL with
// parseTime), INTEGER microseconds since the Unix epoch (SQLite), or DATETIME text (MySQL
// without parseTime, "2006-01-02 15:04:05.999999", UTC). NULL leaves the zero time.
type Time time.Time

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
// row (marker true) carries only those after the extra columns.
func ScanClaimed(rs Rows, nExtra int, trailer ...any) (*ClaimResult, error) {
	defer rs.Close()
	res := &ClaimResult{Walked: -1}
	for rs.Next() {
		var (
			marker   bool
			seq      *int64
			id, hdrs *string
			topic    *string
			attempts *int
			rank     *int64
			starts   *int
			walked   *int64
			cursor   *string
			scanned  *int64
			c        Claimed
			extra    = make([]any, nExtra)
		)
		dest := []any{&marker, &seq, &id, &topic, &c.Payload, &hdrs, &c.OrderingKey, (*Time)(&c.CreatedAt), &attempts, &c.LastError, &rank, &starts}
		for i := range extra {
			dest = append(dest, &extra[i])
		}
		dest = append(dest, &cursor, &scanned, &walked)
		dest = append(dest, trailer...)
		if err := rs.Scan(dest...); err != nil {
			return nil, fmt.Errorf("scan: %w", err)
		}
		if marker || seq == nil {
			if walked != nil {
				res.Walked = *walked
			}
			res.Cursor, res.Scanned = cursor, scanned
			continue
		}
		c.Sequence, c.ID, c.Topic, c.Headers, c.Attempts, c.Rank = *seq, *id, *topic, *hdrs, *attempts, -1
		if rank != nil {
			c.Rank = *rank
		}
		if starts != nil {
			c.DeliveryStarts = *starts
		}
		if nExtra > 0 {
			c.Extra = extra
		}
		res.Events = append(res.Events, c)
	}
	if err := rs.Err(); err != nil {
		return nil, err
	}
	return res, nil
}
