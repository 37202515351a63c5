package memory

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"testing"
	"testing/synctest"
	"time"

	"github.com/watermill-outbox/outbox/internal/dialect"
)

var (
	ctx = context.Background()
	tbl = &dialect.Table{Parts: []string{"outbox"}}
	cfg = dialect.RelayConfig{BatchSize: 10, MaxRunPerKey: 2, LeaseDuration: 30 * time.Second, MaxAttempts: 3,
		RetryBase: time.Second, RetryMax: 3 * time.Second}
	all = dialect.TopicSelection{Include: dialect.Topic{All: true}}
)

// insert writes one event per spec "topic/key" ("topic/" for unordered).
func insert(t *testing.T, d *DB, specs ...string) {
	t.Helper()
	var rows []dialect.InsertRow
	for i, s := range specs {
		var topic, key string
		if _, err := fmt.Sscanf(s, "%s", &topic); err != nil {
			t.Fatal(err)
		}
		r := dialect.InsertRow{ID: fmt.Sprint("e", len(d.Rows())+i+1), Headers: "{}", Payload: []byte("{}")}
		for j := range s {
			if s[j] == '/' {
				topic, key = s[:j], s[j+1:]
			}
		}
		r.Topic = topic
		if key != "" {
			r.OrderingKey = &key
		}
		rows = append(rows, r)
	}
	if _, err := d.Insert(ctx, &Executor{}, &dialect.InsertParams{Table: tbl, Rows: rows}); err != nil {
		t.Fatal(err)
	}
}

// claimed returns "seq:rank" of each leased event.
func claimed(t *testing.T, r dialect.Relay, ex dialect.Executor, p *dialect.ClaimParams) []string {
	t.Helper()
	if p.Oldest == 0 {
		p.Oldest = 10
	}
	res, err := r.Claim(ctx, ex, p)
	if err != nil {
		t.Fatal(err)
	}
	out := []string{}
	for _, e := range res.Events {
		out = append(out, fmt.Sprintf("%d:%d", e.Sequence, e.Rank))
	}
	return out
}

func eq(t *testing.T, what string, got, want any) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%s: got %v, want %v", what, got, want)
	}
}

func TestClaimRunsInKeyOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := New()
		insert(t, d, "a/k1", "a/k1", "a/", "b/k2", "a/k1")
		r, ex := d.NewRelay(tbl, cfg, all), &Executor{}
		eq(t, "claim A", claimed(t, r, ex, &dialect.ClaimParams{Token: "A", Limit: 10}), []string{"1:1", "2:2", "3:0", "4:1"})
		rows := d.Rows()
		now := time.Now()
		for _, x := range rows[:4] {
			eq(t, fmt.Sprint("lease of ", x.Sequence), []any{x.LeasedBy, x.LeaseUntil, x.DeliveryStarts}, []any{"A", now.Add(30 * time.Second), 1})
		}
		eq(t, "row 5 untouched", []any{rows[4].LeasedBy, rows[4].DeliveryStarts}, []any{"", 0})
		// k1's head is leased by A: nothing of k1 (not even row 5) goes to B.
		eq(t, "claim B", claimed(t, r, ex, &dialect.ClaimParams{Token: "B", Limit: 10}), []string{})
		// Row 1 released, row 2 still leased: B gets k1's head alone (the run stops at the gap).
		res, err := r.Mark(ctx, ex, &dialect.MarkParams{Token: "A", Released: []int64{1}})
		eq(t, "release", []any{len(res), err}, []any{1, error(nil)})
		eq(t, "claim B after release", claimed(t, r, ex, &dialect.ClaimParams{Token: "B", Limit: 10}), []string{"1:1"})
		eq(t, "row 1", []any{d.Rows()[0].LeasedBy, d.Rows()[0].DeliveryStarts}, []any{"B", 1})
	})
}

