package dialect

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
)

// TestTimeScanTimestamptz: pgx decodes a timestamptz straight into Time; NULL is the zero time
// and PostgreSQL's ±infinity is an error, as through Scan.
func TestTimeScanTimestamptz(t *testing.T) {
	at := time.Date(2026, 12, 3, 10, 0, 0, 123456000, time.UTC)
	var m Time
	if err := m.ScanTimestamptz(pgtype.Timestamptz{Time: at, Valid: true}); err != nil || !time.Time(m).Equal(at) {
		t.Fatalf("finite: %v, %v; want %v", time.Time(m), err, at)
	}
	if err := m.ScanTimestamptz(pgtype.Timestamptz{}); err != nil || !time.Time(m).IsZero() {
		t.Fatalf("NULL: %v, %v; want the zero time", time.Time(m), err)
	}
	for _, inf := range []pgtype.InfinityModifier{pgtype.Infinity, pgtype.NegativeInfinity} {
		if err := m.ScanTimestamptz(pgtype.Timestamptz{Valid: true, InfinityModifier: inf}); err == nil {
			t.Fatalf("%s: no error", inf)
		}
	}
}
