package mysql

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/watermill-outbox/outbox/internal/dialect"
)

// relay is one subscription's compiled statements.
type relay struct {
	t      *dialect.Table
	n      names
	cfg    dialect.RelayConfig
	filter string // the topic selection on `topic`, parameters in filterArgs
	fargs  []any
	cols   string // the columns of a claimed event, in scanClaimed's order
}

// NewRelay compiles the claim, renew and mark statements of one subscription.
func (*Dialect) NewRelay(t *dialect.Table, cfg dialect.RelayConfig, sel dialect.TopicSelection) dialect.Relay {
	r := &relay{t: t, n: namesOf(t), cfg: cfg}
	r.filter = selectionSQL(sel, "o.`topic`", &r.fargs)
	cols := "o.`sequence`, o.`id`, o.`topic`, o.`payload`, o.`headers`, o.`ordering_key`, " + selectTime("o.`created_at`") + ", o.`attempts`, o.`last_error`, o.`delivery_starts`"
	for _, c := range t.Extra {
		cols += ", o." + ident(c.Name)
	}
	r.cols = cols
	return r
}

// claimable is the condition under which an event may be leased now (besides being pending):
// due and not leased by a live relay (database clock).
const claimable = "(o.`next_attempt_at` IS NULL OR o.`next_attempt_at` <= UTC_TIMESTAMP(6)) AND (o.`lease_until` IS NULL OR o.`lease_until` < UTC_TIMESTAMP(6))"

// topicsSQL adds the Paused (left out) and Probe (only these) topics of a claim.
func topicsSQL(p *dialect.ClaimParams, args *[]any) string {
	var s string
	if len(p.Probe) > 0 {
		s += " AND " + listSQL("o.`topic`", p.Probe, args)
	}
	if len(p.Paused) > 0 {
		s += " AND NOT " + listSQL("o.`topic`", p.Paused, args)
	}
	return s
}

// Kinds of candidate key of a claim.
const (
	candWalked  = iota // a walked key: a candidate when the walked event is its head
	candScanned        // a key of the skip scan whose head is claimable
	candCont           // a continuation (ClaimParams.Cont)
)

// candidate is a key whose run a claim reads: from is the walked event (candWalked), the head
// (candScanned) or the sequence after the previous run (candCont), which orders candidates.
type candidate struct {
	key  string
	kind int
	from int64
	cont dialect.Continuation
}

// Claim leases the next batch under p.Token in one READ COMMITTED transaction of a few short
// statements (MySQL has no UPDATE … RETURNING, so what is leased is read in the transaction):
//
//  1. walk: a plain read of the 2·p.Oldest oldest claimable pending keyed events (topic
//     filter, from p.LowKeyed), each with whether it is its key's head (the lowest sequence
//     among the key's unpublished events, dead-lettered ones included: one read of the key
//     index per row); then the first p.Oldest of those heads still claimable, locked by
//     primary key FOR UPDATE SKIP LOCKED, so a relay claiming at the same moment passes over
//     them to other keys. Only heads are locked: a walk that locked every event of its window
//     (until the claim commits) held the next events of the keys another relay was
//     continuing, whose claims then skipped them and leased nothing of those keys (10 hot
//     keys, two relays: 65 of 219 claims empty and 21,000 of 69,000 run events lost, against
//     23 of 147 and 13,000 of 63,000). The head check cannot be part of the locking read:
//     MariaDB's FOR UPDATE SKIP LOCKED applies to a subquery's rows too, which skipped a
//     locked head and took the key's second event for its head;
//  2. scan: when the walk was full or started above 0, a skip scan of the key index after
//     p.Cursor over up to KeyScan keys, so keys whose head sits behind other keys' blocked
//     events are reached; a scanned key is a candidate when its head is claimable and in the
//     topic filter;
//  3. runs (plain reads, after the walk, so they see at least what the walk saw): up to
//     MaxRunPerKey unpublished events of each candidate key, candidates in order of their
//     first event, p.Limit events in all (one index range per key, see runs): a walked key's
//     run from its locked head (checked once more), a scanned key's from its head,
//     and a continuation's (p.Cont) after its previous run, when that run's marks landed or
//     its events are still leased under p.ContToken. Heads are never looked up with a per-key
//     LIMIT 1 FOR UPDATE SKIP LOCKED (which would hand out a key's second event when its head
//     is locked);
//  4. lock: the run members by primary key, FOR UPDATE SKIP LOCKED, with the pending and
//     claimable conditions checked again on the latest row version; a key keeps the gap-free
//     start of its run (a member skipped or changed meanwhile ends the run there), so when
//     another relay holds a key's head nothing of that key is leased;
//  5. unordered: the BatchSize oldest claimable pending unordered events (from
//     p.LowUnordered), FOR UPDATE SKIP LOCKED;
//  6. lease the first BatchSize events of 4 and 5 by sequence (lease_until, leased_by,
//     delivery_starts + 1).
//
// Per-key order needs no more than that because Insert's key locks make one key's events
// commit in sequence order: no event of a key becomes visible before an earlier one of the
// same key. Ranks are 1 for a key's head (a continuation's first event after its previous
// run), 2, 3 … along its run, 0 for unordered events. Cursor and Scanned report the skip scan
// when it ran; Walked is the number of distinct keys the walk found.
func (r *relay) Claim(ctx context.Context, ex dialect.Executor, p *dialect.ClaimParams) (*dialect.ClaimResult, error) {
	res := &dialect.ClaimResult{}
	err := inTx(ctx, ex, sql.LevelReadCommitted, func(q querier) error {
		res = &dialect.ClaimResult{}
		return r.claim(ctx, q, p, res)
	})
	if err != nil {
		return nil, err
	}
	return res, nil
}

