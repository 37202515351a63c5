package mysql

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/watermill-outbox/outbox/internal/dialect"
)

// A claim leases each key's run from its head with ranks, and unordered events with rank 0;
// a second claim finds them leased.
func TestClaimRunsAndRanks(t *testing.T) {
	tb := newTable(t, withExtra(dialect.Column{Name: "tenant", Type: "VARCHAR(10) NULL"}, dialect.Column{Name: "n", Type: "INT NULL"}))
	rows := []dialect.InsertRow{ev("t", `1`, "a", ""), ev("t", `2`, "b", ""), ev("t", `3`, "", ""), ev("t", `4`, "a", ""), ev("t", `5`, "a", ""), ev("t", `6`, "b", ""), ev("t", `7`, "", "")}
	rows[0].Headers = `{"h":"1"}`
	rows[0].Extra = ptr(`{"tenant":"x","n":5}`)
	out, err := New().Insert(context.Background(), sqlEx(testDB), &dialect.InsertParams{Table: tb, Rows: rows, ExtraNames: []string{"n", "tenant"}})
	if err != nil {
		t.Fatal(err)
	}
	cfg := relayConfig(10, 2)
	r := New().NewRelay(tb, cfg, all)
	res := claim(t, r, cfg, "relay#000000000000#1")
	got := map[int64]int64{}
	for _, e := range res.Events {
		got[e.Sequence] = e.Rank
		if e.DeliveryStarts != 1 || e.Attempts != 0 || e.LastError != nil {
			t.Errorf("event %d: starts %d attempts %d last error %v", e.Sequence, e.DeliveryStarts, e.Attempts, e.LastError)
		}
	}
	s := func(i int) int64 { return out[i].Sequence }
	// MaxRunPerKey 2: a's third event waits.
	want := map[int64]int64{s(0): 1, s(1): 1, s(2): 0, s(3): 2, s(5): 2, s(6): 0}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("claimed ranks %v, want %v", got, want)
	}
	first := res.Events[slices.IndexFunc(res.Events, func(e dialect.Claimed) bool { return e.Sequence == s(0) })]
	if first.ID != rows[0].ID || first.Topic != "t" || string(first.Payload) != "1" || first.Headers != `{"h":"1"}` || *first.OrderingKey != "a" ||
		!reflect.DeepEqual(first.Extra, []any{"x", int64(5)}) && !reflect.DeepEqual(first.Extra, []any{"x", "5"}) {
		t.Errorf("claimed event %+v (extra %#v)", first, first.Extra)
	}
	if res.Walked != 2 {
		t.Errorf("Walked = %d, want 2", res.Walked)
	}
	var leased int64
	if err := testDB.QueryRow("SELECT COUNT(*) FROM " + namesOf(tb).table + " WHERE leased_by = 'relay#000000000000#1' AND lease_until > UTC_TIMESTAMP(6) + INTERVAL 50 SECOND").Scan(&leased); err != nil || leased != 6 {
		t.Errorf("leased rows %d, %v; want 6 with a minute's lease", leased, err)
	}
	if again := claim(t, r, cfg, "relay#000000000000#2"); len(again.Events) != 0 {
		t.Errorf("second claim leased %v, want nothing (a's third waits behind leased events)", seqsOf(again.Events))
	}
}

