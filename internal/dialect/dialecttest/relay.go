package dialecttest

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/watermill-outbox/outbox/internal/dialect"
)

// claimFilters: exact, prefix, all, and excluded topics (exact and prefix); release gives the
// lease back.
func (s *suite) claimFilters(t *testing.T) {
	d := s.h.Dialect
	tb := s.table(t)
	seq := s.insert(t, tb, ev("lib.a", "", ""), ev("lib.b", "k", ""), ev("libx", "", ""), ev("other", "k2", ""), ev("other.sub", "", ""))
	exact := func(v string) dialect.Topic { return dialect.Topic{Value: v} }
	prefix := func(v string) dialect.Topic { return dialect.Topic{Prefix: true, Value: v} }
	cases := []struct {
		name string
		sel  dialect.TopicSelection
		want []int64
	}{
		{"exact", dialect.TopicSelection{Include: exact("libx")}, []int64{seq[2]}},
		{"prefix", dialect.TopicSelection{Include: prefix("lib.")}, []int64{seq[0], seq[1]}},
		{"all", all, seq},
		{"all minus exact", dialect.TopicSelection{Include: dialect.Topic{All: true}, Excludes: []dialect.Topic{exact("other")}}, []int64{seq[0], seq[1], seq[2], seq[4]}},
		{"prefix minus prefix and exact", dialect.TopicSelection{Include: prefix("lib"), Excludes: []dialect.Topic{prefix("lib."), exact("nothing")}}, []int64{seq[2]}},
		{"all minus two", dialect.TopicSelection{Include: dialect.Topic{All: true}, Excludes: []dialect.Topic{prefix("lib"), exact("other.sub")}}, []int64{seq[3]}},
	}
	for i, c := range cases {
		r := d.NewRelay(tb, cfg(10, 10), c.sel)
		tok := "filter" + string(rune('a'+i))
		evs := s.claim(t, r, 10, tok)
		wantSeqs(t, c.name, evs, c.want...)
		for _, e := range evs {
			got := s.get(t, tb, e.Sequence)
			if !got.Leased || strOf(got.LeasedBy) != tok || got.Starts != 1 {
				t.Fatalf("%s: claimed row %v, want leased by %s with one delivery start", c.name, got, tok)
			}
		}
		res := s.mark(t, r, &dialect.MarkParams{Token: tok, Released: seqs(evs)})
		if len(res) != len(evs) {
			t.Fatalf("%s: release reported %d events, want %d", c.name, len(res), len(evs))
		}
		for _, rw := range s.rows(t, tb) {
			if rw.Leased || rw.LeasedBy != nil || rw.Starts != 0 || rw.Published || rw.Attempts != 0 {
				t.Fatalf("%s: after release %v, want unleased, no starts", c.name, rw)
			}
		}
	}
}

// claimFilterLiterals: topic patterns match their text literally, whatever a database's pattern
// syntax makes of '_', '%', '*', '?', '[' and '\\' (excluded "a_b" leaves "axb", excluded prefix
// "x%" leaves "xy", an included prefix "p[" takes only "p[1").
func (s *suite) claimFilterLiterals(t *testing.T) {
	d := s.h.Dialect
	tb := s.table(t)
	seq := s.insert(t, tb, ev("a_b", "", ""), ev("axb", "", ""), ev("x%y", "k", ""), ev("xy", "", ""), ev("p[1", "", ""), ev("p1", "", ""),
		ev(`q\*?`, "", ""), ev("qz", "", ""))
	exact := func(v string) dialect.Topic { return dialect.Topic{Value: v} }
	prefix := func(v string) dialect.Topic { return dialect.Topic{Prefix: true, Value: v} }
	cases := []struct {
		name string
		sel  dialect.TopicSelection
		want []int64
	}{
		{"all minus a_b and x%", dialect.TopicSelection{Include: dialect.Topic{All: true}, Excludes: []dialect.Topic{exact("a_b"), prefix("x%"), prefix("p"), prefix("q")}},
			[]int64{seq[1], seq[3]}},
		{"prefix p[", dialect.TopicSelection{Include: prefix("p[")}, []int64{seq[4]}},
		{`all minus q\*`, dialect.TopicSelection{Include: prefix("q"), Excludes: []dialect.Topic{prefix(`q\*`)}}, []int64{seq[7]}},
		{`exact q\*?`, dialect.TopicSelection{Include: exact(`q\*?`)}, []int64{seq[6]}},
	}
	for i, c := range cases {
		tok := "literal" + string(rune('a'+i))
		evs := s.claim(t, d.NewRelay(tb, cfg(10, 10), c.sel), 10, tok)
		wantSeqs(t, c.name, evs, c.want...)
		s.mark(t, d.NewRelay(tb, cfg(10, 10), c.sel), &dialect.MarkParams{Token: tok, Released: seqs(evs)})
	}
}

