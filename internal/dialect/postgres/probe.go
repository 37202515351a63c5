package postgres

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/watermill-outbox/outbox/internal/dialect"
)

var _ dialect.WakeProber = Dialect{}

// ProbeTarget implements dialect.WakeProber: the OID of the identity sequence behind
// "sequence" and its cache size.
func (Dialect) ProbeTarget(ctx context.Context, ex dialect.Executor, t *dialect.Table) (int64, int64, error) {
	rs, err := ex.Query(ctx, `SELECT s.seqrelid::bigint, s.seqcache FROM pg_sequence s WHERE s.seqrelid = pg_get_serial_sequence($1, 'sequence')::regclass`,
		dialect.DoubleQuote(t.Parts...))
	if err != nil {
		return 0, 0, err
	}
	defer rs.Close()
	if !rs.Next() {
		if err := rs.Err(); err != nil {
			return 0, 0, err
		}
		return 0, 0, fmt.Errorf("no sequence behind %s.\"sequence\"", dialect.DoubleQuote(t.Parts...))
	}
	var oid, cache int64
	if err := rs.Scan(&oid, &cache); err != nil {
		return 0, 0, err
	}
	return oid, cache, rs.Err()
}

// probeSQL reads the sequence's last value (pg_sequence_last_value reads the sequence's one
// tuple; NULL before the first nextval); only when the value differs from $2, or $3 is true, it
// also reads pg_current_snapshot() and lists the transaction ids of every backend
// (pg_stat_get_activity, shared memory; a CASE evaluates its branch only when taken). The
// snapshot's xmax is the latest completed transaction plus one, so a transaction in progress
// above every completed one is in no snapshot's list: only the backends' list names it.
const probeSQL = `SELECT p.c,
	CASE WHEN p.c <> $2 OR $3 THEN pg_current_snapshot()::text END,
	CASE WHEN p.c <> $2 OR $3 THEN array_to_string(ARRAY(SELECT a.backend_xid::text FROM pg_stat_get_activity(NULL) a WHERE a.backend_xid IS NOT NULL), ',') END
FROM (SELECT coalesce(pg_sequence_last_value($1::oid::regclass), 0) AS c) p`

// Probe implements dialect.WakeProber.
func (Dialect) Probe(ctx context.Context, ex dialect.Executor, target, last int64, full bool) (dialect.ProbeState, error) {
	rs, err := ex.Query(ctx, probeSQL, target, last, full)
	if err != nil {
		return dialect.ProbeState{}, err
	}
	defer rs.Close()
	if !rs.Next() {
		if err := rs.Err(); err != nil {
			return dialect.ProbeState{}, err
		}
		return dialect.ProbeState{}, fmt.Errorf("probe returned no row")
	}
	var (
		st        dialect.ProbeState
		snap, run *string // text, so that database/sql scans them as pgx does
	)
	if err := rs.Scan(&st.Counter, &snap, &run); err != nil {
		return st, err
	}
	if err := rs.Err(); err != nil {
		return st, err
	}
	if run != nil {
		if st.Running, err = parseXids(*run); err != nil {
			return st, err
		}
	}
	if snap != nil {
		st.Xmax, st.InProgress, err = parseSnapshot(*snap)
	}
	return st, err
}

// parseSnapshot reads pg_snapshot's text form "xmin:xmax:xip,xip,…" (the list may be empty):
// it returns the low 32 bits of xmax and of the list's ids, the list sorted.
func parseSnapshot(s string) (uint32, []uint32, error) {
	parts := strings.SplitN(s, ":", 3)
	if len(parts) != 3 {
		return 0, nil, fmt.Errorf("unexpected snapshot %q", s)
	}
	xmax, err := strconv.ParseUint(parts[1], 10, 64)
	if err != nil {
		return 0, nil, fmt.Errorf("unexpected snapshot %q: %w", s, err)
	}
	if parts[2] == "" {
		return uint32(xmax), nil, nil
	}
	xip, err := parseXids(parts[2])
	if err != nil {
		return 0, nil, fmt.Errorf("unexpected snapshot %q: %w", s, err)
	}
	slices.Sort(xip)
	return uint32(xmax), xip, nil
}

// parseXids reads a comma-separated list of transaction ids (empty: none), keeping their low
// 32 bits.
func parseXids(s string) ([]uint32, error) {
	out := []uint32{}
	if s == "" {
		return out, nil
	}
	for x := range strings.SplitSeq(s, ",") {
		v, err := strconv.ParseUint(x, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("unexpected transaction id %q: %w", x, err)
		}
		out = append(out, uint32(v))
	}
	return out, nil
}

// Announce implements dialect.WakeProber: nextval of the sequence (a gap, as a rolled-back
// insert leaves).
func (Dialect) Announce(ctx context.Context, ex dialect.Executor, t *dialect.Table) error {
	_, err := ex.Exec(ctx, `SELECT nextval(pg_get_serial_sequence($1, 'sequence'))`, dialect.DoubleQuote(t.Parts...))
	return err
}
