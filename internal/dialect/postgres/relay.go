package postgres

import (
	"context"
	"strings"

	"github.com/watermill-outbox/outbox/internal/dialect"
)

// relay is one subscription's statements: claim.sql's and mark.sql's, filled with the table's
// shape, and the parameters of its topic selection.
type relay struct {
	t                         *dialect.Table
	cfg                       dialect.RelayConfig
	claim, sweep, renew, mark *dialect.Stmt
	topics                    params // the topic selection's parameters (topicParams)
}

// NewRelay implements dialect.Dialect.
func (Dialect) NewRelay(t *dialect.Table, cfg dialect.RelayConfig, sel dialect.TopicSelection) dialect.Relay {
	shape := tableShape(t)
	return &relay{t: t, cfg: cfg, topics: topicParams(sel),
		claim: dialect.Compile(dialect.Fill(claimStmts["claim"], shape), dialect.Dollar),
		sweep: dialect.Compile(dialect.Fill(claimStmts["sweep"], shape), dialect.Dollar),
		mark:  dialect.Compile(dialect.Fill(markStmts["mark"], shape), dialect.Dollar),
		renew: dialect.Compile(dialect.Fill(markStmts["renew"], shape), dialect.Dollar)}
}

// tableShape returns the values of the placeholders of claim.sql and mark.sql: the table's
// name, the payload column as the claim returns it, and its extra columns.
func tableShape(t *dialect.Table) map[string]string {
	payload := `o."payload"::text`
	if t.Payload == dialect.PayloadBytea {
		payload = `o."payload"`
	}
	var extra, uextra strings.Builder
	for _, c := range t.Extra {
		extra.WriteString(", o." + dialect.DoubleQuote(c.Name))
		uextra.WriteString(", u." + dialect.DoubleQuote(c.Name))
	}
	return map[string]string{"t": dialect.DoubleQuote(t.Parts...), "payload": payload, "extra": extra.String(), "uextra": uextra.String(),
		"nulls": strings.Repeat(", NULL", 11+len(t.Extra))}
}

// topicParams returns the parameters of claim.sql's topic condition for sel: @topic_all, or
// @topic_prefix and @topic, and @topic_not, the excluded patterns as LIKE patterns.
func topicParams(sel dialect.TopicSelection) params {
	not := make([]string, len(sel.Excludes))
	for i, e := range sel.Excludes {
		not[i] = likePattern(e)
	}
	return params{"topic_all": sel.Include.All, "topic_prefix": sel.Include.Prefix, "topic": sel.Include.Value, "topic_not": not}
}

