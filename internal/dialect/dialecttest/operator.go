package dialecttest

import (
	"context"
	"encoding/json"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/watermill-outbox/outbox/internal/dialect"
)

// operator returns the dialect as a dialect.Operator, or skips t.
func (s *suite) operator(t *testing.T) dialect.Operator {
	t.Helper()
	o, ok := s.h.Dialect.(dialect.Operator)
	if !ok {
		t.Skipf("%s does not implement dialect.Operator", s.h.Dialect.Name())
	}
	return o
}

// blockedSetup writes keys a (head failed, two held), b (head dead-lettered, one held), c (head
// failed and leased by a relay, one held), d (a dead-lettered head holding nothing), e (a
// failed head holding nothing, its predecessor published) and one unordered event, and
// returns the sequences by name ("a1", "a2" …).
func (s *suite) blockedSetup(t *testing.T, tb *dialect.Table) map[string]int64 {
	t.Helper()
	names := []string{"a1", "a2", "a3", "b1", "b2", "c1", "c2", "d1", "e1", "e2", "u1"}
	rows := make([]dialect.InsertRow, len(names))
	for i, n := range names {
		key := n[:1]
		if key == "u" {
			key = ""
		}
		rows[i] = ev("t."+n[:1], key, "")
	}
	seq := s.insert(t, tb, rows...)
	at := map[string]int64{}
	for i, n := range names {
		at[n] = seq[i]
	}
	r := s.h.Dialect.NewRelay(tb, cfg(20, 20), all)
	wantSeqs(t, "operator setup", s.claimP(t, r, &dialect.ClaimParams{Token: "op#1", Limit: 20, Oldest: 20}), seq...)
	s.mark(t, r, &dialect.MarkParams{Token: "op#1", Acked: []int64{at["e1"], at["u1"]}, Released: []int64{at["a2"], at["a3"], at["b2"], at["c2"]}})
	s.mark(t, r, fail("op#1", false, at["a1"], at["c1"], at["e2"]))
	s.mark(t, r, fail("op#1", true, at["b1"], at["d1"]))
	// c1 is in flight: a relay holds it.
	s.exec(t, tb, `UPDATE {t} SET "leased_by" = 'other#2', "lease_until" = `+s.h.At(time.Minute)+` WHERE "sequence" = $1`, at["c1"])
	return at
}