// claimPaused: Paused topics are left out; Probe claims one event of the probed topics only.
func (s *suite) claimPaused(t *testing.T) {
	tb := s.table(t)
	seq := s.insert(t, tb, ev("down", "", ""), ev("up", "", ""), ev("down", "", ""), ev("up", "k", ""), ev("down", "j", ""), ev("up", "j", ""))
	r := s.h.Dialect.NewRelay(tb, cfg(10, 10), all)
	// j's event of "up" waits behind its head in the paused topic.
	wantSeqs(t, "paused", s.claimP(t, r, &dialect.ClaimParams{Token: "p1", Limit: 10, Oldest: 10, Paused: []string{"down"}}), seq[1], seq[3])
	wantSeqs(t, "probe", s.claimP(t, r, &dialect.ClaimParams{Token: "p2", Limit: 1, Oldest: 16, Probe: []string{"down"}}), seq[0])
	wantSeqs(t, "rest", s.claim(t, r, 10, "p3"), seq[2], seq[4], seq[5])
}

// claimKeyOrder: a key's later event is never claimed while its head is leased, waiting for a
// retry or dead-lettered; unordered events and other keys never wait; a due retry is claimed
// again with its attempts and last error.
func (s *suite) claimKeyOrder(t *testing.T) {
	tb := s.table(t)
	r := s.h.Dialect.NewRelay(tb, cfg(10, 1), all)
	seq := s.insert(t, tb, ev("a", "k", ""), ev("a", "k", ""), ev("a", "k", ""), ev("a", "j", ""), ev("a", "", ""))
	e1, e2, e3, f1, u1 := seq[0], seq[1], seq[2], seq[3], seq[4]

	wantSeqs(t, "first claim (run 1)", s.claim(t, r, 10, "t1"), e1, f1, u1)
	wantSeqs(t, "head leased", s.claim(t, r, 10, "t2"), nil...)
	s.mark(t, r, &dialect.MarkParams{Token: "t1", Acked: []int64{e1, f1, u1}})
	evs := s.claim(t, r, 10, "t3")
	wantSeqs(t, "after the head's ack", evs, e2)
	if evs[0].Rank != 1 && evs[0].Rank != -1 {
		t.Fatalf("head claimed with rank %d, want 1 (or -1: unranked)", evs[0].Rank)
	}
	s.mark(t, r, fail("t3", false, e2))
	u2 := s.insert(t, tb, ev("a", "", ""))[0]
	wantSeqs(t, "head waiting for its retry", s.claim(t, r, 10, "t4"), u2)
	s.backdate(t, tb, "next_attempt_at", time.Second, e2)
	evs = s.claim(t, r, 10, "t5")
	wantSeqs(t, "retry due", evs, e2)
	if evs[0].Attempts != 1 || strOf(evs[0].LastError) != "boom" || evs[0].DeliveryStarts != 1 {
		t.Fatalf("retried head claimed as %+v, want attempts 1, last error boom, one delivery start", evs[0])
	}
	s.mark(t, r, fail("t5", true, e2))
	m1 := s.insert(t, tb, ev("a", "m", ""))[0]
	wantSeqs(t, "head dead-lettered", s.claim(t, r, 10, "t6"), m1)
	if got := s.get(t, tb, e3); got.Leased || got.Starts != 0 || got.Published {
		t.Fatalf("the dead letter's successor %v was touched", got)
	}
}