func TestClaimLimitProbePausedAndUnranked(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := New(WithCapabilities(dialect.Capabilities{}))
		insert(t, d, "a/k1", "b/k2", "a/", "b/", "a/k1")
		r, ex := d.NewRelay(tbl, cfg, all), &Executor{}
		eq(t, "probe b", claimed(t, r, ex, &dialect.ClaimParams{Token: "P", Probe: []string{"b"}}), []string{"2:-1"})
		eq(t, "paused b, limit 1", claimed(t, r, ex, &dialect.ClaimParams{Token: "A", Limit: 1, Paused: []string{"b"}}), []string{"1:-1", "3:-1"})
		excl := d.NewRelay(tbl, cfg, dialect.TopicSelection{Include: dialect.Topic{All: true}, Excludes: []dialect.Topic{{Value: "a"}}})
		eq(t, "excluding a", claimed(t, excl, ex, &dialect.ClaimParams{Token: "B", Limit: 10}), []string{"4:-1"})
	})
}

func TestMarkIsFencedByToken(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := New()
		insert(t, d, "a/k1", "a/k1")
		r, ex := d.NewRelay(tbl, cfg, all), &Executor{}
		eq(t, "claim A", claimed(t, r, ex, &dialect.ClaimParams{Token: "A", Limit: 10}), []string{"1:1", "2:2"})
		time.Sleep(30*time.Second + time.Microsecond)
		n, _ := r.Renew(ctx, ex, "B", []int64{1, 2})
		eq(t, "renew under another token", n, int64(0))
		eq(t, "claim B after the lease", claimed(t, r, ex, &dialect.ClaimParams{Token: "B", Limit: 10}), []string{"1:1", "2:2"})
		n, _ = r.Renew(ctx, ex, "A", []int64{1, 2})
		eq(t, "renew A", n, int64(0))
		res, err := r.Mark(ctx, ex, &dialect.MarkParams{Token: "A", Acked: []int64{1}, Failed: []int64{2}, Errs: []string{"x"},
			Perm: []bool{false}, Jitters: []float64{1}})
		eq(t, "A's marks", []any{len(res), err}, []any{0, error(nil)})
		rows := d.Rows()
		eq(t, "rows after A's marks", []any{rows[0].PublishedAt.IsZero(), rows[1].Attempts, rows[0].LeasedBy, rows[0].DeliveryStarts}, []any{true, 0, "B", 2})
		res, _ = r.Mark(ctx, ex, &dialect.MarkParams{Token: "B", Acked: []int64{1, 2}})
		eq(t, "B's acks", len(res), 2)
		rows = d.Rows()
		eq(t, "published", []any{rows[0].PublishedAt, rows[1].PublishedAt, rows[0].LeasedBy, rows[0].DeliveryStarts}, []any{time.Now(), time.Now(), "", 0})
	})
}