// operatorBlockedKeys: BlockedKeys lists exactly the keys held behind a failed or dead-lettered
// head (in flight or not), oldest head first, with the head's columns and the held count, and
// leaves out heads that hold nothing; the limit cuts the list.
func (s *suite) operatorBlockedKeys(t *testing.T) {
	o := s.operator(t)
	ctx := context.Background()
	tb := s.table(t)
	at := s.blockedSetup(t, tb)
	got, err := o.BlockedKeys(ctx, s.h.Ex, tb, 10)
	if err != nil {
		t.Fatal(err)
	}
	type key struct {
		Key            string
		Seq, Held      int64
		Attempts       int
		Err            string
		Dead, Retrying bool
	}
	want := []key{{"a", at["a1"], 2, 1, "boom", false, true}, {"b", at["b1"], 1, 1, "boom", true, false}, {"c", at["c1"], 1, 1, "boom", false, true}}
	var keys []key
	for _, b := range got {
		keys = append(keys, key{b.Key, b.Sequence, b.Held, b.Attempts, strOf(b.LastError), !b.DeadLetteredAt.IsZero(), !b.NextAttemptAt.IsZero()})
		if b.ID == "" || b.Topic != "t."+b.Key || b.CreatedAt.IsZero() || b.Now.IsZero() || b.Now.Before(b.CreatedAt.Add(-time.Minute)) {
			t.Errorf("blocked key %s: id %q topic %q created %v now %v", b.Key, b.ID, b.Topic, b.CreatedAt, b.Now)
		}
	}
	if !slices.Equal(keys, want) {
		t.Fatalf("BlockedKeys = %+v, want %+v", keys, want)
	}
	if got, err := o.BlockedKeys(ctx, s.h.Ex, tb, 2); err != nil || len(got) != 2 || got[0].Key != "a" || got[1].Key != "b" {
		t.Fatalf("BlockedKeys(2) = %+v, %v; want a and b", got, err)
	}
	// More than HeldCountLimit held: the count stops there.
	if testing.Short() {
		return
	}
	big := s.table(t)
	const n = dialect.HeldCountLimit + 2
	for done := 0; done < n; done += 500 {
		rows := make([]dialect.InsertRow, min(500, n-done))
		for i := range rows {
			rows[i] = ev("t", "big", "")
		}
		if _, err := s.insertRes(t, &dialect.InsertParams{Table: big, Rows: rows, NoReturn: true}); err != nil {
			t.Fatal(err)
		}
	}
	s.exec(t, big, `UPDATE {t} SET "attempts" = 1, "next_attempt_at" = `+s.h.At(time.Hour)+` WHERE "sequence" = (SELECT min(x."sequence") FROM (SELECT "sequence" FROM {t}) x)`)
	if got, err := o.BlockedKeys(ctx, s.h.Ex, big, 10); err != nil || len(got) != 1 || got[0].Held != dialect.HeldCountLimit {
		t.Fatalf("BlockedKeys of a key holding %d = %+v, %v; want one key, held %d", n-1, got, err, dialect.HeldCountLimit)
	}
	// One fewer held than the limit: the exact count.
	s.exec(t, big, `DELETE FROM {t} WHERE "sequence" = (SELECT max(x."sequence") FROM (SELECT "sequence" FROM {t}) x)`)
	s.exec(t, big, `DELETE FROM {t} WHERE "sequence" = (SELECT max(x."sequence") FROM (SELECT "sequence" FROM {t}) x)`)
	if got, err := o.BlockedKeys(ctx, s.h.Ex, big, 10); err != nil || len(got) != 1 || got[0].Held != dialect.HeldCountLimit-1 {
		t.Fatalf("BlockedKeys of a key holding %d = %+v, %v; want held %d", n-3, got, err, dialect.HeldCountLimit-1)
	}
}

