package sqlite

import (
	"context"
	_ "embed"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"time"

	"github.com/watermill-outbox/outbox/internal/dialect"
)

// relay is one subscription's statements: claim.sql's, filled with the table's shape and the
// subscription's topic condition, and that condition's parameters.
type relay struct {
	t                    *dialect.Table
	cfg                  dialect.RelayConfig
	claim, paused, probe *dialect.Stmt // claim.sql's select: no topic paused, some paused, a probe
	lease                *dialect.Stmt
	topics               map[string]any // the topic condition's parameters (@topic_0 …)
}

//go:embed claim.sql
var claimFile string

var claimStmts = dialect.ParseSQLFile(claimFile)

// NewRelay implements dialect.Dialect. Paused topics are tested only by the paused and probe
// statements: in the claim used while nothing is paused, a json_each per row examined would run
// while the claim holds the database's write lock.
func (Dialect) NewRelay(t *dialect.Table, cfg dialect.RelayConfig, sel dialect.TopicSelection) dialect.Relay {
	r := &relay{t: t, cfg: cfg, topics: map[string]any{}}
	filter := namedTopicCond(sel.Include, r.topics)
	for _, e := range sel.Excludes {
		filter += " AND NOT " + namedTopicCond(e, r.topics)
	}
	var extra strings.Builder
	for _, c := range t.Extra {
		extra.WriteString(", " + dialect.DoubleQuote(c.Name))
	}
	shape := func(topics string, batch int) map[string]string {
		return map[string]string{
			"t": quote(t), "keyed_idx": index(t, "keyed_idx"), "unordered_idx": index(t, "unordered_idx"), "extra": extra.String(),
			"topics": topics, "batch": strconv.Itoa(batch), "run": strconv.Itoa(min(cfg.MaxRunPerKey, batch)), "key_scan": strconv.Itoa(cfg.KeyScan),
		}
	}
	compile := func(name, topics string, batch int) *dialect.Stmt {
		return dialect.Compile(dialect.Fill(claimStmts[name], shape(topics, batch)), dialect.Dollar)
	}
	r.claim = compile("select", filter, cfg.BatchSize)
	r.paused = compile("select", filter+` AND o."topic" NOT IN (SELECT value FROM json_each(@listed))`, cfg.BatchSize)
	r.probe = compile("select", filter+` AND o."topic" IN (SELECT value FROM json_each(@listed))`, 1)
	r.lease = compile("lease", filter, cfg.BatchSize)
	return r
}

// namedTopicCond renders one topic pattern as a condition on o."topic" whose value is a named
// parameter (@topic_N), recorded in named.
func namedTopicCond(tp dialect.Topic, named map[string]any) string {
	if tp.All {
		return "true"
	}
	name := "topic_" + strconv.Itoa(len(named))
	named[name] = tp.Value
	if tp.Prefix {
		return fmt.Sprintf(`substr(o."topic", 1, length(@%s)) = @%s`, name, name)
	}
	return `o."topic" = @` + name
}

// Claim implements dialect.Relay: the selection and an UPDATE … RETURNING that leases it, in
// one IMMEDIATE transaction so no other writer comes between. Ranks are left to the caller.
func (r *relay) Claim(ctx context.Context, ex dialect.Executor, p *dialect.ClaimParams) (*dialect.ClaimResult, error) {
	q, topics := r.claim, p.Paused
	switch {
	case p.Probe != nil:
		q, topics = r.probe, p.Probe
	case len(p.Paused) > 0:
		q = r.paused
	}
	named := maps.Clone(r.topics)
	named["cursor"], named["listed"] = p.Cursor, dialect.JSONList(topics)
	res := &dialect.ClaimResult{Walked: -1}
	err := withRelayTx(ctx, ex, p.Eager, p.ReadFirst, func(ex dialect.Executor) error {
		// The clock is read once the write lock is held: BEGIN IMMEDIATE may wait up to the
		// busy timeout, and a lease computed before that wait could already have expired.
		now := time.Now()
		named["now"] = micros(now)
		rs, err := ex.Query(ctx, q.SQL, q.Args(named)...)
		if err != nil {
			return err
		}
		var seqs []int64
		for rs.Next() {
			var (
				seq, sc *int64
				c       *string
			)
			if err := rs.Scan(&seq, &c, &sc); err != nil {
				rs.Close()
				return err
			}
			if seq != nil {
				seqs = append(seqs, *seq)
			} else {
				res.Cursor, res.Scanned = c, sc
			}
		}
		rs.Close()
		if err := rs.Err(); err != nil || len(seqs) == 0 {
			return err
		}
		rs, err = ex.Query(ctx, r.lease.SQL, r.lease.Args(map[string]any{"lease_until": micros(now.Add(r.cfg.LeaseDuration)), "token": p.Token, "seqs": dialect.JSONList(seqs)})...)
		if err != nil {
			return err
		}
		leased, err := dialect.ScanClaimed(rs, len(r.t.Extra), len(seqs))
		if err != nil {
			return err
		}
		res.Events = leased.Events
		return nil
	})
	if err != nil {
		return nil, err
	}
	return res, nil
}