// likePattern returns the LIKE pattern (escape character '\') that matches tp.
func likePattern(tp dialect.Topic) string {
	if tp.All {
		return "%"
	}
	p := strings.NewReplacer(`\`, `\\`, `%`, `\%`, `_`, `\_`).Replace(tp.Value)
	if tp.Prefix {
		p += "%"
	}
	return p
}

// LockHolders implements dialect.LockLooker: the virtual transaction ids holding a
// RowExclusiveLock on the table (pg_locks, fast-path locks included): a writer takes it at the
// start of its INSERT and keeps it until it ends. Readers (AccessShareLock: a report, the
// snapshot held open) do not count. It reads the lock manager's state: the relay runs it
// at most once per dialect.SettleWait, only while its floors wait for xmin.
func (r *relay) LockHolders(ctx context.Context, ex dialect.Executor) ([]string, error) {
	rs, err := ex.Query(ctx, `SELECT DISTINCT virtualtransaction FROM pg_locks WHERE locktype = 'relation' AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) AND relation = to_regclass($1) AND mode = 'RowExclusiveLock' AND virtualtransaction IS NOT NULL`,
		dialect.DoubleQuote(r.t.Parts...))
	if err != nil {
		return nil, err
	}
	return dialect.ScanList[string](rs)
}

// Sweep implements dialect.Sweeper.
func (r *relay) Sweep(ctx context.Context, ex dialect.Executor, floorKeyed, floorUnordered int64) (keyed, unordered int64, err error) {
	named := params{"floor_keyed": floorKeyed, "floor_unordered": floorUnordered}
	for k, v := range r.topics {
		named[k] = v
	}
	rs, err := ex.Query(ctx, r.sweep.SQL, ex.OneShot(r.sweep.Args(named))...)
	if err != nil {
		return 0, 0, err
	}
	defer rs.Close()
	if !rs.Next() {
		return 0, 0, rs.Err()
	}
	if err := rs.Scan(&keyed, &unordered); err != nil {
		return 0, 0, err
	}
	return keyed, unordered, rs.Err()
}

// claimArgs returns the claim's named parameters for p.
func (r *relay) claimArgs(p *dialect.ClaimParams) params {
	batch, paused, probe := r.cfg.BatchSize, p.Paused, false
	if p.Probe != nil {
		batch, paused, probe = 1, p.Probe, true
	}
	named := params{
		"cursor": p.Cursor, "lease_us": r.cfg.LeaseDuration.Microseconds(), "token": p.Token,
		"oldest": p.Oldest, "run_limit": p.Limit, "floor_unordered": p.LowUnordered, "floor_keyed": p.LowKeyed, "no_key_scan": p.NoKeyScan,
		"cont_token": p.ContToken, "cont_margin_us": (r.cfg.LeaseDuration / 3).Microseconds(),
		"batch": batch, "run": min(r.cfg.MaxRunPerKey, batch), "key_scan": r.cfg.KeyScan, "paused": nonNil(paused), "probe": probe,
	}
	var keys []string
	var after, from []int64
	if len(p.Cont) > 0 {
		keys, after, from = make([]string, len(p.Cont)), make([]int64, len(p.Cont)), make([]int64, len(p.Cont))
		for i, c := range p.Cont {
			keys[i], after[i], from[i] = c.Key, c.After, c.From
		}
	}
	named["cont_keys"], named["cont_after"], named["cont_from"] = keys, after, from
	lowKeys, lowSeqs := make([]string, len(p.KeyLows)), make([]int64, len(p.KeyLows))
	for i, l := range p.KeyLows {
		lowKeys[i], lowSeqs[i] = l.Key, l.Low
	}
	named["low_keys"], named["low_seqs"] = lowKeys, lowSeqs
	firstKeys, firstLast := make([]string, len(p.First)), make([]int64, len(p.First))
	for i, f := range p.First {
		firstKeys[i], firstLast[i] = f.Key, f.Last
	}
	named["first_keys"], named["first_last"] = firstKeys, firstLast
	for k, v := range r.topics {
		named[k] = v
	}
	return named
}

// Claim implements dialect.Relay.
func (r *relay) Claim(ctx context.Context, ex dialect.Executor, p *dialect.ClaimParams) (*dialect.ClaimResult, error) {
	rs, err := ex.Query(ctx, r.claim.SQL, ex.OneShot(r.claim.Args(r.claimArgs(p)))...)
	if err != nil {
		return nil, err
	}
	var xmin, xid, maxSeq, nextKeyed, nextUnordered, heads *int64
	res, err := dialect.ScanClaimed(rs, len(r.t.Extra), p.SizeHint, &xmin, &xid, &maxSeq, &nextKeyed, &nextUnordered, &heads)
	if err != nil {
		return nil, err
	}
	res.Floors = &dialect.FloorReport{Xmin: deref(xmin), Xid: deref(xid), MaxSeq: deref(maxSeq), NextKeyed: deref(nextKeyed),
		NextUnordered: deref(nextUnordered), ScanHeads: deref(heads)}
	return res, nil
}

// deref returns *v, or 0 for nil.
func deref(v *int64) int64 {
	if v == nil {
		return 0
	}
	return *v
}

// Renew implements dialect.Relay.
func (r *relay) Renew(ctx context.Context, ex dialect.Executor, token string, seqs []int64) (int64, error) {
	return ex.Exec(ctx, r.renew.SQL, ex.OneShot(r.renew.Args(params{"lease_us": r.cfg.LeaseDuration.Microseconds(), "seqs": seqs, "token": token}))...)
}

// Mark implements dialect.Relay.
func (r *relay) Mark(ctx context.Context, ex dialect.Executor, m *dialect.MarkParams) ([]dialect.MarkResult, error) {
	named := params{"acked": nonNil(m.Acked), "released": nonNil(m.Released), "failed": nonNil(m.Failed), "errs": nonNil(m.Errs),
		"jitters": nonNil(m.Jitters), "token": m.Token, "unavailable": nonNil(m.Unavailable), "notes": nonNil(m.Notes),
		"perm": nonNil(m.Perm), "abandoned": nonNil(m.Abandoned), "keep": nonNil(m.Keep), "max_attempts": r.cfg.MaxAttempts,
		"held": nonNil(m.Held), "held_for": nonNil(m.HeldFor), "held_notes": nonNil(m.HeldNotes),
		"retry_base_us": r.cfg.RetryBase.Microseconds(), "retry_max_us": r.cfg.RetryMax.Microseconds()}
	rs, err := ex.Query(ctx, r.mark.SQL, ex.OneShot(r.mark.Args(named))...)
	if err != nil {
		return nil, err
	}
	defer rs.Close()
	out := make([]dialect.MarkResult, 0, len(m.Acked)+len(m.Released)+len(m.Unavailable)+len(m.Failed)+len(m.Held))
	for rs.Next() {
		var res dialect.MarkResult
		if err := rs.Scan(&res.Seq, &res.Attempts, &res.Next, &res.Dead, &res.Now); err != nil {
			return nil, err
		}
		out = append(out, res)
	}
	return out, rs.Err()
}

// nonNil returns vals, or an empty slice for nil (pgx sends a nil slice as NULL, and
// "= ANY(NULL)" matches nothing but also makes array_position NULL).
func nonNil[T any](vals []T) []T {
	if vals == nil {
		return []T{}
	}
	return vals
}

// TakeBack implements dialect.Dialect.
func (d Dialect) TakeBack(ctx context.Context, ex dialect.Executor, t *dialect.Table, name, tokenPrefix string) (int64, error) {
	n, _, err := d.TakeBackKeys(ctx, ex, t, name, tokenPrefix)
	return n, err
}

// TakeBackKeys implements dialect.KeyTakeBacker. The pending rows are named as the two pending
// partial indexes' predicates (keyed, unordered), which PostgreSQL reads with a BitmapOr;
// "pending" alone matches no index and scanned the whole table (EXPLAIN ANALYZE, 200k
// published + 10k pending rows: 5,994 buffers against 307).
func (Dialect) TakeBackKeys(ctx context.Context, ex dialect.Executor, t *dialect.Table, name, tokenPrefix string) (n int64, keys []dialect.TakenKey, err error) {
	q := `WITH u AS (UPDATE ` + dialect.DoubleQuote(t.Parts...) + ` SET "lease_until" = NULL, "leased_by" = NULL
WHERE "published_at" IS NULL AND "dead_lettered_at" IS NULL AND ("ordering_key" IS NULL OR "ordering_key" IS NOT NULL) AND "lease_until" > now()
AND starts_with("leased_by", @name) AND NOT starts_with("leased_by", @prefix)
AND substr("leased_by", length(@name) + 1) ~ '^[0-9a-f]{12}#[0-9]+$'
RETURNING "ordering_key", "sequence")
SELECT COALESCE("ordering_key", ''), count(*), max("sequence") FROM u GROUP BY 1 ORDER BY min("sequence")`
	rs, err := query(ctx, ex, q, params{"name": name, "prefix": tokenPrefix}, true)
	if err != nil {
		return 0, nil, err
	}
	defer rs.Close()
	for rs.Next() {
		var k dialect.TakenKey
		var c int64
		if err := rs.Scan(&k.Key, &c, &k.Last); err != nil {
			return 0, nil, err
		}
		n += c
		if k.Key != "" { // '' is the unordered events' row (the CHECK constraint rules it out as a key)
			keys = append(keys, k)
		}
	}
	return n, keys, rs.Err()
}