// operatorActOnHead: each action changes the head only while it is still its key's failed or
// dead-lettered head and not in flight (0 rows otherwise: a later event of the key, failed too;
// a head leased by a relay; another key; the same head again after the action), and has its
// documented effects: retry makes the head due (a dead-lettered one with fresh attempts), skip
// dead-letters it out of its key's order (the key kept in SkippedKeyHeader) and purge deletes
// it, and both make the key's next event due at once, so the next claim leases the key's later
// events in order.
func (s *suite) operatorActOnHead(t *testing.T) {
	o := s.operator(t)
	ctx := context.Background()
	tb := s.table(t)
	at := s.blockedSetup(t, tb)
	act := func(key string, seq int64, a dialect.HeadAction, want int64) {
		t.Helper()
		if n, err := o.ActOnHead(ctx, s.h.Ex, tb, key, seq, a); err != nil || n != want {
			t.Fatalf("ActOnHead(%s, %d, %d) = %d, %v; want %d", key, seq, a, n, err, want)
		}
	}
	// a2 failed too, but a1 is a's head: nothing acts on a2.
	s.exec(t, tb, `UPDATE {t} SET "attempts" = 1 WHERE "sequence" = $1`, at["a2"])
	for _, a := range []dialect.HeadAction{dialect.HeadRetry, dialect.HeadSkip, dialect.HeadPurge} {
		act("a", at["a2"], a, 0)
		act("c", at["c1"], a, 0) // in flight
		act("b", at["a1"], a, 0) // another key's head
	}
	s.exec(t, tb, `UPDATE {t} SET "attempts" = 0 WHERE "sequence" = $1`, at["a2"])

	// Skip a1: dead-lettered, out of a's order, the key in its header; a2 due now.
	act("a", at["a1"], dialect.HeadSkip, 1)
	act("a", at["a1"], dialect.HeadSkip, 0)
	act("a", at["a1"], dialect.HeadRetry, 0)
	if g := s.get(t, tb, at["a1"]); !g.Dead || g.Key != nil || g.Retry || g.Attempts != 1 || g.Published {
		t.Fatalf("skipped head %v; want dead-lettered, no key, no next attempt", g)
	}
	dead, err := s.h.Dialect.ListDead(ctx, s.h.Ex, tb, dialect.DeadFilter{Topics: []dialect.Topic{{All: true}}, Key: "a"}, 10)
	if err != nil || len(dead) != 1 || dead[0].Sequence != at["a1"] {
		t.Fatalf("dead letters of key a after the skip = %+v, %v; want a1", dead, err)
	}
	var hdrs map[string]string
	if err := json.Unmarshal([]byte(dead[0].Headers), &hdrs); err != nil || hdrs[dialect.SkippedKeyHeader] != "a" || hdrs["h"] != "v" {
		t.Fatalf("skipped head's headers %s (%v); want h and %s = a", dead[0].Headers, err, dialect.SkippedKeyHeader)
	}
	if g := s.get(t, tb, at["a2"]); !g.Retry || g.Attempts != 0 || g.Dead {
		t.Fatalf("a2 after the skip %v; want due now (next attempt set), no attempt", g)
	}

	// Retry b1 (dead-lettered): fresh attempts, due now; a second retry finds no failed head.
	act("b", at["b1"], dialect.HeadRetry, 1)
	act("b", at["b1"], dialect.HeadRetry, 0)
	if g := s.get(t, tb, at["b1"]); g.Dead || g.Attempts != 0 || !g.Retry || strOf(g.Key) != "b" {
		t.Fatalf("retried dead head %v; want pending, no attempts, due now", g)
	}
	// Retry e2 (failed, due in a while): due now, attempts kept; it is still a failed head.
	act("e", at["e2"], dialect.HeadRetry, 1)
	act("e", at["e2"], dialect.HeadRetry, 1)
	if g := s.get(t, tb, at["e2"]); g.Dead || g.Attempts != 1 || !g.Retry {
		t.Fatalf("retried failed head %v; want pending, one attempt, due now", g)
	}

	// Purge c1 once its lease expired: deleted; c2 due now.
	s.exec(t, tb, `UPDATE {t} SET "lease_until" = `+s.h.At(-time.Minute)+` WHERE "sequence" = $1`, at["c1"])
	act("c", at["c1"], dialect.HeadPurge, 1)
	act("c", at["c1"], dialect.HeadPurge, 0)
	for _, g := range s.rows(t, tb) {
		if g.Seq == at["c1"] {
			t.Fatalf("purged head still there: %v", g)
		}
	}
	if g := s.get(t, tb, at["c2"]); !g.Retry || g.Dead {
		t.Fatalf("c2 after the purge %v; want due now", g)
	}
	// d1: a dead-lettered head holding nothing can still be purged (nothing to make due).
	act("d", at["d1"], dialect.HeadPurge, 1)

	// The next claim leases a's later events (in order), b1 and b2, c2 and e2: nothing else.
	r := s.h.Dialect.NewRelay(tb, cfg(20, 20), all)
	evs := s.claimP(t, r, &dialect.ClaimParams{Token: "after#1", Limit: 20, Oldest: 20})
	wantSeqs(t, "after the actions", evs, at["a2"], at["a3"], at["b1"], at["b2"], at["c2"], at["e2"])
	if left, err := o.BlockedKeys(ctx, s.h.Ex, tb, 10); err != nil || len(left) != 0 {
		t.Fatalf("BlockedKeys after the actions = %+v, %v; want none", left, err)
	}
}