// claimRuns: a key's run is claimed in order up to MaxRunPerKey, ranked from 1 at the head.
func (s *suite) claimRuns(t *testing.T) {
	tb := s.table(t)
	r := s.h.Dialect.NewRelay(tb, cfg(10, 2), all)
	seq := s.insert(t, tb, ev("a", "k", ""), ev("a", "k", ""), ev("a", "k", ""), ev("a", "j", ""))
	res, err := r.Claim(context.Background(), s.h.Ex, &dialect.ClaimParams{Token: "r1", Limit: 10, Oldest: 10})
	if err != nil {
		t.Fatal(err)
	}
	evs := res.Events
	wantSeqs(t, "runs of 2", evs, seq[0], seq[1], seq[3])
	if res.Walked != -1 && res.Walked != 2 {
		t.Fatalf("the walk found %d keys, want 2 (or -1: not reported)", res.Walked)
	}
	ranks := map[int64]int64{}
	for _, e := range evs {
		ranks[e.Sequence] = e.Rank
	}
	if ranks[seq[0]] != -1 && (ranks[seq[0]] != 1 || ranks[seq[1]] != 2 || ranks[seq[3]] != 1) {
		t.Fatalf("ranks %v, want k: 1, 2 and j: 1 (or all -1)", ranks)
	}
	s.mark(t, r, &dialect.MarkParams{Token: "r1", Acked: []int64{seq[0]}, Released: []int64{seq[1]}})
	wantSeqs(t, "released second of the run", s.claim(t, r, 10, "r2"), seq[1], seq[2])
}

// claimBatch: a claim leases at most BatchSize events, the oldest first; Limit caps its keyed
// events.
func (s *suite) claimBatch(t *testing.T) {
	tb := s.table(t)
	seq := s.insertN(t, tb, 13)
	r := s.h.Dialect.NewRelay(tb, cfg(5, 5), all)
	wantSeqs(t, "batch 1", s.claim(t, r, 5, "b1"), seq[:5]...)
	wantSeqs(t, "batch 2", s.claim(t, r, 5, "b2"), seq[5:10]...)
	wantSeqs(t, "batch 3", s.claim(t, r, 5, "b3"), seq[10:]...)

	kt := s.table(t)
	kseq := s.insert(t, kt, ev("a", "k", ""), ev("a", "k", ""), ev("a", "k", ""), ev("a", "k", ""), ev("a", "j", ""), ev("a", "j", ""))
	kr := s.h.Dialect.NewRelay(kt, cfg(10, 10), all)
	got := seqs(s.claimP(t, kr, &dialect.ClaimParams{Token: "l1", Limit: 3, Oldest: 10}))
	s.expect(t, "ClaimLimit", slices.Equal(got, kseq[:3]), "Limit 3: claimed %v, want %v", got, kseq[:3])
}

// leaseExpiry: an expired lease is claimed again under a new token (delivery starts counted);
// a mark under the stale token changes nothing; a published event stays published.
func (s *suite) leaseExpiry(t *testing.T) {
	tb := s.table(t)
	r := s.h.Dialect.NewRelay(tb, cfg(10, 10), all)
	seq := s.insert(t, tb, ev("a", "", ""), ev("a", "k", ""), ev("a", "k", ""))
	u, k1, k2 := seq[0], seq[1], seq[2]
	wantSeqs(t, "first", s.claim(t, r, 10, "old"), u, k1, k2)
	wantSeqs(t, "all leased", s.claim(t, r, 10, "mid"), nil...)
	s.backdate(t, tb, "lease_until", time.Second, u, k1, k2)
	evs := s.claim(t, r, 10, "new")
	wantSeqs(t, "after expiry", evs, u, k1, k2)
	for _, e := range evs {
		if e.DeliveryStarts != 2 {
			t.Fatalf("re-claimed %d with %d delivery starts, want 2", e.Sequence, e.DeliveryStarts)
		}
	}
	before := s.rows(t, tb)
	stale := s.mark(t, r, &dialect.MarkParams{Token: "old", Acked: []int64{u}, Released: []int64{k1}, Unavailable: []int64{k2},
		Notes: []string{"unavailable: x"}, Keep: []bool{false}})
	stale2 := s.mark(t, r, fail("old", false, u, k1))
	stale3 := s.mark(t, r, &dialect.MarkParams{Token: "old", Abandoned: []int64{u, k1, k2}})
	if len(stale)+len(stale2)+len(stale3) != 0 {
		t.Fatalf("marks under a stale token reported %v %v %v, want nothing", stale, stale2, stale3)
	}
	if after := s.rows(t, tb); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("marks under a stale token changed rows:\n%v\nwant\n%v", after, before)
	}
	res := s.mark(t, r, &dialect.MarkParams{Token: "new", Acked: []int64{u, k1}})
	if len(res) != 2 || res[u].Attempts != 0 || res[u].Dead || res[u].Next != nil || res[u].Now.IsZero() {
		t.Fatalf("ack reported %+v", res)
	}
	for _, seq := range []int64{u, k1} {
		if got := s.get(t, tb, seq); !got.Published || got.Leased || got.LeasedBy != nil || got.Starts != 0 {
			t.Fatalf("acked row %v, want published, unleased, no starts", got)
		}
	}
	published := s.rows(t, tb)
	again := s.mark(t, r, fail("new", true, u, k1))
	again2 := s.mark(t, r, &dialect.MarkParams{Token: "new", Acked: []int64{u}, Released: []int64{k1}})
	if len(again)+len(again2) != 0 {
		t.Fatalf("marks of published events reported %v %v", again, again2)
	}
	if after := s.rows(t, tb); fmt.Sprint(after) != fmt.Sprint(published) {
		t.Fatalf("marks of published events changed rows:\n%v\nwant\n%v", after, published)
	}
	if n, err := r.Renew(context.Background(), s.h.Ex, "new", []int64{u}); err != nil || n != 0 {
		t.Fatalf("Renew of a published event = %d, %v; want 0", n, err)
	}
}

