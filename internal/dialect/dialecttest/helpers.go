package dialecttest

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/watermill-outbox/outbox/internal/dialect"
)

// suite is one Run: the harness and the helpers every area shares. eager sets every claim's
// Eager and ReadFirst (SQLite's locking variants; other dialects ignore them).
type suite struct {
	h     Harness
	eager bool
}

// cfg is the relay configuration of the suite's relays: a long lease (expiry is simulated with
// At), three attempts, retries 1 s · 2^attempts capped at 10 s.
func cfg(batch, run int) dialect.RelayConfig {
	return dialect.RelayConfig{BatchSize: batch, MaxRunPerKey: run, KeyScan: 100, LeaseDuration: time.Minute,
		MaxAttempts: 3, RetryBase: time.Second, RetryMax: 10 * time.Second}
}

var all = dialect.TopicSelection{Include: dialect.Topic{All: true}}

// table returns a migrated fresh table (opts change its config first).
func (s *suite) table(t *testing.T, opts ...func(*dialect.Table)) *dialect.Table {
	t.Helper()
	tb := s.h.Table(t)
	for _, o := range opts {
		o(tb)
	}
	if err := s.h.Dialect.Migrate(context.Background(), s.h.Ex, tb); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	return tb
}

func (s *suite) inTx(ctx context.Context, fn func(dialect.Executor) error) error {
	if s.h.InTx != nil {
		return s.h.InTx(ctx, fn)
	}
	return dialect.WithTx(ctx, s.h.Ex, nil, fn)
}

// ev is an insert row with a fresh id; key and ikey "" are none.
func ev(topic, key, ikey string) dialect.InsertRow {
	r := dialect.InsertRow{ID: uuid.NewString(), Topic: topic, Payload: []byte(`{"n":1}`), Headers: `{"h":"v"}`}
	if key != "" {
		r.OrderingKey = &key
	}
	if ikey != "" {
		r.IdempotencyKey = &ikey
	}
	return r
}

// insertRes runs Insert in a transaction of its own.
func (s *suite) insertRes(t *testing.T, p *dialect.InsertParams) ([]dialect.Stored, error) {
	t.Helper()
	var out []dialect.Stored
	err := s.inTx(context.Background(), func(ex dialect.Executor) error {
		var err error
		out, err = s.h.Dialect.Insert(context.Background(), ex, p)
		return err
	})
	return out, err
}

// insert writes rows (none with an idempotency key) and returns their sequences in input order,
// read back by id.
func (s *suite) insert(t *testing.T, tb *dialect.Table, rows ...dialect.InsertRow) []int64 {
	t.Helper()
	if _, err := s.insertRes(t, &dialect.InsertParams{Table: tb, Rows: rows}); err != nil {
		t.Fatalf("Insert: %v", err)
	}
	bySeq := map[string]int64{}
	for _, r := range s.rows(t, tb) {
		bySeq[r.ID] = r.Seq
	}
	out := make([]int64, len(rows))
	for i, r := range rows {
		seq, ok := bySeq[r.ID]
		if !ok {
			t.Fatalf("row %d (%s) not stored", i, r.ID)
		}
		out[i] = seq
	}
	return out
}

// insertN writes n unordered events of topic "a" and returns their sequences.
func (s *suite) insertN(t *testing.T, tb *dialect.Table, n int) []int64 {
	t.Helper()
	rows := make([]dialect.InsertRow, n)
	for i := range rows {
		rows[i] = ev("a", "", "")
	}
	return s.insert(t, tb, rows...)
}

// row is one stored event's state as the suite reads it with its own SQL.
type row struct {
	Seq       int64
	ID, Topic string
	Key       *string
	Attempts  int64
	LastError *string
	Class     *string // last_error_class
	LeasedBy  *string
	Published bool
	Dead      bool
	Retry     bool // next_attempt_at is set
	Leased    bool // lease_until is in the future
	Starts    int64
}

func (r row) String() string {
	str := func(p *string) string {
		if p == nil {
			return "NULL"
		}
		return fmt.Sprintf("%q", *p)
	}
	return fmt.Sprintf("{seq %d topic %s key %s attempts %d err %s class %s by %s pub %v dead %v retry %v leased %v starts %d}",
		r.Seq, r.Topic, str(r.Key), r.Attempts, str(r.LastError), str(r.Class), str(r.LeasedBy), r.Published, r.Dead, r.Retry, r.Leased, r.Starts)
}

func flag(col string) string {
	return fmt.Sprintf(`CASE WHEN %q IS NULL THEN 0 ELSE 1 END`, col)
}