// operatorDeadFilters: the narrowing fields of DeadFilter (key, also through SkippedKeyHeader;
// error text ignoring case; dead-lettered time bounds) select exactly, in ListDead, CountDead,
// RetryDead and PurgeDead.
func (s *suite) operatorDeadFilters(t *testing.T) {
	o := s.operator(t)
	ctx := context.Background()
	d := s.h.Dialect
	tb := s.table(t)
	seq := s.deadLetter(t, tb, ev("x", "k1", ""), ev("x", "k2", ""), ev("y", "", ""), ev("y", "k1", ""))
	s.exec(t, tb, `UPDATE {t} SET "last_error" = 'Connection REFUSED by peer' WHERE "sequence" = $1`, seq[1])
	s.backdate(t, tb, "dead_lettered_at", 3*time.Hour, seq[2])
	s.backdate(t, tb, "dead_lettered_at", time.Hour, seq[3])
	// A skipped head of k2 keeps its key in the header: the key filter finds it.
	skip := s.insert(t, tb, ev("x", "k2", ""), ev("x", "k2", ""))
	s.exec(t, tb, `UPDATE {t} SET "attempts" = 1, "last_error" = 'boom' WHERE "sequence" = $1`, skip[0])
	// k2's head is seq[1] (dead-lettered): skip it first, then the next one.
	for _, sq := range []int64{seq[1], skip[0]} {
		if n, err := o.ActOnHead(ctx, s.h.Ex, tb, "k2", sq, dialect.HeadSkip); err != nil || n != 1 {
			t.Fatalf("skip %d: %d, %v", sq, n, err)
		}
	}
	now := time.Now()
	all := []dialect.Topic{{All: true}}
	for _, c := range []struct {
		name string
		f    dialect.DeadFilter
		want []int64 // dead_lettered_at, sequence order
	}{
		{"key k1", dialect.DeadFilter{Topics: all, Key: "k1"}, []int64{seq[3], seq[0]}},
		{"key k2, skipped", dialect.DeadFilter{Topics: all, Key: "k2"}, []int64{seq[1], skip[0]}},
		{"key and topic", dialect.DeadFilter{Topics: []dialect.Topic{{Value: "y"}}, Key: "k1"}, []int64{seq[3]}},
		{"error text, any case", dialect.DeadFilter{Topics: all, ErrorContains: "refused"}, []int64{seq[1]}},
		{"error text", dialect.DeadFilter{Topics: all, ErrorContains: "BOO"}, []int64{seq[2], seq[3], seq[0], skip[0]}},
		{"after", dialect.DeadFilter{Topics: all, After: now.Add(-2 * time.Hour)}, []int64{seq[3], seq[0], seq[1], skip[0]}},
		{"before", dialect.DeadFilter{Topics: all, Before: now.Add(-30 * time.Minute)}, []int64{seq[2], seq[3]}},
		{"between", dialect.DeadFilter{Topics: all, After: now.Add(-2 * time.Hour), Before: now.Add(-30 * time.Minute)}, []int64{seq[3]}},
		{"by id and key", dialect.DeadFilter{IDs: []string{s.get(t, tb, seq[0]).ID, s.get(t, tb, seq[2]).ID}, Key: "k1"}, []int64{seq[0]}},
		{"nothing", dialect.DeadFilter{Topics: all, Key: "k1", ErrorContains: "refused"}, nil},
	} {
		got, err := d.ListDead(ctx, s.h.Ex, tb, c.f, 10)
		var seqs []int64
		for _, g := range got {
			seqs = append(seqs, g.Sequence)
		}
		if err != nil || !slices.Equal(seqs, c.want) {
			t.Errorf("ListDead %s = %v, %v; want %v", c.name, seqs, err, c.want)
		}
		if n, err := d.CountDead(ctx, s.h.Ex, tb, c.f); err != nil || n != int64(len(c.want)) {
			t.Errorf("CountDead %s = %d, %v; want %d", c.name, n, err, len(c.want))
		}
	}
	if n, err := d.RetryDead(ctx, s.h.Ex, tb, dialect.DeadFilter{Topics: all, ErrorContains: "REFUSED"}); err != nil || n != 1 {
		t.Fatalf("RetryDead by error text = %d, %v; want 1", n, err)
	}
	if n, err := d.PurgeDead(ctx, s.h.Ex, tb, dialect.DeadFilter{Topics: all, Key: "k1", Before: now.Add(-30 * time.Minute)}); err != nil || n != 1 {
		t.Fatalf("PurgeDead by key and time = %d, %v; want 1", n, err)
	}
	var left []int64
	for _, g := range s.rows(t, tb) {
		if g.Dead {
			left = append(left, g.Seq)
		}
	}
	if want := []int64{seq[0], seq[2], skip[0]}; !slices.Equal(left, want) {
		t.Fatalf("dead letters left %v, want %v", left, want)
	}
}