// renew extends the lease of the token's own events only.
func (s *suite) renew(t *testing.T) {
	tb := s.table(t)
	r := s.h.Dialect.NewRelay(tb, cfg(1, 1), all)
	seq := s.insert(t, tb, ev("a", "", ""), ev("a", "", ""))
	wantSeqs(t, "mine", s.claim(t, r, 1, "mine"), seq[0])
	wantSeqs(t, "theirs", s.claim(t, r, 1, "theirs"), seq[1])
	// Both leases end in 2 s; the renew makes one end a minute from now.
	s.exec(t, tb, `UPDATE {t} SET "lease_until" = `+s.h.At(2*time.Second))
	n, err := r.Renew(context.Background(), s.h.Ex, "mine", seq)
	if err != nil || n != 1 {
		t.Fatalf("Renew = %d, %v; want 1", n, err)
	}
	long := func(seq int64) int64 {
		var v []int64
		rs, err := s.h.Raw.Query(context.Background(), `SELECT CASE WHEN "lease_until" > `+s.h.At(30*time.Second)+` THEN 1 ELSE 0 END FROM `+
			dialect.DoubleQuote(tb.Parts...)+` WHERE "sequence" = $1`, seq)
		if err != nil {
			t.Fatal(err)
		}
		if v, err = dialect.ScanList[int64](rs); err != nil || len(v) != 1 {
			t.Fatalf("lease of %d: %v, %v", seq, v, err)
		}
		return v[0]
	}
	if long(seq[0]) != 1 || long(seq[1]) != 0 {
		t.Fatalf("after Renew: mine extended %d, theirs extended %d; want 1, 0", long(seq[0]), long(seq[1]))
	}
}