// rows reads every event of tb by sequence.
func (s *suite) rows(t *testing.T, tb *dialect.Table) []row {
	t.Helper()
	q := fmt.Sprintf(`SELECT "sequence", "id", "topic", "ordering_key", "attempts", "last_error", "last_error_class", "leased_by", %s, %s, %s,
	CASE WHEN "lease_until" IS NOT NULL AND "lease_until" > %s THEN 1 ELSE 0 END, "delivery_starts" FROM %s ORDER BY "sequence"`,
		flag("published_at"), flag("dead_lettered_at"), flag("next_attempt_at"), s.h.At(0), dialect.DoubleQuote(tb.Parts...))
	rs, err := s.h.Raw.Query(context.Background(), q)
	if err != nil {
		t.Fatalf("read rows: %v", err)
	}
	defer rs.Close()
	var out []row
	for rs.Next() {
		var r row
		var pub, dead, retry, leased int64
		if err := rs.Scan(&r.Seq, &r.ID, &r.Topic, &r.Key, &r.Attempts, &r.LastError, &r.Class, &r.LeasedBy, &pub, &dead, &retry, &leased, &r.Starts); err != nil {
			t.Fatalf("scan row: %v", err)
		}
		r.Published, r.Dead, r.Retry, r.Leased = pub == 1, dead == 1, retry == 1, leased == 1
		out = append(out, r)
	}
	if err := rs.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// get returns the row of seq.
func (s *suite) get(t *testing.T, tb *dialect.Table, seq int64) row {
	t.Helper()
	for _, r := range s.rows(t, tb) {
		if r.Seq == seq {
			return r
		}
	}
	t.Fatalf("no row %d", seq)
	return row{}
}

// exec runs the suite's own SQL: {t} is the quoted table.
func (s *suite) exec(t *testing.T, tb *dialect.Table, q string, args ...any) int64 {
	t.Helper()
	q = strings.ReplaceAll(q, "{t}", dialect.DoubleQuote(tb.Parts...))
	n, err := s.h.Raw.Exec(context.Background(), q, args...)
	if err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return n
}

// backdate moves column (a set time) of seqs d into the past from now.
func (s *suite) backdate(t *testing.T, tb *dialect.Table, column string, d time.Duration, seqs ...int64) {
	t.Helper()
	for _, seq := range seqs {
		if n := s.exec(t, tb, fmt.Sprintf(`UPDATE {t} SET %q = %s WHERE "sequence" = $1 AND %q IS NOT NULL`, column, s.h.At(-d), column), seq); n != 1 {
			t.Fatalf("backdate %s of %d: %d rows", column, seq, n)
		}
	}
}

// claim runs one claim of r with Limit and Oldest at batch.
func (s *suite) claim(t *testing.T, r dialect.Relay, batch int, token string) []dialect.Claimed {
	t.Helper()
	return s.claimP(t, r, &dialect.ClaimParams{Token: token, Limit: batch, Oldest: batch})
}

func (s *suite) claimP(t *testing.T, r dialect.Relay, p *dialect.ClaimParams) []dialect.Claimed {
	t.Helper()
	p.Eager, p.ReadFirst = s.eager, s.eager
	res, err := r.Claim(context.Background(), s.h.Ex, p)
	if err != nil {
		t.Fatalf("Claim %s: %v", p.Token, err)
	}
	return res.Events
}

// seqs returns the claimed sequences, sorted.
func seqs(evs []dialect.Claimed) []int64 {
	out := make([]int64, len(evs))
	for i, e := range evs {
		out[i] = e.Sequence
	}
	slices.Sort(out)
	return out
}

// wantSeqs fails t unless got holds exactly want (any order).
func wantSeqs(t *testing.T, what string, got []dialect.Claimed, want ...int64) {
	t.Helper()
	w := slices.Clone(want)
	slices.Sort(w)
	if g := seqs(got); !slices.Equal(g, w) && !(len(g) == 0 && len(w) == 0) {
		t.Fatalf("%s: claimed %v, want %v", what, g, w)
	}
}

// mark runs a Mark and returns its results by sequence.
func (s *suite) mark(t *testing.T, r dialect.Relay, p *dialect.MarkParams) map[int64]dialect.MarkResult {
	t.Helper()
	p.Eager = s.eager
	res, err := r.Mark(context.Background(), s.h.Ex, p)
	if err != nil {
		t.Fatalf("Mark %s: %v", p.Token, err)
	}
	out := map[int64]dialect.MarkResult{}
	for _, m := range res {
		if _, dup := out[m.Seq]; dup {
			t.Fatalf("Mark %s reported %d twice", p.Token, m.Seq)
		}
		out[m.Seq] = m
	}
	return out
}

// fail is a MarkParams failing seqs with err, jitter 1, permanently or not.
func fail(token string, perm bool, seqs ...int64) *dialect.MarkParams {
	p := &dialect.MarkParams{Token: token, Failed: seqs}
	for range seqs {
		p.Errs = append(p.Errs, "boom")
		p.Perm = append(p.Perm, perm)
		p.Jitters = append(p.Jitters, 1)
	}
	return p
}

func ptr[T any](v T) *T { return &v }

func strOf(p *string) string {
	if p == nil {
		return "<nil>"
	}
	return *p
}

// text returns a scanned column value as a string ([]byte or string).
func text(v any) string {
	switch x := v.(type) {
	case []byte:
		return string(x)
	case string:
		return x
	default:
		return fmt.Sprint(x)
	}
}

// expect fails t unless ok, except for a check the harness lists as a known deviation: that
// one is logged while it fails and fails once it passes.
func (s *suite) expect(t *testing.T, check string, ok bool, format string, args ...any) {
	t.Helper()
	why, known := s.h.Deviations[check]
	switch {
	case ok && known:
		t.Errorf("check %s passes: remove it from Harness.Deviations (%s)", check, why)
	case !ok && known:
		t.Logf("known deviation %s (%s): "+format, append([]any{check, why}, args...)...)
	case !ok:
		t.Fatalf(format, args...)
	}
}
