package mysql

import (
	"context"
	"math"
	"sort"
	"strings"

	"github.com/watermill-outbox/outbox/internal/dialect"
)

// scan runs the key skip scan: MIN(sequence) GROUP BY outbox_key over outbox_key > p.Cursor,
// ORDER BY outbox_key LIMIT KeyScan, and returns the keys (neither walked nor continued) whose
// head is claimable and in the topic filter; it sets res.Cursor and res.Scanned. MariaDB runs
// the scan either as a loose index scan ("Using index for group-by": one dive per key) or,
// when its statistics say keys have few events, as a range over those keys' events. MariaDB
// does not use a loose index scan on a generated column, nor a range for a correlated
// outbox_key > k (a recursive CTE of MIN() subqueries read the whole index once per key: 130 ms
// per claim at 10,000 events), which is why outbox_key is a plain column kept by Insert's
// DEFAULT and the ack, and checked by a CHECK constraint.
func (r *relay) scan(ctx context.Context, q querier, p *dialect.ClaimParams, args map[string]any, walkedMin map[string]int64, cont map[string]bool, res *dialect.ClaimResult) ([]candidate, error) {
	rs, err := r.query(ctx, q, "scan", args, map[string]any{"cursor": p.Cursor, "key_scan": max(r.cfg.KeyScan, 1)})
	if err != nil {
		return nil, err
	}
	var (
		out  []candidate
		n    int64
		last string
	)
	err = scanEach(rs, func(rs dialect.Rows) error {
		var (
			k    string
			head int64
			ok   bool
		)
		if err := rs.Scan(&k, &head, &ok); err != nil {
			return err
		}
		n++
		if k > last {
			last = k
		}
		if _, walked := walkedMin[k]; ok && !walked && !cont[k] {
			out = append(out, candidate{key: k, kind: candScanned, from: head})
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	res.Scanned = &n
	if n > 0 {
		res.Cursor = &last
	}
	return out, nil
}

// member is one event of a candidate key's run: rank 1 is the key's head.
type member struct {
	key  string
	seq  int64
	rank int64
}

// runsChunk caps the keys of one runs statement (one UNION ALL branch each).
const runsChunk = 500

// runs reads up to run unpublished events of each candidate key (in order), limit events in
// all, with one UNION ALL branch per key: a range of the key index (outbox_key = k AND sequence
// >= from ORDER BY sequence LIMIT run, or > After for a continuation). A walked key's branch
// holds its head check, that the key's first entry in the key index is the walked event; a
// continuation's branch holds the check of the PostgreSQL claim's cont fragment: the key's
// first unpublished event from the previous run's first sequence on is either after that run
// (its marks landed) or still leased under ContToken with a third of LeaseDuration left (so
// the events before the new run are this relay's own, delivered and acked). Both checks are
// uncorrelated scalar subqueries, evaluated once per branch with one index read; a key that
// fails its check returns no rows.
//
// Candidates are read in chunks sized to what the claim still needs at the runs seen so far
// (the first assumes full runs), each branch capped at what is still needed: one statement
// over 500 keys returned up to 500 runs (25,000 rows over 1,000 keys of 50 events) of which
// a claim kept 1,000.
func (r *relay) runs(ctx context.Context, q querier, p *dialect.ClaimParams, cands []candidate, run, limit int) ([]member, error) {
	var members []member
	margin := (r.cfg.LeaseDuration / 3).Microseconds()
	prev := 0
	for start := 0; start < len(cands) && len(members) < limit; {
		need := limit - len(members)
		n := (need+run-1)/run + 1
		if start > 0 {
			if len(members) == 0 {
				n = 2 * prev
			} else {
				per := float64(len(members)) / float64(start)
				n = int(math.Ceil(float64(need)/per*1.25)) + 1
			}
		}
		n = min(max(n, 1), runsChunk, len(cands)-start)
		lim := min(run, need)
		var (
			args  []any
			parts []string
		)
		for i, c := range cands[start : start+n] {
			name, named := "run_scanned", map[string]any{"i": start + i, "key": c.key, "from": c.from, "run": lim}
			switch c.kind {
			case candWalked:
				name = "run_walked"
			case candCont:
				name = "run_cont"
				named["after"], named["cont_token"], named["margin_us"], named["cont_from"] = c.cont.After, p.ContToken, margin, c.cont.From
			}
			parts = append(parts, r.st[name].SQL)
			args = append(args, r.st[name].Args(named)...)
		}
		rs, err := q.query(ctx, strings.Join(parts, "\nUNION ALL\n"), args...)
		if err != nil {
			return nil, err
		}
		type row struct {
			i   int
			seq int64
		}
		var rows []row
		err = scanEach(rs, func(rs dialect.Rows) error {
			var x row
			if err := rs.Scan(&x.i, &x.seq); err != nil {
				return err
			}
			rows = append(rows, x)
			return nil
		})
		if err != nil {
			return nil, err
		}
		// In candidate order, each key's events in sequence order (a UNION ALL's row order
		// is not guaranteed, and sorting here spares the server a temporary table).
		sort.Slice(rows, func(a, b int) bool {
			if rows[a].i != rows[b].i {
				return rows[a].i < rows[b].i
			}
			return rows[a].seq < rows[b].seq
		})
		prevI, rank := -1, int64(0)
		for _, x := range rows {
			if x.i != prevI {
				prevI, rank = x.i, 0
			}
			rank++
			if len(members) < limit {
				members = append(members, member{key: cands[x.i].key, seq: x.seq, rank: rank})
			}
		}
		start += n
		prev = n
	}
	return members, nil
}

// scanClaimed runs claim.sql's locking SELECT name (the claim's parameters args and extra
// ones) and adds its rows to into by sequence.
func (r *relay) scanClaimed(ctx context.Context, q querier, name string, args, extra map[string]any, into map[int64]dialect.Claimed) error {
	rs, err := r.query(ctx, q, name, args, extra)
	if err != nil {
		return err
	}
	return scanEach(rs, func(rs dialect.Rows) error {
		var (
			ev   dialect.Claimed
			hdrs []byte
		)
		extra := make([]any, len(r.t.Extra))
		dest := []any{&ev.Sequence, &ev.ID, &ev.Topic, &ev.Payload, &hdrs, &ev.OrderingKey, (*dbTime)(&ev.CreatedAt), &ev.Attempts, &ev.LastError, &ev.DeliveryStarts}
		for i := range extra {
			dest = append(dest, &extra[i])
		}
		if err := rs.Scan(dest...); err != nil {
			return err
		}
		ev.Headers = string(hdrs)
		for i, v := range extra {
			if b, ok := v.([]byte); ok { // text protocol: every value is text
				extra[i] = string(b)
			}
		}
		if len(extra) > 0 {
			ev.Extra = extra
		}
		ev.Rank = -1
		into[ev.Sequence] = ev
		return nil
	})
}