// markFailures: each failure counts an attempt, records the error and sets the next attempt at
// RetryBase·2^attempts (capped at RetryMax) × jitter; the MaxAttempts-th dead-letters, as does a
// permanent failure.
func (s *suite) markFailures(t *testing.T) {
	tb := s.table(t)
	r := s.h.Dialect.NewRelay(tb, cfg(10, 10), all)
	seq := s.insert(t, tb, ev("a", "", ""), ev("a", "", ""), ev("a", "", ""))
	x, half, capped := seq[0], seq[1], seq[2]
	s.exec(t, tb, `UPDATE {t} SET "attempts" = 1 WHERE "sequence" = $1`, capped)
	cr := s.h.Dialect.NewRelay(tb, dialect.RelayConfig{BatchSize: 10, MaxRunPerKey: 10, KeyScan: 100, LeaseDuration: time.Minute,
		MaxAttempts: 10, RetryBase: 4 * time.Second, RetryMax: 5 * time.Second}, all)
	delay := func(m dialect.MarkResult) time.Duration {
		if m.Next == nil {
			return -1
		}
		return m.Next.Sub(m.Now.Truncate(time.Microsecond))
	}
	for round, want := range []time.Duration{time.Second, 2 * time.Second} {
		tok := "f" + string(rune('1'+round))
		wantSeqs(t, tok, s.claim(t, r, 10, tok), seq...)
		p := fail(tok, false, x, half)
		p.Jitters[1] = 0.5
		res := s.mark(t, r, p)
		if m := res[x]; len(res) != 2 || m.Attempts != round+1 || m.Dead || delay(m) != want {
			t.Fatalf("failure %d: %+v (delay %v), want attempts %d, next after %v", round+1, res, delay(m), round+1, want)
		}
		if m := res[half]; m.Attempts != round+1 || delay(m) != want/2 {
			t.Fatalf("failure %d with jitter 0.5: delay %v, want %v", round+1, delay(m), want/2)
		}
		if got := s.get(t, tb, x); got.Attempts != int64(round+1) || strOf(got.LastError) != "boom" || strOf(got.Class) != dialect.ClassFailure || !got.Retry || got.Leased || got.LeasedBy != nil || got.Dead || got.Starts != 0 {
			t.Fatalf("after failure %d: %v", round+1, got)
		}
		s.mark(t, r, &dialect.MarkParams{Token: tok, Released: []int64{capped}})
		s.backdate(t, tb, "next_attempt_at", time.Second, x, half)
	}
	wantSeqs(t, "f3", s.claim(t, r, 10, "f3"), seq...)
	res := s.mark(t, r, fail("f3", false, x))
	if m := res[x]; m.Attempts != 3 || !m.Dead || m.Next != nil {
		t.Fatalf("third failure of three: %+v, want dead, no next attempt", m)
	}
	if got := s.get(t, tb, x); !got.Dead || got.Retry || got.Attempts != 3 || got.Leased {
		t.Fatalf("dead-lettered row %v", got)
	}
	res = s.mark(t, r, fail("f3", true, half))
	if m := res[half]; m.Attempts != 3 || !m.Dead {
		t.Fatalf("permanent failure: %+v, want dead", m)
	}
	if got := s.get(t, tb, half); strOf(got.Class) != dialect.ClassPermanent {
		t.Fatalf("permanent failure: %v, want class %s", got, dialect.ClassPermanent)
	}
	if got := s.get(t, tb, x); strOf(got.Class) != dialect.ClassFailure {
		t.Fatalf("dead letter after MaxAttempts: %v, want class %s", got, dialect.ClassFailure)
	}
	s.mark(t, r, &dialect.MarkParams{Token: "f3", Released: []int64{capped}})
	wantSeqs(t, "capped", s.claim(t, cr, 10, "c1"), capped)
	res = s.mark(t, cr, fail("c1", false, capped))
	if m := res[capped]; m.Attempts != 2 || m.Dead || delay(m) != 5*time.Second {
		t.Fatalf("capped retry: %+v (delay %v), want attempts 2, next after RetryMax 5s", m, delay(m))
	}
	wantSeqs(t, "nothing due", s.claim(t, r, 10, "f4"), nil...)
}

// markHeld: a held event (never emitted) is released with its start uncounted, no attempt,
// due HeldFor later with its note and class held, and its key's later events wait behind it;
// the mark is fenced by the token.
func (s *suite) markHeld(t *testing.T) {
	tb := s.table(t)
	r := s.h.Dialect.NewRelay(tb, cfg(10, 10), all)
	seq := s.insert(t, tb, ev("a", "k", ""), ev("a", "k", ""), ev("a", "", ""))
	wantSeqs(t, "h1", s.claim(t, r, 10, "h1"), seq...)
	if res := s.mark(t, r, &dialect.MarkParams{Token: "other", Held: seq[:1], HeldFor: []int64{1}, HeldNotes: []string{"x"}}); len(res) != 0 {
		t.Fatalf("held under another token reported %+v, want nothing", res)
	}
	hold := 30 * time.Second
	res := s.mark(t, r, &dialect.MarkParams{Token: "h1", Held: []int64{seq[0], seq[2]}, HeldFor: []int64{hold.Microseconds(), 1},
		HeldNotes: []string{"held: dest down", "held: over rate"}, Released: seq[1:2]})
	m := res[seq[0]]
	if len(res) != 3 || m.Attempts != 0 || m.Dead || m.Next == nil || m.Next.Sub(m.Now) < hold-time.Second || m.Next.Sub(m.Now) > hold+time.Second {
		t.Fatalf("held reported %+v (head %+v), want three events, the head due %s after the mark's clock, no attempt", res, m, hold)
	}
	rows := s.rows(t, tb)
	if r := rows[0]; r.Attempts != 0 || strOf(r.LastError) != "held: dest down" || strOf(r.Class) != dialect.ClassHeld || r.Starts != 0 || r.Leased || r.LeasedBy != nil || !r.Retry {
		t.Fatalf("held head: %v", r)
	}
	// The key's later event waits behind its held head; the unordered event held for 1 µs is due.
	evs := s.claim(t, r, 10, "h2")
	wantSeqs(t, "after the hold", evs, seq[2])
	if evs[0].DeliveryStarts != 1 {
		t.Fatalf("held event claimed again with %d delivery starts, want 1 (the held start uncounted)", evs[0].DeliveryStarts)
	}
}