// Marks: acks publish, failures back off with the PostgreSQL formula on the database clock and
// dead-letter at MaxAttempts or when permanent, releases and unavailable keep attempts; a mark
// under another token writes nothing.
func TestMark(t *testing.T) {
	tb := newTable(t)
	out := mustInsert(t, tb, ev("t", `1`, "", ""), ev("t", `2`, "", ""), ev("t", `3`, "", ""), ev("t", `4`, "", ""), ev("t", `5`, "", ""), ev("t", `6`, "", ""))
	cfg := relayConfig(10, 10)
	r := New().NewRelay(tb, cfg, all)
	ctx := context.Background()
	res := claim(t, r, cfg, "tok1")
	if len(res.Events) != 6 {
		t.Fatalf("claimed %d", len(res.Events))
	}
	s := func(i int) int64 { return out[i].Sequence }
	exec(t, "UPDATE "+namesOf(tb).table+" SET attempts = 2 WHERE sequence = ?", s(4)) // the next failure is its third
	// A stale token writes nothing.
	if mr, err := r.Mark(ctx, sqlEx(testDB), &dialect.MarkParams{Token: "tok0", Acked: []int64{s(0)}}); err != nil || len(mr) != 0 {
		t.Fatalf("mark under a stale token: %+v, %v", mr, err)
	}
	mr, err := r.Mark(ctx, sqlEx(testDB), &dialect.MarkParams{Token: "tok1",
		Acked: []int64{s(0)}, Released: []int64{s(1)}, Unavailable: []int64{s(2)}, Notes: []string{"unavailable: down"}, Keep: []bool{true},
		Failed: []int64{s(3), s(4), s(5)}, Errs: []string{"boom", "third", "perm"}, Perm: []bool{false, false, true}, Jitters: []float64{1.1, 1, 1}})
	if err != nil {
		t.Fatal(err)
	}
	if len(mr) != 6 {
		t.Fatalf("%d results: %+v", len(mr), mr)
	}
	now := mr[0].Now
	by := map[int64]dialect.MarkResult{}
	for _, m := range mr {
		if !m.Now.Equal(now) {
			t.Errorf("result %d has clock %v, want %v", m.Seq, m.Now, now)
		}
		by[m.Seq] = m
	}
	if d := time.Since(now); d < -5*time.Second || d > 5*time.Second {
		t.Errorf("mark clock %v far from now", now)
	}
	if m := by[s(3)]; m.Attempts != 1 || m.Dead || m.Next == nil || !m.Next.Equal(now.Add(backoff(time.Second, 10*time.Second, 0, 1.1))) {
		t.Errorf("first failure: %+v, want attempts 1, next = now + 1.1 s", m)
	}
	var stored time.Time
	if err := testDB.QueryRow("SELECT next_attempt_at FROM "+namesOf(tb).table+" WHERE sequence = ?", s(3)).Scan((*dbTime)(&stored)); err != nil || by[s(3)].Next == nil || !stored.Equal(*by[s(3)].Next) {
		t.Errorf("stored next_attempt_at %v (%v), want the result's %v", stored, err, by[s(3)].Next)
	}
	if m := by[s(4)]; m.Attempts != 3 || !m.Dead || m.Next != nil {
		t.Errorf("third failure: %+v, want dead at MaxAttempts 3", m)
	}
	if m := by[s(5)]; m.Attempts != 1 || !m.Dead || m.Next != nil {
		t.Errorf("permanent failure: %+v, want dead", m)
	}
	type rowState struct {
		published, dead, leased bool
		attempts, starts        int
		lastError, class        string
	}
	state := func(seq int64) rowState {
		var st rowState
		var le, lc *string
		err := testDB.QueryRow("SELECT published_at IS NOT NULL, dead_lettered_at IS NOT NULL, leased_by IS NOT NULL OR lease_until IS NOT NULL, attempts, delivery_starts, last_error, last_error_class FROM "+namesOf(tb).table+" WHERE sequence = ?", seq).
			Scan(&st.published, &st.dead, &st.leased, &st.attempts, &st.starts, &le, &lc)
		if err != nil {
			t.Fatal(err)
		}
		if le != nil {
			st.lastError = *le
		}
		if lc != nil {
			st.class = *lc
		}
		return st
	}
	wants := []rowState{
		{published: true},
		{},
		{starts: 1, lastError: "unavailable: down", class: "not_attempted"},
		{attempts: 1, lastError: "boom", class: "failure"},
		{dead: true, attempts: 3, lastError: "third", class: "failure"},
		{dead: true, attempts: 1, lastError: "perm", class: "permanent"},
	}
	for i, w := range wants {
		if got := state(s(i)); got != w {
			t.Errorf("event %d: %+v, want %+v", i, got, w)
		}
	}
	// A second mark of the same batch writes nothing (the fence).
	if mr, err := r.Mark(ctx, sqlEx(testDB), &dialect.MarkParams{Token: "tok1", Acked: []int64{s(0), s(1)}}); err != nil || len(mr) != 0 {
		t.Errorf("repeated mark: %+v, %v", mr, err)
	}
	// Abandoned: released, the start uncounted.
	res = claim(t, r, cfg, "tok2")
	if !slices.Equal(seqsOf(res.Events), []int64{s(1), s(2)}) {
		t.Fatalf("claim after marks: %v, want %v (the retry is not due)", seqsOf(res.Events), []int64{s(1), s(2)})
	}
	if _, err := r.Mark(ctx, sqlEx(testDB), &dialect.MarkParams{Token: "tok2", Abandoned: []int64{s(1), s(2)}}); err != nil {
		t.Fatal(err)
	}
	if got := state(s(2)); got.starts != 1 || got.leased {
		t.Errorf("abandoned: %+v, want starts back to 1, not leased", got)
	}
}