func TestFailureRetriesThenDeadLetters(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := New()
		insert(t, d, "a/k1", "a/k1", "a/", "a/", "a/")
		r, ex := d.NewRelay(tbl, cfg, all), &Executor{}
		fail := func(tok string, seq int64, jitter float64, perm bool) dialect.MarkResult {
			t.Helper()
			res, err := r.Mark(ctx, ex, &dialect.MarkParams{Token: tok, Failed: []int64{seq}, Errs: []string{"boom"}, Perm: []bool{perm}, Jitters: []float64{jitter}})
			if err != nil || len(res) != 1 {
				t.Fatalf("fail %d: %v %v", seq, res, err)
			}
			return res[0]
		}
		eq(t, "claim 1", claimed(t, r, ex, &dialect.ClaimParams{Token: "A", Limit: 10}), []string{"1:1", "2:2", "3:0", "4:0", "5:0"})
		_, _ = r.Mark(ctx, ex, &dialect.MarkParams{Token: "A", Released: []int64{2}, Unavailable: []int64{3, 4}, Notes: []string{"down", "lost"},
			Keep: []bool{false, true}, Abandoned: []int64{5}})
		start := time.Now()
		m := fail("A", 1, 1.1, false)
		eq(t, "first failure", []any{m.Attempts, *m.Next, m.Dead}, []any{1, start.Add(1100 * time.Millisecond), false})
		rows := d.Rows()
		eq(t, "unavailable", []any{rows[2].Attempts, *rows[2].LastError, rows[2].LastErrorClass, rows[2].DeliveryStarts}, []any{0, "down", dialect.ClassUnavailable, 0})
		eq(t, "not attempted", []any{rows[3].Attempts, rows[3].LastErrorClass, rows[3].DeliveryStarts}, []any{0, dialect.ClassNotAttempted, 1})
		eq(t, "abandoned", []any{rows[4].LeasedBy, rows[4].DeliveryStarts}, []any{"", 0})
		// The head waits for its retry, and its key's later event behind it.
		eq(t, "claim while retrying", claimed(t, r, ex, &dialect.ClaimParams{Token: "B", Limit: 10}), []string{"3:0", "4:0", "5:0"})
		time.Sleep(1100 * time.Millisecond)
		eq(t, "claim when due", claimed(t, r, ex, &dialect.ClaimParams{Token: "C", Limit: 10}), []string{"1:1", "2:2"})
		m = fail("C", 1, 1, false)
		_, _ = r.Mark(ctx, ex, &dialect.MarkParams{Token: "C", Released: []int64{2}})
		eq(t, "second failure", []any{m.Attempts, *m.Next}, []any{2, time.Now().Add(2 * time.Second)})
		time.Sleep(2 * time.Second)
		eq(t, "claim again", claimed(t, r, ex, &dialect.ClaimParams{Token: "D", Limit: 10}), []string{"1:1", "2:2"})
		m = fail("D", 1, 1, false)
		eq(t, "third failure: dead", []any{m.Attempts, m.Next, m.Dead}, []any{3, (*time.Time)(nil), true})
		rows = d.Rows()
		eq(t, "dead row", []any{rows[0].DeadLetteredAt, rows[0].NextAttemptAt.IsZero(), rows[0].LastErrorClass}, []any{time.Now(), true, dialect.ClassFailure})
		_, _ = r.Mark(ctx, ex, &dialect.MarkParams{Token: "D", Released: []int64{2}})
		time.Sleep(time.Hour)
		eq(t, "key behind its dead head", claimed(t, r, ex, &dialect.ClaimParams{Token: "E", Limit: 10}), []string{"3:0", "4:0", "5:0"})
		n, _ := d.RetryDead(ctx, ex, tbl, dialect.DeadFilter{Topics: []dialect.Topic{{Value: "a"}}})
		eq(t, "retried", n, int64(1))
		eq(t, "claim after retry", claimed(t, r, ex, &dialect.ClaimParams{Token: "F", Limit: 10}), []string{"1:1", "2:2"})
		m = fail("F", 2, 1, true)
		eq(t, "permanent", []any{m.Attempts, m.Dead, d.Rows()[1].LastErrorClass}, []any{1, true, dialect.ClassPermanent})
	})
}

func TestContinuation(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := New()
		insert(t, d, "a/k", "a/k", "a/k", "a/k", "a/k")
		r, ex := d.NewRelay(tbl, cfg, all), &Executor{}
		eq(t, "first run", claimed(t, r, ex, &dialect.ClaimParams{Token: "A", Limit: 10}), []string{"1:1", "2:2"})
		cont := []dialect.Continuation{{Key: "k", From: 1, After: 2}}
		eq(t, "another token's run", claimed(t, r, ex, &dialect.ClaimParams{Token: "B", Limit: 10, Cont: cont, ContToken: "X"}), []string{})
		eq(t, "continued", claimed(t, r, ex, &dialect.ClaimParams{Token: "B", Limit: 10, Cont: cont, ContToken: "A"}), []string{"3:1", "4:2"})
		time.Sleep(21 * time.Second) // A's lease has less than a third of LeaseDuration left
		cont = []dialect.Continuation{{Key: "k", From: 3, After: 4}}
		eq(t, "short lease", claimed(t, r, ex, &dialect.ClaimParams{Token: "C", Limit: 10, Cont: cont, ContToken: "B"}), []string{})
		_, _ = r.Mark(ctx, ex, &dialect.MarkParams{Token: "A", Acked: []int64{1, 2}})
		_, _ = r.Mark(ctx, ex, &dialect.MarkParams{Token: "B", Acked: []int64{3, 4}})
		eq(t, "marks landed", claimed(t, r, ex, &dialect.ClaimParams{Token: "C", Limit: 10, Cont: cont, ContToken: "B"}), []string{"5:1"})
	})
}