// markUnavailable: unavailable notes the error, counts no attempt, keeps the delivery start
// when asked; abandoned releases and uncounts the start.
func (s *suite) markUnavailable(t *testing.T) {
	tb := s.table(t)
	r := s.h.Dialect.NewRelay(tb, cfg(10, 10), all)
	seq := s.insert(t, tb, ev("a", "", ""), ev("a", "", ""), ev("a", "", ""))
	wantSeqs(t, "u1", s.claim(t, r, 10, "u1"), seq...)
	res := s.mark(t, r, &dialect.MarkParams{Token: "u1", Unavailable: seq[:2], Notes: []string{"unavailable: one", "unavailable: two"}, Keep: []bool{true, false},
		Abandoned: seq[2:]})
	if len(res) != 2 || res[seq[0]].Attempts != 0 || res[seq[0]].Dead || res[seq[0]].Next != nil {
		t.Fatalf("unavailable reported %+v, want two events, no attempts", res)
	}
	rows := s.rows(t, tb)
	if r := rows[0]; r.Attempts != 0 || strOf(r.LastError) != "unavailable: one" || strOf(r.Class) != dialect.ClassNotAttempted || r.Starts != 1 || r.Leased || r.Retry {
		t.Fatalf("unavailable, kept: %v", r)
	}
	if r := rows[1]; r.Attempts != 0 || strOf(r.LastError) != "unavailable: two" || strOf(r.Class) != dialect.ClassUnavailable || r.Starts != 0 || r.Leased {
		t.Fatalf("unavailable, not kept: %v", r)
	}
	if r := rows[2]; r.Attempts != 0 || r.LastError != nil || r.Class != nil || r.Starts != 0 || r.Leased || r.LeasedBy != nil {
		t.Fatalf("abandoned: %v", r)
	}
	evs := s.claim(t, r, 10, "u2")
	wantSeqs(t, "claimable again", evs, seq...)
	for _, e := range evs {
		if want := map[int64]int{seq[0]: 2, seq[1]: 1, seq[2]: 1}[e.Sequence]; e.DeliveryStarts != want {
			t.Fatalf("event %d: %d delivery starts, want %d", e.Sequence, e.DeliveryStarts, want)
		}
	}
}

// takeBack releases exactly the unexpired leases of an earlier relay of the same name with the
// exact token shape.
func (s *suite) takeBack(t *testing.T) {
	tb := s.table(t)
	seq := s.insertN(t, tb, 10)
	set := func(seq int64, token string, d time.Duration) {
		s.exec(t, tb, `UPDATE {t} SET "leased_by" = $1, "lease_until" = `+s.h.At(d)+` WHERE "sequence" = $2`, token, seq)
	}
	set(seq[0], "relay#0123456789ab#7", time.Hour)  // an earlier relay: taken back
	set(seq[1], "relay#bbbbbbbbbbbb#1", time.Hour)  // this relay's own prefix
	set(seq[2], "relay#0123456789ab#x", time.Hour)  // not digits after '#'
	set(seq[3], "other#0123456789ab#1", time.Hour)  // another name
	set(seq[4], "relay#0123456789AB#1", time.Hour)  // not lower-case hex
	set(seq[5], "relay#0123456789ab#2", -time.Hour) // expired
	set(seq[6], "relay#0123456789abc#1", time.Hour) // 13 hex digits
	set(seq[7], "relay#0123456789ab#12", time.Hour) // an earlier relay: taken back
	set(seq[8], "relay#0123456789ab#4", time.Hour)  // an earlier relay's, but dead-lettered
	s.exec(t, tb, `UPDATE {t} SET "dead_lettered_at" = `+s.h.At(0)+` WHERE "sequence" = $1`, seq[8])
	set(seq[9], "relay#0123456789ab#3x", time.Hour) // not only digits after '#'
	n, err := s.h.Dialect.TakeBack(context.Background(), s.h.Ex, tb, "relay#", "relay#bbbbbbbbbbbb#")
	if err != nil || n != 2 {
		t.Fatalf("TakeBack = %d, %v; want 2", n, err)
	}
	for i, r := range s.rows(t, tb) {
		taken := i == 0 || i == 7
		if taken != (r.LeasedBy == nil) {
			t.Errorf("row %d after TakeBack: %v (taken back: %v)", i, r, taken)
		}
	}
}