// A key is claimable only when its head is: a head backing off, leased or dead-lettered holds
// the key's later events; unordered events never wait.
func TestClaimKeyOrder(t *testing.T) {
	tb := newTable(t)
	out := mustInsert(t, tb, ev("t", `1`, "a", ""), ev("t", `2`, "a", ""), ev("t", `3`, "b", ""), ev("t", `4`, "b", ""), ev("t", `5`, "c", ""), ev("t", `6`, "c", ""), ev("t", `7`, "", ""))
	s := func(i int) int64 { return out[i].Sequence }
	table := namesOf(tb).table
	exec(t, "UPDATE "+table+" SET attempts = 1, next_attempt_at = UTC_TIMESTAMP(6) + INTERVAL 1 HOUR WHERE sequence = ?", s(0))
	exec(t, "UPDATE "+table+" SET dead_lettered_at = UTC_TIMESTAMP(6), attempts = 3 WHERE sequence = ?", s(2))
	exec(t, "UPDATE "+table+" SET leased_by = 'other', lease_until = UTC_TIMESTAMP(6) + INTERVAL 1 HOUR WHERE sequence = ?", s(4))
	cfg := relayConfig(10, 10)
	r := New().NewRelay(tb, cfg, all)
	res := claim(t, r, cfg, "t1")
	if !slices.Equal(seqsOf(res.Events), []int64{s(6)}) {
		t.Fatalf("claimed %v, want only the unordered %d", seqsOf(res.Events), s(6))
	}
	// The walk saw three keys (their second events are claimable), none with its head.
	if res.Walked != 3 {
		t.Errorf("Walked = %d, want 3", res.Walked)
	}
	// Retry the dead head: b's run goes; publish a's head: a's second goes; c's lease expires.
	exec(t, "UPDATE "+table+" SET dead_lettered_at = NULL, attempts = 0 WHERE sequence = ?", s(2))
	exec(t, "UPDATE "+table+" SET published_at = UTC_TIMESTAMP(6), outbox_key = NULL WHERE sequence = ?", s(0))
	exec(t, "UPDATE "+table+" SET lease_until = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND WHERE sequence = ?", s(4))
	res = claim(t, r, cfg, "t2")
	want := map[int64]int64{s(1): 1, s(2): 1, s(3): 2, s(4): 1, s(5): 2}
	got := map[int64]int64{}
	for _, e := range res.Events {
		got[e.Sequence] = e.Rank
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("claimed %v, want %v", got, want)
	}
}

// Keys whose claimable head sits behind a walk full of other keys' held events are reached by
// the key skip scan, KeyScan keys per claim from the cursor, which reports where it stopped.
func TestClaimSkipScan(t *testing.T) {
	tb := newTable(t)
	var rows []dialect.InsertRow
	for i := 0; i < 30; i++ { // 30 keys whose heads back off, each with 3 claimable successors
		k := fmt.Sprintf("k%02d", i)
		rows = append(rows, ev("t", `1`, k, ""), ev("t", `1`, k, ""), ev("t", `1`, k, ""), ev("t", `1`, k, ""))
	}
	rows = append(rows, ev("t", `2`, "z", ""))
	out := mustInsert(t, tb, rows...)
	table := namesOf(tb).table
	exec(t, "UPDATE "+table+" o JOIN (SELECT MIN(sequence) AS s FROM "+table+" WHERE ordering_key LIKE 'k%' GROUP BY ordering_key) h ON o.sequence = h.s SET o.attempts = 1, o.next_attempt_at = UTC_TIMESTAMP(6) + INTERVAL 1 HOUR")
	cfg := relayConfig(10, 10)
	cfg.KeyScan = 12
	r := New().NewRelay(tb, cfg, all)
	cursor := ""
	var scans []string
	for i := 0; i < 3; i++ {
		res, err := r.Claim(context.Background(), sqlEx(testDB), &dialect.ClaimParams{Token: fmt.Sprint("s", i), Limit: 10, Oldest: 10, Cursor: cursor})
		if err != nil {
			t.Fatal(err)
		}
		if res.Cursor == nil || res.Scanned == nil {
			t.Fatalf("claim %d: no skip scan report", i)
		}
		scans = append(scans, fmt.Sprintf("%s/%d", *res.Cursor, *res.Scanned))
		if res.Walked != 4 { // 10 walked events: 3 of k00, 3 of k01, 3 of k02, 1 of k03
			t.Errorf("claim %d: Walked = %d, want 4", i, res.Walked)
		}
		if i < 2 && len(res.Events) != 0 {
			t.Fatalf("claim %d leased %v", i, seqsOf(res.Events))
		}
		if i == 2 {
			if !slices.Equal(seqsOf(res.Events), []int64{out[len(out)-1].Sequence}) || res.Events[0].Rank != 1 {
				t.Fatalf("claim %d leased %+v, want z's head", i, res.Events)
			}
		}
		cursor = *res.Cursor
	}
	if want := []string{"k11/12", "k23/12", "z/7"}; !slices.Equal(scans, want) {
		t.Fatalf("skip scans %v, want %v", scans, want)
	}
}

