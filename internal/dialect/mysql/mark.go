package mysql

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/watermill-outbox/outbox/internal/dialect"
)

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
// delivery start uncounted); held (released, the start uncounted, next_attempt_at HeldFor
// after the clock, class held). It returns a MarkResult for every event it wrote except the
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
	all := slices.Concat(p.Acked, p.Released, p.Unavailable, p.Failed, p.Abandoned, p.Held)
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
	if len(p.Held) > 0 {
		// Never emitted: released, the start uncounted, due again HeldFor after the clock.
		type h struct {
			S int64  `json:"s"`
			E string `json:"e"`
			N string `json:"n"`
		}
		var hs []h
		for i, s := range p.Held {
			if _, ok := held[s]; !ok {
				continue
			}
			next := now.Add(time.Duration(p.HeldFor[i]) * time.Microsecond)
			hs = append(hs, h{s, p.HeldNotes[i], timeText(next)})
			*out = append(*out, dialect.MarkResult{Seq: s, Attempts: held[s], Next: &next, Now: now})
		}
		if len(hs) > 0 {
			js, _ := json.Marshal(hs)
			stmt := "UPDATE " + r.n.table + " o JOIN JSON_TABLE(?, '$[*]' COLUMNS (s BIGINT PATH '$.s', e LONGTEXT PATH '$.e', n VARCHAR(32) PATH '$.n')) f ON o.`sequence` = f.s" +
				" SET o.`last_error` = f.e, o.`last_error_class` = 'held', o.`next_attempt_at` = f.n, o.`lease_until` = NULL, o.`leased_by` = NULL," +
				" o.`delivery_starts` = GREATEST(o.`delivery_starts` - 1, 0) WHERE " + fence
			if _, err := q.exec(ctx, stmt, string(js), p.Token); err != nil {
				return fmt.Errorf("held: %w", err)
			}
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
