package postgres

import (
	"context"
	"strconv"
	"strings"

	"github.com/watermill-outbox/outbox/internal/dialect"
)

// claimOrder is the order in which composeClaim joins claim.sql's fragments into one WITH
// RECURSIVE statement (each may read those before it).
var claimOrder = []string{"known", "skip", "walked_new", "walked_retry", "walked", "walk", "cont", "first", "wruns", "scanned", "probed", "sheads", "runs", "keyed", "locked",
	"unordered_new", "unordered_retry", "unordered", "next_keyed", "next_unordered", "picked", "upd"}

// relay is one subscription's compiled statements.
type relay struct {
	t                                 *dialect.Table
	cfg                               dialect.RelayConfig
	claim, paused, probe, renew, mark *dialect.Stmt
	sweep                             *dialect.Stmt
	topics                            params // the topic filter's parameters
}

// NewRelay implements dialect.Dialect.
func (Dialect) NewRelay(t *dialect.Table, cfg dialect.RelayConfig, sel dialect.TopicSelection) dialect.Relay {
	r := &relay{t: t, cfg: cfg, topics: params{}}
	filter := selectionCond(`"topic"`, sel, r.topics)
	// Paused topics (outages) are one more parameter of the paused and probe statements; the
	// claim used while nothing is paused has no such test.
	r.claim = dialect.Compile(composeClaim(t, cfg, filter, filter, cfg.BatchSize), dialect.Dollar)
	r.paused = dialect.Compile(composeClaim(t, cfg, filter, filter+` AND NOT ("topic" = ANY(@paused::text[]))`, cfg.BatchSize), dialect.Dollar)
	r.probe = dialect.Compile(composeClaim(t, cfg, filter, filter+` AND "topic" = ANY(@paused::text[])`, 1), dialect.Dollar)
	vars := map[string]string{"t": dialect.DoubleQuote(t.Parts...), "fence": `"leased_by" = @token AND "published_at" IS NULL`,
		"max_attempts": strconv.Itoa(cfg.MaxAttempts), "retry_base_us": strconv.FormatInt(cfg.RetryBase.Microseconds(), 10),
		"retry_max_us": strconv.FormatInt(cfg.RetryMax.Microseconds(), 10)}
	r.mark = dialect.Compile(dialect.Fill(markParts["mark"], vars), dialect.Dollar)
	r.sweep = dialect.Compile(composeSweep(t, filter), dialect.Dollar)
	r.renew = dialect.Compile(dialect.Fill(markParts["renew"], vars), dialect.Dollar)
	return r
}

// composeClaim builds the claim of up to batch events from claim.sql's fragments; filter selects
// the topics claimed, base the subscription's topics (the floors' candidates: a paused topic's
// events hold the floors).
func composeClaim(t *dialect.Table, cfg dialect.RelayConfig, base, filter string, batch int) string {
	payload := `o."payload"::text`
	if t.Payload == dialect.PayloadBytea {
		payload = `o."payload"`
	}
	var extra, uextra strings.Builder
	for _, c := range t.Extra {
		extra.WriteString(", o." + dialect.DoubleQuote(c.Name))
		uextra.WriteString(", u." + dialect.DoubleQuote(c.Name))
	}
	vars := map[string]string{
		"t":           dialect.DoubleQuote(t.Parts...),
		"pending":     `"published_at" IS NULL AND "dead_lettered_at" IS NULL`,
		"claimable":   `("next_attempt_at" IS NULL OR "next_attempt_at" <= now()) AND ("lease_until" IS NULL OR "lease_until" < now())`,
		"filter":      filter,
		"basefilter":  base,
		"fbasefilter": strings.ReplaceAll(base, `"topic"`, `f."topic"`),
		// See the keyed fragment: primary-key lookups test the topic on an expression.
		"pkfilter": strings.ReplaceAll(filter, `"topic"`, `("topic" || '')`),
		"hfilter":  strings.ReplaceAll(filter, `"topic"`, `(h."topic" || '')`),
		"batch":    strconv.Itoa(batch),
		"keyscan":  strconv.Itoa(cfg.KeyScan),
		"run":      strconv.Itoa(min(cfg.MaxRunPerKey, batch)),
		"payload":  payload,
		"extra":    extra.String(),
		"uextra":   uextra.String(),
		"nulls":    strings.Repeat(", NULL", 11+len(t.Extra)),
	}
	parts := make([]string, len(claimOrder))
	for i, name := range claimOrder {
		parts[i] = dialect.Fill(claimParts[name], vars)
	}
	return "WITH RECURSIVE " + strings.Join(parts, ",\n") + "\n" + dialect.Fill(claimParts["result"], vars)
}

// composeSweep builds the sweep (dialect.Sweeper): the floors' candidates of claim.sql
// (next_keyed, next_unordered) below the floors instead of at or above them.
func composeSweep(t *dialect.Table, filter string) string {
	vars := map[string]string{
		"t":           dialect.DoubleQuote(t.Parts...),
		"pending":     `"published_at" IS NULL AND "dead_lettered_at" IS NULL`,
		"basefilter":  filter,
		"fbasefilter": strings.ReplaceAll(filter, `"topic"`, `f."topic"`),
	}
	below := func(name, floor string) string {
		q := dialect.Fill(claimParts[name], vars)
		q = q[strings.Index(q, "(")+1 : strings.LastIndex(q, ")")]
		return strings.Replace(q, `"sequence" >= @`+floor, `"sequence" < @`+floor, 1)
	}
	return "SELECT COALESCE((" + below("next_keyed", "floor_keyed") + "), 0), COALESCE((" + below("next_unordered", "floor_unordered") + "), 0)"
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

// claimArgs returns the statement and named parameters of the claim p.
func (r *relay) claimArgs(p *dialect.ClaimParams) (*dialect.Stmt, params) {
	st := r.claim
	named := params{
		"cursor": p.Cursor, "lease_us": r.cfg.LeaseDuration.Microseconds(), "token": p.Token,
		"oldest": p.Oldest, "run_limit": p.Limit, "floor_unordered": p.LowUnordered, "floor_keyed": p.LowKeyed, "no_key_scan": p.NoKeyScan,
		"cont_token": p.ContToken, "cont_margin_us": (r.cfg.LeaseDuration / 3).Microseconds(),
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
	switch {
	case p.Probe != nil:
		st, named["paused"] = r.probe, p.Probe
	case len(p.Paused) > 0:
		st, named["paused"] = r.paused, p.Paused
	}
	for k, v := range r.topics {
		named[k] = v
	}
	return st, named
}

// Claim implements dialect.Relay.
func (r *relay) Claim(ctx context.Context, ex dialect.Executor, p *dialect.ClaimParams) (*dialect.ClaimResult, error) {
	st, named := r.claimArgs(p)
	rs, err := ex.Query(ctx, st.SQL, ex.OneShot(st.Args(named))...)
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
		"perm": nonNil(m.Perm), "abandoned": nonNil(m.Abandoned), "keep": nonNil(m.Keep)}
	rs, err := ex.Query(ctx, r.mark.SQL, ex.OneShot(r.mark.Args(named))...)
	if err != nil {
		return nil, err
	}
	defer rs.Close()
	out := make([]dialect.MarkResult, 0, len(m.Acked)+len(m.Released)+len(m.Unavailable)+len(m.Failed))
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