// Paused topics are left out; a probe claims at most one event of its topics.
func TestClaimPausedAndProbe(t *testing.T) {
	tb := newTable(t)
	out := mustInsert(t, tb, ev("down", `1`, "", ""), ev("down", `2`, "k", ""), ev("up", `3`, "", ""), ev("up", `4`, "j", ""))
	cfg := relayConfig(10, 10)
	r := New().NewRelay(tb, cfg, all)
	ctx := context.Background()
	res, err := r.Claim(ctx, sqlEx(testDB), &dialect.ClaimParams{Token: "p1", Limit: 10, Oldest: 10, Paused: []string{"down"}})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(seqsOf(res.Events), []int64{out[2].Sequence, out[3].Sequence}) {
		t.Fatalf("claim with down paused: %v", seqsOf(res.Events))
	}
	res, err = r.Claim(ctx, sqlEx(testDB), &dialect.ClaimParams{Token: "p2", Limit: 10, Oldest: 10, Probe: []string{"down"}})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(seqsOf(res.Events), []int64{out[0].Sequence}) {
		t.Fatalf("probe: %v, want the oldest event of down only", seqsOf(res.Events))
	}
	// A topic selection: a prefix, minus an exact name; '_' is an ordinary character.
	tb2 := newTable(t)
	out2 := mustInsert(t, tb2, ev("lib.a", `1`, "", ""), ev("lib.b", `1`, "", ""), ev("libxc", `1`, "", ""), ev("lib_d", `1`, "", ""))
	sel := dialect.TopicSelection{Include: dialect.Topic{Prefix: true, Value: "lib."}, Excludes: []dialect.Topic{{Value: "lib.b"}}}
	r2 := New().NewRelay(tb2, cfg, sel)
	if res := claim(t, r2, cfg, "sel"); !slices.Equal(seqsOf(res.Events), []int64{out2[0].Sequence}) {
		t.Fatalf("selection claimed %v, want only lib.a", seqsOf(res.Events))
	}
	r3 := New().NewRelay(tb2, cfg, dialect.TopicSelection{Include: dialect.Topic{Prefix: true, Value: "lib_"}})
	if res := claim(t, r3, cfg, "sel2"); !slices.Equal(seqsOf(res.Events), []int64{out2[3].Sequence}) {
		t.Fatalf("prefix lib_ claimed %v, want only lib_d", seqsOf(res.Events))
	}
}

func TestRenewAndTakeBack(t *testing.T) {
	tb := newTable(t)
	out := mustInsert(t, tb, ev("t", `1`, "", ""), ev("t", `2`, "", ""), ev("t", `3`, "", ""))
	cfg := relayConfig(2, 2)
	r := New().NewRelay(tb, cfg, all)
	ctx := context.Background()
	old := claim(t, r, cfg, "relay#0123456789ab#7") // an earlier process of this relay name
	mine := claim(t, r, cfg, "relay#aaaaaaaaaaaa#1")
	if len(old.Events) != 2 || len(mine.Events) != 1 {
		t.Fatalf("claims %v, %v", seqsOf(old.Events), seqsOf(mine.Events))
	}
	table := namesOf(tb).table
	exec(t, "UPDATE "+table+" SET lease_until = UTC_TIMESTAMP(6) + INTERVAL 1 SECOND")
	n, err := r.Renew(ctx, sqlEx(testDB), "relay#0123456789ab#7", []int64{out[0].Sequence, out[1].Sequence, out[2].Sequence})
	if err != nil || n != 2 {
		t.Fatalf("Renew = %d, %v; want 2 (the third is another token's)", n, err)
	}
	if c := queryInt64s(t, "SELECT COUNT(*) FROM "+table+" WHERE lease_until > UTC_TIMESTAMP(6) + INTERVAL 50 SECOND")[0]; c != 2 {
		t.Fatalf("%d renewed leases, want 2", c)
	}
	// Another relay whose name starts alike keeps its lease; so does this relay's own.
	exec(t, "UPDATE "+table+" SET leased_by = 'relay2#0123456789ab#1' WHERE sequence = ?", out[1].Sequence)
	n, err = New().TakeBack(ctx, sqlEx(testDB), tb, "relay#", "relay#aaaaaaaaaaaa#")
	if err != nil || n != 1 {
		t.Fatalf("TakeBack = %d, %v; want 1", n, err)
	}
	if c := queryInt64s(t, "SELECT sequence FROM "+table+" WHERE leased_by IS NULL AND lease_until IS NULL"); !slices.Equal(c, []int64{out[0].Sequence}) {
		t.Fatalf("released %v, want %d", c, out[0].Sequence)
	}
}

