package dialect

import (
	"strings"
	"time"
)

// ScanReplayCount scans CountReplay's one row: the count and the highest sequence (NULL: 0).
func ScanReplayCount(rs Rows) (n, maxSeq int64, err error) {
	defer rs.Close()
	var m *int64
	if rs.Next() {
		if err := rs.Scan(&n, &m); err != nil {
			return 0, 0, err
		}
	}
	if m != nil {
		maxSeq = *m
	}
	return n, maxSeq, rs.Err()
}

// ScanReplayMarks scans ScanReplay's rows: published_at (any dialect's time column, see Time)
// and sequence.
func ScanReplayMarks(rs Rows, capacity int) ([]ReplayMark, error) {
	defer rs.Close()
	out := make([]ReplayMark, 0, capacity)
	for rs.Next() {
		var (
			at  Time
			seq int64
		)
		if err := rs.Scan(&at, &seq); err != nil {
			return nil, err
		}
		out = append(out, ReplayMark{PublishedAt: time.Time(at), Sequence: seq})
	}
	return out, rs.Err()
}

// ScanReplayRows scans ReadReplay's rows: sequence, id, topic, payload, headers, ordering_key
// and the extra columns' JSON object (NULL without extra columns).
func ScanReplayRows(rs Rows, capacity int) ([]ReplayRow, error) {
	defer rs.Close()
	out := make([]ReplayRow, 0, capacity)
	for rs.Next() {
		var r ReplayRow
		if err := rs.Scan(&r.Sequence, &r.ID, &r.Topic, &r.Payload, &r.Headers, &r.OrderingKey, &r.Extra); err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rs.Err()
}

// ReplayStart is ScanReplay's lower bound on published_at: the cursor's, or f.Since for a zero
// cursor.
func ReplayStart(f ReplayFilter, after ReplayMark) time.Time {
	if after.Sequence == 0 {
		return f.Since
	}
	return after.PublishedAt
}

// SingleQuote returns s as an SQL string literal.
func SingleQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