// Renew implements dialect.Relay.
func (r *relay) Renew(ctx context.Context, ex dialect.Executor, token string, seqs []int64) (n int64, err error) {
	end, err := writeTurn(ctx, ex)
	if err != nil {
		return 0, err
	}
	defer end()
	return ex.Exec(ctx, fmt.Sprintf(`UPDATE %s SET "lease_until" = $1 WHERE "sequence" IN (SELECT value FROM json_each($2)) AND "leased_by" = $3 AND "published_at" IS NULL`, quote(r.t)),
		micros(time.Now().Add(r.cfg.LeaseDuration)), dialect.JSONList(seqs), token)
}

// Mark implements dialect.Relay: one transaction of fenced UPDATEs (the same rules as the
// PostgreSQL mark statement), with the relay's clock.
func (r *relay) Mark(ctx context.Context, ex dialect.Executor, m *dialect.MarkParams) ([]dialect.MarkResult, error) {
	t := quote(r.t)
	var out []dialect.MarkResult
	err := withRelayTx(ctx, ex, m.Eager, false, func(ex dialect.Executor) error {
		now := time.Now() // once the write lock is held (see Claim)
		nowUS := micros(now)
		collect := func(q string, args ...any) error {
			rs, err := ex.Query(ctx, q, args...)
			if err != nil {
				return err
			}
			defer rs.Close()
			for rs.Next() {
				var (
					res        dialect.MarkResult
					next, dead *int64
				)
				if err := rs.Scan(&res.Seq, &res.Attempts, &next, &dead); err != nil {
					return err
				}
				if next != nil {
					t := time.UnixMicro(*next).UTC()
					res.Next = &t
				}
				res.Dead, res.Now = dead != nil, now
				out = append(out, res)
			}
			return rs.Err()
		}
		fence := `"leased_by" = $2 AND "published_at" IS NULL`
		ofence := `o."leased_by" = $2 AND o."published_at" IS NULL`
		if len(m.Acked) > 0 {
			if err := collect(fmt.Sprintf(`UPDATE %s SET "published_at" = $3, "lease_until" = NULL, "leased_by" = NULL, "delivery_starts" = 0 WHERE "sequence" IN (SELECT value FROM json_each($1)) AND %s RETURNING "sequence", "attempts", NULL, NULL`,
				t, fence), dialect.JSONList(m.Acked), m.Token, nowUS); err != nil {
				return err
			}
		}
		if len(m.Released) > 0 {
			if err := collect(fmt.Sprintf(`UPDATE %s SET "lease_until" = NULL, "leased_by" = NULL, "delivery_starts" = 0 WHERE "sequence" IN (SELECT value FROM json_each($1)) AND %s RETURNING "sequence", "attempts", NULL, NULL`,
				t, fence), dialect.JSONList(m.Released), m.Token); err != nil {
				return err
			}
		}
		if len(m.Unavailable) > 0 {
			type u struct {
				Seq  int64  `json:"s"`
				Note string `json:"e"`
				Keep bool   `json:"k"`
			}
			us := make([]u, len(m.Unavailable))
			for i := range m.Unavailable {
				us[i] = u{m.Unavailable[i], m.Notes[i], m.Keep[i]}
			}
			q := fmt.Sprintf(`UPDATE %[1]s AS o SET "last_error" = f.e, "lease_until" = NULL, "leased_by" = NULL,
	"delivery_starts" = CASE WHEN f.k THEN o."delivery_starts" ELSE 0 END,
	"last_error_class" = CASE WHEN f.k THEN 'not_attempted' ELSE 'unavailable' END
FROM (SELECT value ->> '$.s' AS s, value ->> '$.e' AS e, value ->> '$.k' AS k FROM json_each($1)) AS f
WHERE o."sequence" = f.s AND %[2]s
RETURNING "sequence", "attempts", NULL, NULL`, t, ofence)
			if err := collect(q, dialect.JSONList(us), m.Token); err != nil {
				return err
			}
		}
		if len(m.Failed) > 0 {
			type f struct {
				Seq    int64   `json:"s"`
				Err    string  `json:"e"`
				Jitter float64 `json:"j"`
				Perm   bool    `json:"p"`
			}
			fs := make([]f, len(m.Failed))
			for i := range m.Failed {
				fs[i] = f{m.Failed[i], m.Errs[i], m.Jitters[i], m.Perm[i]}
			}
			q := fmt.Sprintf(`UPDATE %[1]s AS o SET "attempts" = o."attempts" + 1, "last_error" = f.e,
	"last_error_class" = CASE WHEN f.p THEN 'permanent' ELSE 'failure' END,
	"dead_lettered_at" = CASE WHEN o."attempts" + 1 >= %[2]d OR f.p THEN $3 END,
	"next_attempt_at" = CASE WHEN o."attempts" + 1 < %[2]d AND NOT f.p THEN $3 + CAST(min(%[3]d * power(2.0, min(o."attempts", 62)), %[4]d.0) * f.j AS INTEGER) END,
	"lease_until" = NULL, "leased_by" = NULL, "delivery_starts" = 0
FROM (SELECT value ->> '$.s' AS s, value ->> '$.e' AS e, value ->> '$.j' AS j, value ->> '$.p' AS p FROM json_each($1)) AS f
WHERE o."sequence" = f.s AND %[5]s
RETURNING "sequence", "attempts", "next_attempt_at", "dead_lettered_at"`,
				t, r.cfg.MaxAttempts, r.cfg.RetryBase.Microseconds(), r.cfg.RetryMax.Microseconds(), ofence)
			if err := collect(q, dialect.JSONList(fs), m.Token, nowUS); err != nil {
				return err
			}
		}
		if len(m.Held) > 0 {
			// Never emitted: released, the start uncounted, due again HeldFor later.
			type h struct {
				Seq  int64  `json:"s"`
				Note string `json:"e"`
				For  int64  `json:"f"`
			}
			hs := make([]h, len(m.Held))
			for i := range m.Held {
				hs[i] = h{m.Held[i], m.HeldNotes[i], m.HeldFor[i]}
			}
			q := fmt.Sprintf(`UPDATE %[1]s AS o SET "last_error" = f.e, "last_error_class" = 'held', "lease_until" = NULL, "leased_by" = NULL,
	"delivery_starts" = max(o."delivery_starts" - 1, 0), "next_attempt_at" = $3 + f.f
FROM (SELECT value ->> '$.s' AS s, value ->> '$.e' AS e, value ->> '$.f' AS f FROM json_each($1)) AS f
WHERE o."sequence" = f.s AND %[2]s
RETURNING "sequence", "attempts", "next_attempt_at", NULL`, t, ofence)
			if err := collect(q, dialect.JSONList(hs), m.Token, nowUS); err != nil {
				return err
			}
		}
		if len(m.Abandoned) > 0 {
			// Unanswered at a stop: released, and the start does not count.
			if _, err := ex.Exec(ctx, fmt.Sprintf(`UPDATE %s SET "delivery_starts" = max("delivery_starts" - 1, 0), "lease_until" = NULL, "leased_by" = NULL WHERE "sequence" IN (SELECT value FROM json_each($1)) AND %s`,
				t, fence), dialect.JSONList(m.Abandoned), m.Token); err != nil {
				return err
			}
		}
		return nil
	})
	return out, err
}

// TakeBack implements dialect.Dialect.
func (Dialect) TakeBack(ctx context.Context, ex dialect.Executor, t *dialect.Table, name, tokenPrefix string) (int64, error) {
	hex := strings.Repeat("[0-9a-f]", 12)
	q := fmt.Sprintf(`UPDATE %s SET "lease_until" = NULL, "leased_by" = NULL
WHERE "published_at" IS NULL AND "dead_lettered_at" IS NULL AND "lease_until" > $3
AND substr("leased_by", 1, length($1)) = $1 AND substr("leased_by", 1, length($2)) <> $2
AND substr("leased_by", length($1) + 1) GLOB '%s#[0-9]*' AND substr("leased_by", length($1) + 15) NOT GLOB '*[^0-9]*'`, quote(t), hex)
	return execInTurn(ctx, ex, q, name, tokenPrefix, micros(time.Now()))
}