// A continuation leases a key's next run while the previous run's events are still leased
// under ContToken with a third of LeaseDuration left, or once their marks landed; not under
// another token, nor when that lease is about to expire. The new run is ranked from 1.
func TestClaimContinuation(t *testing.T) {
	tb := newTable(t)
	out := mustInsert(t, tb, ev("t", `1`, "a", ""), ev("t", `2`, "a", ""), ev("t", `3`, "a", ""), ev("t", `4`, "a", ""),
		ev("t", `5`, "a", ""), ev("t", `6`, "a", ""), ev("t", `7`, "b", ""))
	s := func(i int) int64 { return out[i].Sequence }
	table := namesOf(tb).table
	cfg := relayConfig(10, 3)
	r := New().NewRelay(tb, cfg, all)
	ctx := context.Background()
	if got := seqsOf(claim(t, r, cfg, "tok1").Events); !slices.Equal(sorted(got), []int64{s(0), s(1), s(2), s(6)}) {
		t.Fatalf("first claim leased %v", got)
	}
	cont := []dialect.Continuation{{Key: "a", From: s(0), After: s(2)}}
	contClaim := func(token, contToken string) map[int64]int64 {
		t.Helper()
		res, err := r.Claim(ctx, sqlEx(testDB), &dialect.ClaimParams{Token: token, Limit: 10, Oldest: 10, Cont: cont, ContToken: contToken})
		if err != nil {
			t.Fatal(err)
		}
		got := map[int64]int64{}
		for _, e := range res.Events {
			got[e.Sequence] = e.Rank
		}
		return got
	}
	if got := contClaim("x1", "other"); len(got) != 0 {
		t.Fatalf("continuation under another token leased %v", got)
	}
	exec(t, "UPDATE "+table+" SET lease_until = UTC_TIMESTAMP(6) + INTERVAL 5 SECOND WHERE leased_by = 'tok1'")
	if got := contClaim("x2", "tok1"); len(got) != 0 {
		t.Fatalf("continuation of a lease about to expire leased %v", got)
	}
	exec(t, "UPDATE "+table+" SET lease_until = UTC_TIMESTAMP(6) + INTERVAL 1 MINUTE WHERE leased_by = 'tok1'")
	if got, want := contClaim("tok2", "tok1"), map[int64]int64{s(3): 1, s(4): 2, s(5): 3}; !reflect.DeepEqual(got, want) {
		t.Fatalf("continuation leased %v, want %v", got, want)
	}
	// The marks of both runs land; a continuation after them needs no token.
	more := mustInsert(t, tb, ev("t", `8`, "a", ""), ev("t", `9`, "a", ""))
	for tok, seqs := range map[string][]int64{"tok1": {s(0), s(1), s(2), s(6)}, "tok2": {s(3), s(4), s(5)}} {
		if _, err := r.Mark(ctx, sqlEx(testDB), &dialect.MarkParams{Token: tok, Acked: seqs}); err != nil {
			t.Fatal(err)
		}
	}
	cont = []dialect.Continuation{{Key: "a", From: s(3), After: s(5)}}
	if got, want := contClaim("tok3", "nobody"), map[int64]int64{more[0].Sequence: 1, more[1].Sequence: 2}; !reflect.DeepEqual(got, want) {
		t.Fatalf("continuation after the marks leased %v, want %v", got, want)
	}
}

func sorted(s []int64) []int64 { s = slices.Clone(s); slices.Sort(s); return s }