// operatorDeliveryStats: the events published in the window, grouped by minute, with the
// count, mean, 95th percentile (interpolated, as percentile_cont) and maximum of their commit
// → publish delay; an event published before the window is left out; with fewer rows allowed
// than the window holds, Capped is set and the oldest (partial) minute is left out.
func (s *suite) operatorDeliveryStats(t *testing.T) {
	o := s.operator(t)
	ctx := context.Background()
	tb := s.table(t)
	seq := s.insert(t, tb, ev("a", "", ""), ev("a", "k", ""), ev("a", "", ""), ev("b", "", ""), ev("b", "", ""))
	r := s.h.Dialect.NewRelay(tb, cfg(10, 10), all)
	wantSeqs(t, "stats setup", s.claim(t, r, 10, "st#1"), seq...)
	s.mark(t, r, &dialect.MarkParams{Token: "st#1", Acked: seq})
	// Minute m starts 10 minutes ago (whole minutes, so 10 to 40 s into it is inside it).
	m := time.Now().UTC().Truncate(time.Minute).Add(-10 * time.Minute)
	set := func(seq int64, published time.Time, delay time.Duration) {
		d := time.Until(published)
		s.exec(t, tb, `UPDATE {t} SET "published_at" = `+s.h.At(d)+`, "created_at" = `+s.h.At(d-delay)+` WHERE "sequence" = $1`, seq)
	}
	set(seq[0], m.Add(10*time.Second), time.Second)
	set(seq[1], m.Add(20*time.Second), 2*time.Second)
	set(seq[2], m.Add(30*time.Second), 10*time.Second)
	set(seq[3], m.Add(70*time.Second), 4*time.Second)
	set(seq[4], m.Add(-2*time.Hour), time.Second) // before the window
	near := func(got, want float64) bool { return math.Abs(got-want) < 0.01 }
	st, err := o.DeliveryStats(ctx, s.h.Ex, tb, time.Hour, 100)
	if err != nil {
		t.Fatal(err)
	}
	if st.Capped || st.Now.IsZero() || len(st.Minutes) != 2 {
		t.Fatalf("DeliveryStats = %+v; want two minutes, not capped", st)
	}
	a, b := st.Minutes[0], st.Minutes[1]
	// Delays 1, 2 and 10 s: mean 4.33; p95 at 0.95·2 = 1.9 → 2 + 0.9·8 = 9.2.
	if !a.Minute.Equal(m) || a.Delivered != 3 || !near(a.MeanDelay, 13.0/3) || !near(a.P95, 9.2) || !near(a.Max, 10) {
		t.Errorf("first minute %+v; want %v, 3 events, mean 4.33 s, p95 9.2 s, max 10 s", a, m)
	}
	if !b.Minute.Equal(m.Add(time.Minute)) || b.Delivered != 1 || !near(b.MeanDelay, 4) || !near(b.P95, 4) || !near(b.Max, 4) {
		t.Errorf("second minute %+v; want %v, one event of 4 s", b, m.Add(time.Minute))
	}
	st, err = o.DeliveryStats(ctx, s.h.Ex, tb, time.Hour, 3)
	if err != nil || !st.Capped || len(st.Minutes) != 1 || st.Minutes[0].Delivered != 1 || !st.Minutes[0].Minute.Equal(m.Add(time.Minute)) {
		t.Fatalf("DeliveryStats of at most 3 rows = %+v, %v; want capped, the newest minute only", st, err)
	}
	if st, err := o.DeliveryStats(ctx, s.h.Ex, tb, time.Minute, 100); err != nil || len(st.Minutes) != 0 || st.Capped {
		t.Fatalf("DeliveryStats of the last minute = %+v, %v; want nothing", st, err)
	}
}