func TestTakeBackMatchesTokenShape(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := New()
		insert(t, d, "a/", "a/", "a/", "a/", "a/", "a/")
		one := cfg
		one.BatchSize = 1
		r, ex := d.NewRelay(tbl, one, all), &Executor{}
		tokens := []string{"relay#0123456789ab#1", "relay#0123456789ab#x", "relay2#0123456789ab#1", "relay#ffffffffffff#7", "relay#0123456789ab#2", "relay#0123456789a#3"}
		for _, tok := range tokens {
			_ = claimed(t, r, ex, &dialect.ClaimParams{Token: tok, Limit: 1})
		}
		time.Sleep(20 * time.Second)
		for i, tok := range tokens[1:] {
			if n, _ := r.Renew(ctx, ex, tok, []int64{int64(i + 2)}); n != 1 {
				t.Fatalf("renew %s: %d", tok, n)
			}
		}
		time.Sleep(11 * time.Second) // only the first lease expired
		n, err := d.TakeBack(ctx, ex, tbl, "relay#", "relay#ffffffffffff#")
		eq(t, "taken back", []any{n, err}, []any{int64(1), error(nil)})
		var by []string
		for _, x := range d.Rows() {
			by = append(by, x.LeasedBy)
		}
		eq(t, "leases", by, []string{"relay#0123456789ab#1", "relay#0123456789ab#x", "relay2#0123456789ab#1", "relay#ffffffffffff#7", "", "relay#0123456789a#3"})
	})
}

func TestKillAndHook(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		boom := errors.New("boom")
		var seen []string
		d := New(WithHook(func(op Op, after bool, _ dialect.Executor) error {
			seen = append(seen, fmt.Sprint(op, after))
			if op == OpMark && after {
				return boom
			}
			return nil
		}))
		insert(t, d, "a/", "a/")
		one := cfg
		one.BatchSize = 1
		r, ex := d.NewRelay(tbl, one, all), &Executor{}
		eq(t, "claim", claimed(t, r, ex, &dialect.ClaimParams{Token: "A", Limit: 1}), []string{"1:0"})
		_, err := r.Mark(ctx, ex, &dialect.MarkParams{Token: "A", Acked: []int64{1}})
		eq(t, "mark's lost answer", err, boom)
		eq(t, "written anyway", d.Rows()[0].PublishedAt, time.Now())
		ex.Kill()
		_, err = r.Claim(ctx, ex, &dialect.ClaimParams{Token: "A", Limit: 1})
		eq(t, "killed", err, ErrKilled)
		eq(t, "nothing leased", d.Rows()[1].LeasedBy, "")
		eq(t, "hook calls", seen, []string{"claimfalse", "claimtrue", "markfalse", "marktrue", "claimfalse"})
	})
}

func TestOperations(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := New()
		insert(t, d, "a/k", "a/k", "b/", "b/")
		r, ex := d.NewRelay(tbl, cfg, all), &Executor{}
		_ = claimed(t, r, ex, &dialect.ClaimParams{Token: "A", Limit: 10})
		_, _ = r.Mark(ctx, ex, &dialect.MarkParams{Token: "A", Failed: []int64{1}, Errs: []string{"x"}, Perm: []bool{true}, Jitters: []float64{1},
			Released: []int64{2}, Acked: []int64{3}, Unavailable: []int64{4}, Notes: []string{"down"}, Keep: []bool{false}})
		b, _ := d.Backlog(ctx, ex, tbl)
		eq(t, "backlog", []int64{b.Pending, b.DeadLettered, b.Held, b.Unavailable}, []int64{2, 1, 1, 1})
		bt, _ := d.BacklogByTopic(ctx, ex, tbl)
		eq(t, "topics", len(bt), 2)
		f := dialect.DeadFilter{Topics: []dialect.Topic{{Prefix: true, Value: "a"}}}
		n, _ := d.CountDead(ctx, ex, tbl, f)
		eq(t, "dead", n, int64(1))
		l, _ := d.ListDead(ctx, ex, tbl, f, 10)
		eq(t, "listed", []any{len(l), l[0].Sequence}, []any{1, int64(1)})
		time.Sleep(time.Minute)
		n, _ = d.CountOlder(ctx, ex, tbl, "published_at", 30*time.Second)
		eq(t, "older", n, int64(1))
		n, _ = d.Cleanup(ctx, ex, tbl, "published_at", 30*time.Second, 10)
		eq(t, "cleaned", n, int64(1))
		n, _ = d.PurgeDead(ctx, ex, tbl, f)
		eq(t, "purged", []any{n, len(d.Rows())}, []any{int64(1), 2})
	})
}