func (r *relay) claim(ctx context.Context, q querier, p *dialect.ClaimParams, res *dialect.ClaimResult) error {
	batch := r.cfg.BatchSize
	if len(p.Probe) > 0 {
		batch = 1
	}
	limit := min(max(p.Limit, 0), batch)
	run := min(r.cfg.MaxRunPerKey, batch)
	oldest := max(p.Oldest, 1)

	// 1. The walk: the window (a plain read, each row with whether it is its key's head),
	// then the window's heads locked.
	args := append([]any{p.LowKeyed}, r.fargs...)
	window := "SELECT w.s, w.k, w.s = (SELECT h.`sequence` FROM " + r.n.table + " h FORCE INDEX (" + r.n.keyIdx + ") WHERE h.`outbox_key` = w.k ORDER BY h.`sequence` LIMIT 1)" +
		" FROM (SELECT o.`sequence` AS s, o.`outbox_key` AS k FROM " + r.n.table + " o FORCE INDEX (" + r.n.pending + ")" +
		" WHERE o.`outbox_pending` = 1 AND o.`sequence` >= ? AND " + claimable + " AND " + r.filter + topicsSQL(p, &args) +
		" ORDER BY o.`sequence` LIMIT " + itoa(2*oldest) + ") w"
	rs, err := q.query(ctx, window, args...)
	if err != nil {
		return fmt.Errorf("window: %w", err)
	}
	seen := map[string]bool{}
	var heads []int64
	nWalk := 0
	err = scanEach(rs, func(rs dialect.Rows) error {
		var (
			seq  int64
			k    string
			head sql.NullBool
		)
		if err := rs.Scan(&seq, &k, &head); err != nil {
			return err
		}
		nWalk++
		if nWalk <= oldest && !seen[k] {
			res.Walked++
		}
		seen[k] = true
		if head.Bool {
			heads = append(heads, seq)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("window: %w", err)
	}
	walkedMin := map[string]int64{}
	var walkOrder []string
	if len(heads) > 0 {
		var hargs []any
		stmt := "SELECT o.`sequence`, o.`outbox_key` FROM " + r.n.table + " o WHERE " + listSQL("o.`sequence`", heads, &hargs) +
			" AND o.`outbox_pending` = 1 AND " + claimable + " ORDER BY o.`sequence` LIMIT " + itoa(oldest) + " FOR UPDATE SKIP LOCKED"
		rs, err := q.query(ctx, stmt, hargs...)
		if err != nil {
			return fmt.Errorf("walk: %w", err)
		}
		err = scanEach(rs, func(rs dialect.Rows) error {
			var (
				seq int64
				k   string
			)
			if err := rs.Scan(&seq, &k); err != nil {
				return err
			}
			walkedMin[k] = seq
			walkOrder = append(walkOrder, k)
			return nil
		})
		if err != nil {
			return fmt.Errorf("walk: %w", err)
		}
	}
	for k := range seen {
		if _, ok := walkedMin[k]; !ok {
			walkedMin[k] = 0 // seen by the walk, not a candidate: left out of the skip scan
		}
	}

	// 2. The skip scan, when the walk was full or started above 0.
	cont := make(map[string]bool, len(p.Cont))
	for _, c := range p.Cont {
		cont[c.Key] = true
	}
	var cands []candidate
	if nWalk >= oldest || p.LowKeyed > 0 {
		scanned, err := r.scan(ctx, q, p, walkedMin, cont, res)
		if err != nil {
			return fmt.Errorf("scan: %w", err)
		}
		cands = scanned
	}
	for _, k := range walkOrder {
		if !cont[k] {
			cands = append(cands, candidate{key: k, kind: candWalked, from: walkedMin[k]})
		}
	}
	for _, c := range p.Cont {
		cands = append(cands, candidate{key: c.Key, kind: candCont, from: c.After + 1, cont: c})
	}
	sort.SliceStable(cands, func(i, j int) bool { return cands[i].from < cands[j].from })

	// 3. Runs.
	members, err := r.runs(ctx, q, p, cands, run, limit)
	if err != nil {
		return fmt.Errorf("runs: %w", err)
	}

	// 4. Lock the runs; keep each key's gap-free start.
	events := map[int64]dialect.Claimed{}
	var picked []int64
	if len(members) > 0 {
		seqs := make([]int64, len(members))
		for i, m := range members {
			seqs[i] = m.seq
		}
		// The topic filter and the paused (or probed) topics are checked here too: a key's run
		// may hold events of other topics, and leasing one of those would hand it to a
		// subscription that does not serve its topic (it then ends the key's run, as on
		// PostgreSQL).
		var largs []any
		stmt := "SELECT " + r.cols + " FROM " + r.n.table + " o WHERE " + listSQL("o.`sequence`", seqs, &largs)
		largs = append(largs, r.fargs...)
		stmt += " AND o.`published_at` IS NULL AND o.`dead_lettered_at` IS NULL AND " + claimable + " AND " + r.filter + topicsSQL(p, &largs) +
			" ORDER BY o.`sequence` FOR UPDATE SKIP LOCKED"
		if err := r.scanClaimed(ctx, q, stmt, largs, events); err != nil {
			return fmt.Errorf("lock runs: %w", err)
		}
		broken := map[string]bool{}
		for _, m := range members {
			ev, ok := events[m.seq]
			if broken[m.key] || !ok {
				broken[m.key] = true
				delete(events, m.seq)
				continue
			}
			ev.Rank = m.rank
			events[m.seq] = ev
			picked = append(picked, m.seq)
		}
	}

	// 5. Unordered events.
	uargs := append([]any{p.LowUnordered}, r.fargs...)
	stmt := "SELECT " + r.cols + " FROM " + r.n.table + " o FORCE INDEX (" + r.n.pending + ")" +
		" WHERE o.`outbox_pending` = 0 AND o.`sequence` >= ? AND " + claimable + " AND " + r.filter + topicsSQL(p, &uargs) +
		" ORDER BY o.`sequence` LIMIT " + itoa(batch) + " FOR UPDATE SKIP LOCKED"
	unordered := map[int64]dialect.Claimed{}
	if err := r.scanClaimed(ctx, q, stmt, uargs, unordered); err != nil {
		return fmt.Errorf("unordered: %w", err)
	}
	for seq, ev := range unordered {
		ev.Rank = 0
		events[seq] = ev
		picked = append(picked, seq)
	}
	slices.Sort(picked)
	if len(picked) > batch {
		picked = picked[:batch]
	}
	if len(picked) == 0 {
		return nil
	}

	// 6. Lease.
	var uparams []any
	uparams = append(uparams, r.cfg.LeaseDuration.Microseconds(), p.Token)
	upd := "UPDATE " + r.n.table + " o SET o.`lease_until` = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, o.`leased_by` = ?, o.`delivery_starts` = o.`delivery_starts` + 1 WHERE " +
		listSQL("o.`sequence`", picked, &uparams)
	if _, err := q.exec(ctx, upd, uparams...); err != nil {
		return fmt.Errorf("lease: %w", err)
	}
	res.Events = make([]dialect.Claimed, len(picked))
	for i, seq := range picked {
		ev := events[seq]
		ev.DeliveryStarts++
		res.Events[i] = ev
	}
	return nil
}

// scan runs the key skip scan: MIN(sequence) GROUP BY outbox_key over outbox_key > p.Cursor,
// ORDER BY outbox_key LIMIT KeyScan, and returns the keys (neither walked nor continued) whose
// head is claimable and in the topic filter; it sets res.Cursor and res.Scanned. MariaDB runs
// the scan either as a loose index scan ("Using index for group-by": one dive per key) or,
// when its statistics say keys have few events, as a range over those keys' events. MariaDB
// does not use a loose index scan on a generated column, nor a range for a correlated
// outbox_key > k (a recursive CTE of MIN() subqueries read the whole index once per key: 130 ms
// per claim at 10,000 events), which is why outbox_key is a plain column kept by Insert's
// DEFAULT and the ack, and checked by a CHECK constraint.
func (r *relay) scan(ctx context.Context, q querier, p *dialect.ClaimParams, walkedMin map[string]int64, cont map[string]bool, res *dialect.ClaimResult) ([]candidate, error) {
	args := []any{p.Cursor}
	hcond := "o.`dead_lettered_at` IS NULL AND " + claimable + " AND " + r.filter
	args = append(args, r.fargs...)
	hcond += topicsSQL(p, &args)
	stmt := "SELECT s.k, s.h, o.`sequence` IS NOT NULL FROM (SELECT h.`outbox_key` AS k, MIN(h.`sequence`) AS h FROM " + r.n.table + " h FORCE INDEX (" + r.n.keyIdx + ")" +
		" WHERE h.`outbox_key` > ? GROUP BY h.`outbox_key` ORDER BY h.`outbox_key` LIMIT " + itoa(max(r.cfg.KeyScan, 1)) + ") s" +
		" LEFT JOIN " + r.n.table + " o ON o.`sequence` = s.h AND " + hcond
	rs, err := q.query(ctx, stmt, args...)
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
		lim := itoa(min(run, need))
		var (
			args  []any
			parts []string
		)
		for i, c := range cands[start : start+n] {
			head := "o.`outbox_key` = ? AND o.`sequence` >= ?"
			args = append(args, start+i, c.key, c.from)
			switch c.kind {
			case candWalked:
				head += " AND (SELECT h.`sequence` FROM " + r.n.table + " h FORCE INDEX (" + r.n.keyIdx + ") WHERE h.`outbox_key` = ? ORDER BY h.`sequence` LIMIT 1) = ?"
				args = append(args, c.key, c.from)
			case candCont:
				head += " AND (SELECT h.`sequence` > ? OR (h.`leased_by` = ? AND h.`lease_until` > UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND) FROM " + r.n.table +
					" h FORCE INDEX (" + r.n.keyIdx + ") WHERE h.`outbox_key` = ? AND h.`sequence` >= ? ORDER BY h.`sequence` LIMIT 1)"
				args = append(args, c.cont.After, p.ContToken, margin, c.key, c.cont.From)
			}
			parts = append(parts, "(SELECT ? AS i, o.`sequence` FROM "+r.n.table+" o FORCE INDEX ("+r.n.keyIdx+") WHERE "+head+
				" ORDER BY o.`sequence` LIMIT "+lim+")")
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

// scanClaimed runs a locking SELECT of r.cols and adds its rows to into by sequence.
func (r *relay) scanClaimed(ctx context.Context, q querier, stmt string, args []any, into map[int64]dialect.Claimed) error {
	rs, err := q.query(ctx, stmt, args...)
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

// fence is the condition of every renew and mark: the event is still leased under the token
// and not published (a relay whose lease expired writes nothing).
const fence = "o.`leased_by` = ? AND o.`published_at` IS NULL"

// Renew extends the lease of seqs held under token to LeaseDuration from now (database clock)
// and returns how many it extended.
func (r *relay) Renew(ctx context.Context, ex dialect.Executor, token string, seqs []int64) (int64, error) {
	if len(seqs) == 0 {
		return 0, nil
	}
	args := []any{r.cfg.LeaseDuration.Microseconds()}
	stmt := "UPDATE " + r.n.table + " o SET o.`lease_until` = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND WHERE " +
		listSQL("o.`sequence`", seqs, &args) + " AND " + fence
	args = append(args, token)
	return ex.Exec(ctx, stmt, args...)
}

// Mark writes a batch's outcome in one READ COMMITTED transaction: it locks the batch's rows
// still held under p.Token (the fence: leased_by = token AND published_at IS NULL) and reads
// their attempts and the database clock once, then writes each outcome with a fenced UPDATE:
// published (outbox_key cleared); released; unavailable (last_error and last_error_class
// noted, delivery_starts kept or reset); failed (attempts + 1 and either a dead letter, at MaxAttempts or Perm, or
// next_attempt_at = now + min(RetryBase·2^attempts, RetryMax) × jitter, the PostgreSQL
// mark's formula with attempts counted before this failure); abandoned (released, the
// delivery start uncounted). It returns a MarkResult for every event it wrote except the
// abandoned ones, all with that clock; an event no longer held is left out.
func (r *relay) Mark(ctx context.Context, ex dialect.Executor, p *dialect.MarkParams) ([]dialect.MarkResult, error) {
	var out []dialect.MarkResult
	err := inTx(ctx, ex, sql.LevelReadCommitted, func(q querier) error {
		out = nil
		return r.mark(ctx, q, p, &out)
	})
	return out, err
}

func (r *relay) mark(ctx context.Context, q querier, p *dialect.MarkParams, out *[]dialect.MarkResult) error {
	all := slices.Concat(p.Acked, p.Released, p.Unavailable, p.Failed, p.Abandoned)
	if len(all) == 0 {
		return nil
	}
	var args []any
	stmt := "SELECT o.`sequence`, o.`attempts`, " + selectTime("UTC_TIMESTAMP(6)") + " FROM " + r.n.table + " o WHERE " + listSQL("o.`sequence`", all, &args) +
		" AND " + fence + " FOR UPDATE"
	args = append(args, p.Token)
	rs, err := q.query(ctx, stmt, args...)
	if err != nil {
		return err
	}
	held := map[int64]int{}
	var now time.Time
	err = scanEach(rs, func(rs dialect.Rows) error {
		var (
			seq int64
			att int
		)
		if err := rs.Scan(&seq, &att, (*dbTime)(&now)); err != nil {
			return err
		}
		held[seq] = att
		return nil
	})
	if err != nil {
		return err
	}
	if len(held) == 0 {
		return nil
	}
	nowText := timeText(now)
	heldOf := func(seqs []int64) []int64 {
		var h []int64
		for _, s := range seqs {
			if _, ok := held[s]; ok {
				h = append(h, s)
			}
		}
		return h
	}
	simple := func(seqs []int64, set string, setArgs ...any) ([]int64, error) {
		h := heldOf(seqs)
		if len(h) == 0 {
			return nil, nil
		}
		args := append([]any(nil), setArgs...)
		stmt := "UPDATE " + r.n.table + " o SET " + set + " WHERE " + listSQL("o.`sequence`", h, &args) + " AND " + fence
		args = append(args, p.Token)
		_, err := q.exec(ctx, stmt, args...)
		return h, err
	}
	report := func(seqs []int64) {
		for _, s := range seqs {
			*out = append(*out, dialect.MarkResult{Seq: s, Attempts: held[s], Now: now})
		}
	}
	acked, err := simple(p.Acked, "o.`published_at` = ?, o.`outbox_key` = NULL, o.`lease_until` = NULL, o.`leased_by` = NULL, o.`delivery_starts` = 0", nowText)
	if err != nil {
		return fmt.Errorf("acked: %w", err)
	}
	report(acked)
	released, err := simple(p.Released, "o.`lease_until` = NULL, o.`leased_by` = NULL, o.`delivery_starts` = 0")
	if err != nil {
		return fmt.Errorf("released: %w", err)
	}
	report(released)
	if _, err := simple(p.Abandoned, "o.`delivery_starts` = GREATEST(o.`delivery_starts` - 1, 0), o.`lease_until` = NULL, o.`leased_by` = NULL"); err != nil {
		return fmt.Errorf("abandoned: %w", err)
	}
	if len(p.Unavailable) > 0 {
		type u struct {
			S int64  `json:"s"`
			E string `json:"e"`
			K int    `json:"k"`
		}
		var us []u
		var seqs []int64
		for i, s := range p.Unavailable {
			if _, ok := held[s]; !ok {
				continue
			}
			k := 0
			if i < len(p.Keep) && p.Keep[i] {
				k = 1
			}
			us = append(us, u{s, p.Notes[i], k})
			seqs = append(seqs, s)
		}
		if len(us) > 0 {
			js, _ := json.Marshal(us)
			stmt := "UPDATE " + r.n.table + " o JOIN JSON_TABLE(?, '$[*]' COLUMNS (s BIGINT PATH '$.s', e LONGTEXT PATH '$.e', k INT PATH '$.k')) f ON o.`sequence` = f.s" +
				" SET o.`last_error` = f.e, o.`last_error_class` = IF(f.k = 1, 'not_attempted', 'unavailable'), o.`lease_until` = NULL, o.`leased_by` = NULL, o.`delivery_starts` = IF(f.k = 1, o.`delivery_starts`, 0) WHERE " + fence
			if _, err := q.exec(ctx, stmt, string(js), p.Token); err != nil {
				return fmt.Errorf("unavailable: %w", err)
			}
			report(seqs)
		}
	}
	if len(p.Failed) > 0 {
		// Each failure's outcome is computed here from the attempts the locking read
		// returned (the rows stay locked until COMMIT) and the mark's database clock, and
		// written as plain values: a multi-table UPDATE does not promise to evaluate its
		// assignments in order, so no assignment reads a column another one writes.
		type f struct {
			S int64   `json:"s"`
			E string  `json:"e"`
			A int     `json:"a"`
			D int     `json:"d"`
			N *string `json:"n"`
			C string  `json:"c"`
		}
		var fs []f
		for i, s := range p.Failed {
			att, ok := held[s]
			if !ok {
				continue
			}
			res := dialect.MarkResult{Seq: s, Attempts: att + 1, Now: now}
			x := f{S: s, E: p.Errs[i], A: att + 1, C: dialect.ClassFailure}
			if i < len(p.Perm) && p.Perm[i] {
				x.C = dialect.ClassPermanent
			}
			if att+1 >= r.cfg.MaxAttempts || (i < len(p.Perm) && p.Perm[i]) {
				res.Dead, x.D = true, 1
			} else {
				j := 1.0
				if i < len(p.Jitters) {
					j = p.Jitters[i]
				}
				next := now.Add(backoff(r.cfg.RetryBase, r.cfg.RetryMax, att, j))
				res.Next = &next
				x.N = ptrTo(timeText(next))
			}
			fs = append(fs, x)
			*out = append(*out, res)
		}
		if len(fs) > 0 {
			js, _ := json.Marshal(fs)
			stmt := "UPDATE " + r.n.table + " o JOIN JSON_TABLE(?, '$[*]' COLUMNS (s BIGINT PATH '$.s', e LONGTEXT PATH '$.e', a INT PATH '$.a', d INT PATH '$.d', n VARCHAR(32) PATH '$.n', c VARCHAR(32) PATH '$.c')) f ON o.`sequence` = f.s" +
				" SET o.`attempts` = f.a, o.`last_error` = f.e, o.`last_error_class` = f.c, o.`dead_lettered_at` = IF(f.d = 1, ?, NULL), o.`next_attempt_at` = f.n," +
				" o.`lease_until` = NULL, o.`leased_by` = NULL, o.`delivery_starts` = 0 WHERE " + fence
			if _, err := q.exec(ctx, stmt, string(js), nowText, p.Token); err != nil {
				return fmt.Errorf("failed: %w", err)
			}
		}
	}
	return nil
}

func ptrTo[T any](v T) *T { return &v }

// backoff returns the retry delay of an event that failed with attempts earlier failures:
// min(base·2^attempts, max) × jitter, rounded to the microsecond (the PostgreSQL mark's
// formula).
func backoff(base, maxDelay time.Duration, attempts int, jitter float64) time.Duration {
	d := math.Min(float64(base.Microseconds())*math.Pow(2, float64(min(attempts, 62))), float64(maxDelay.Microseconds()))
	return time.Duration(math.Round(d*jitter)) * time.Microsecond
}

// TakeBack releases the unexpired leases of an earlier relay of the same name: pending events
// whose leased_by starts with name (RelayName + "#"), does not start with tokenPrefix (this
// relay's own), and continues with 12 hex digits, '#' and digits. It reads the pending index
// only.
func (*Dialect) TakeBack(ctx context.Context, ex dialect.Executor, t *dialect.Table, name, tokenPrefix string) (int64, error) {
	n := namesOf(t)
	stmt := "UPDATE " + n.table + " o SET o.`lease_until` = NULL, o.`leased_by` = NULL" +
		" WHERE o.`outbox_pending` IN (0, 1) AND o.`lease_until` > UTC_TIMESTAMP(6)" +
		" AND LEFT(o.`leased_by`, CHAR_LENGTH(?)) = ? AND NOT LEFT(o.`leased_by`, CHAR_LENGTH(?)) = ?" +
		" AND SUBSTRING(o.`leased_by`, CHAR_LENGTH(?) + 1) REGEXP '^[0-9a-f]{12}#[0-9]+$'"
	var cnt int64
	err := inTx(ctx, ex, sql.LevelReadCommitted, func(q querier) error {
		var err error
		cnt, err = q.exec(ctx, stmt, name, name, tokenPrefix, tokenPrefix, name)
		return err
	})
	return cnt, err
}