// operatorLeases: the unexpired leases of pending events grouped by relay instance (the token
// without its claim number), with the count and the latest and earliest expiry; an expired
// lease is left out; a limit below the leased events caps the count at the first ones.
func (s *suite) operatorLeases(t *testing.T) {
	o := s.operator(t)
	ctx := context.Background()
	tb := s.table(t)
	seq := s.insert(t, tb, ev("a", "", ""), ev("a", "k", ""), ev("a", "", ""), ev("a", "x", ""), ev("a", "", ""), ev("a", "", ""))
	lease := func(token string, d time.Duration, seqs ...int64) {
		for _, sq := range seqs {
			s.exec(t, tb, `UPDATE {t} SET "leased_by" = $1, "lease_until" = `+s.h.At(d)+` WHERE "sequence" = $2`, token, sq)
		}
	}
	lease("ra#0123456789ab#1", time.Minute, seq[0], seq[1])
	lease("ra#0123456789ab#2", 2*time.Minute, seq[2], seq[3])
	lease("rb#0123456789ab#5", time.Minute, seq[4])
	lease("rc#0123456789ab#9", -time.Minute, seq[5]) // expired
	type relay struct {
		Instance string
		Events   int64
		Spread   bool // the latest expiry is after the earliest
	}
	got := func(limit int) ([]relay, bool) {
		t.Helper()
		r, err := o.Leases(ctx, s.h.Ex, tb, limit)
		if err != nil {
			t.Fatal(err)
		}
		var out []relay
		for _, l := range r.Relays {
			if l.Now.IsZero() || !l.OldestLeased.After(l.Now) || l.LeaseUntil.Before(l.OldestLeased) || l.LeaseUntil.After(l.Now.Add(3*time.Minute)) {
				t.Errorf("lease row %+v: expiries not between now and 3 minutes on", l)
			}
			out = append(out, relay{l.Instance, l.Events, l.LeaseUntil.After(l.OldestLeased.Add(30 * time.Second))})
		}
		return out, r.Capped
	}
	if rs, capped := got(10); capped || !slices.Equal(rs, []relay{{"ra#0123456789ab", 4, true}, {"rb#0123456789ab", 1, false}}) {
		t.Fatalf("Leases(10) = %+v, capped %v; want ra 4, rb 1", rs, capped)
	}
	if rs, capped := got(3); !capped || !slices.Equal(rs, []relay{{"ra#0123456789ab", 3, true}}) {
		t.Fatalf("Leases(3) = %+v, capped %v; want ra 3 (the first three leased), capped", rs, capped)
	}
	if rs, capped := got(5); capped || len(rs) != 2 {
		t.Fatalf("Leases(5) = %+v, capped %v; want both relays, not capped", rs, capped)
	}
}

// operatorOverview: BacklogOverview with a limit above the backlog agrees with BacklogByTopic
// (pending, dead, unavailable, held per topic, oldest pending) and reports the rows it read;
// with a limit below it, it counts the oldest limit of each kind only.
func (s *suite) operatorOverview(t *testing.T) {
	o := s.operator(t)
	ctx := context.Background()
	d := s.h.Dialect
	tb := s.table(t)
	s.deadLetter(t, tb, ev("b", "", ""), ev("a", "dk", ""))
	r := d.NewRelay(tb, cfg(10, 10), all)
	seq := s.insert(t, tb, ev("a", "", ""), ev("a", "", ""), ev("a", "k", ""), ev("b", "k", ""), ev("a", "k", ""), ev("b", "", ""), ev("a", "dk", ""))
	wantSeqs(t, "setup", s.claim(t, r, 10, "ov#1"), seq[:6]...)
	s.mark(t, r, &dialect.MarkParams{Token: "ov#1", Acked: seq[:1], Unavailable: []int64{seq[1], seq[5]}, Notes: []string{"unavailable: down", "not attempted"},
		Keep: []bool{false, true}, Released: []int64{seq[3], seq[4]}})
	s.mark(t, r, fail("ov#1", false, seq[2]))
	by, err := d.BacklogByTopic(ctx, s.h.Ex, tb)
	if err != nil {
		t.Fatal(err)
	}
	ov, err := o.BacklogOverview(ctx, s.h.Ex, tb, 100)
	if err != nil {
		t.Fatal(err)
	}
	if len(ov.Topics) != len(by) || ov.Unordered != 2 || ov.Keyed != 4 || ov.Dead != 2 || ov.Heads != 2 {
		t.Fatalf("BacklogOverview(100) = %+v; want %d topics, 2 unordered, 4 keyed, 2 dead read, 2 failed heads", ov, len(by))
	}
	for i, b := range by {
		g := ov.Topics[i]
		if g.Topic != b.Topic || g.Pending != b.Pending || g.DeadLettered != b.DeadLettered || g.Unavailable != b.Unavailable || g.Held != b.Held ||
			!g.Oldest.Equal(b.Oldest) || g.Now.IsZero() {
			t.Errorf("overview topic %+v, BacklogByTopic %+v", g, b)
		}
	}
	// The oldest 1 of each kind: seq[1] (unordered), seq[2] (keyed, the failed head of k), the
	// earliest dead letter; nothing read is held.
	ov, err = o.BacklogOverview(ctx, s.h.Ex, tb, 1)
	if err != nil {
		t.Fatal(err)
	}
	var pending, dead, held int64
	for _, g := range ov.Topics {
		pending, dead, held = pending+g.Pending, dead+g.DeadLettered, held+g.Held
	}
	if ov.Unordered != 1 || ov.Keyed != 1 || ov.Dead != 1 || pending != 2 || dead != 1 || held != 0 {
		t.Fatalf("BacklogOverview(1) = %+v; want one of each kind read, 2 pending, 1 dead, 0 held", ov)
	}
}

// OperatorCall is one call a dialect's plan test runs under EXPLAIN: a name and the call on an
// Executor.
type OperatorCall struct {
	Name string
	Run  func(ex dialect.Executor) error
}

// OperatorCalls returns a call of every dialect.Operator method of d on table tb (ActOnHead with
// each action on event head of key, which should be a failed head) and of the dead-letter
// operations with DeadFilter's narrowing fields: the statements a dialect's plan test checks
// for reads outside the live indexes. d must implement dialect.Operator.
func OperatorCalls(ctx context.Context, d dialect.Dialect, tb *dialect.Table, key string, head int64) []OperatorCall {
	o := d.(dialect.Operator)
	all := []dialect.Topic{{All: true}}
	act := func(a dialect.HeadAction) func(dialect.Executor) error {
		return func(ex dialect.Executor) error { _, err := o.ActOnHead(ctx, ex, tb, key, head, a); return err }
	}
	return []OperatorCall{
		{"blocked keys", func(ex dialect.Executor) error { _, err := o.BlockedKeys(ctx, ex, tb, 100); return err }},
		{"retry head", act(dialect.HeadRetry)},
		{"skip head", act(dialect.HeadSkip)},
		{"purge head", act(dialect.HeadPurge)},
		{"delivery stats", func(ex dialect.Executor) error { _, err := o.DeliveryStats(ctx, ex, tb, time.Hour, 50000); return err }},
		{"leases", func(ex dialect.Executor) error { _, err := o.Leases(ctx, ex, tb, 2000); return err }},
		{"backlog overview", func(ex dialect.Executor) error { _, err := o.BacklogOverview(ctx, ex, tb, 2000); return err }},
		{"dead letters by key, error text and time", func(ex dialect.Executor) error {
			_, err := d.ListDead(ctx, ex, tb, dialect.DeadFilter{Topics: all, Key: "k2", ErrorContains: "BOOM", After: time.Now().Add(-2 * time.Hour), Before: time.Now()}, 100)
			return err
		}},
		{"count dead by error text", func(ex dialect.Executor) error {
			_, err := d.CountDead(ctx, ex, tb, dialect.DeadFilter{Topics: all, ErrorContains: "boom"})
			return err
		}},
	}
}
