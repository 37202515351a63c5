package dialecttest

import (
	"bytes"
	"context"
	"slices"
	"testing"
	"time"

	"github.com/watermill-outbox/outbox/internal/dialect"
)

// claimKeyAcrossTopics: a key's order spans topics: a relay of one topic does not claim a
// key's event while an earlier event of the key in another topic is undelivered.
func (s *suite) claimKeyAcrossTopics(t *testing.T) {
	d := s.h.Dialect
	tb := s.table(t)
	seq := s.insert(t, tb, ev("x", "k", ""), ev("y", "k", ""), ev("y", "", ""))
	ry := d.NewRelay(tb, cfg(10, 10), dialect.TopicSelection{Include: dialect.Topic{Value: "y"}})
	rnotx := d.NewRelay(tb, cfg(10, 10), dialect.TopicSelection{Include: dialect.Topic{All: true}, Excludes: []dialect.Topic{{Value: "x"}}})
	rx := d.NewRelay(tb, cfg(10, 10), dialect.TopicSelection{Include: dialect.Topic{Value: "x"}})
	wantSeqs(t, "y behind x's head", s.claim(t, ry, 10, "y1"), seq[2])
	wantSeqs(t, "all but x behind x's head", s.claim(t, rnotx, 10, "n1"), nil...)
	wantSeqs(t, "x", s.claim(t, rx, 10, "x1"), seq[0])
	wantSeqs(t, "y while x's head is leased", s.claim(t, ry, 10, "y2"), nil...)
	s.mark(t, rx, &dialect.MarkParams{Token: "x1", Acked: seq[:1]})
	wantSeqs(t, "y after x's ack", s.claim(t, ry, 10, "y3"), seq[1])
}

// claimSkipScan: a key whose head is claimable is found although the oldest claimable keyed
// events (the walk, Oldest of them) all belong to keys blocked behind a failed head.
func (s *suite) claimSkipScan(t *testing.T) {
	tb := s.table(t)
	r := s.h.Dialect.NewRelay(tb, cfg(10, 10), all)
	var rows []dialect.InsertRow
	for _, k := range []string{"a", "b"} {
		for range 4 {
			rows = append(rows, ev("t", k, ""))
		}
	}
	seq := s.insert(t, tb, rows...)
	wantSeqs(t, "runs", s.claim(t, r, 10, "s1"), seq...)
	s.mark(t, r, &dialect.MarkParams{Token: "s1", Released: append(append([]int64(nil), seq[1:4]...), seq[5:8]...)})
	s.mark(t, r, fail("s1", false, seq[0], seq[4]))
	z := s.insert(t, tb, ev("t", "z", ""))[0]
	if s.h.Dialect.Capabilities().Floors {
		res, err := r.Claim(context.Background(), s.h.Ex, &dialect.ClaimParams{Token: "s0", Limit: 10, Oldest: 2, NoKeyScan: true})
		if err != nil {
			t.Fatal(err)
		}
		wantSeqs(t, "NoKeyScan", res.Events, nil...)
		if res.Scanned != nil && *res.Scanned != 0 {
			t.Fatalf("NoKeyScan claim scanned %d keys", *res.Scanned)
		}
		// A key the relay knows (KeyLows) is found without the skip scan.
		res, err = r.Claim(context.Background(), s.h.Ex, &dialect.ClaimParams{Token: "s0", Limit: 10, Oldest: 2, NoKeyScan: true,
			KeyLows: []dialect.KeyLow{{Key: "z", Low: z}}})
		if err != nil {
			t.Fatal(err)
		}
		wantSeqs(t, "NoKeyScan, z known", res.Events, z)
		s.mark(t, r, &dialect.MarkParams{Token: "s0", Released: []int64{z}})
	}
	res, err := r.Claim(context.Background(), s.h.Ex, &dialect.ClaimParams{Token: "s3", Limit: 10, Oldest: 2})
	if err != nil {
		t.Fatal(err)
	}
	wantSeqs(t, "key behind blocked keys", res.Events, z)
	if res.Scanned == nil || *res.Scanned < 1 || res.Cursor == nil {
		t.Fatalf("skip scan reported cursor %v, scanned %v; want it to have run", res.Cursor, res.Scanned)
	}
}

// claimContinuation (Capabilities.Continuations): a key's next run is leased while its
// previous run is still leased under ContToken with a third of the lease left, or once it is
// published; never without the continuation, under another token, or with less lease left.
func (s *suite) claimContinuation(t *testing.T) {
	if !s.h.Dialect.Capabilities().Continuations {
		t.Skip("no Capabilities.Continuations: the claim takes no ClaimParams.Cont")
	}
	tb := s.table(t)
	r := s.h.Dialect.NewRelay(tb, cfg(10, 2), all)
	seq := s.insert(t, tb, ev("a", "k", ""), ev("a", "k", ""), ev("a", "k", ""), ev("a", "k", ""), ev("a", "k", ""), ev("a", "k", ""))
	wantSeqs(t, "first run", s.claim(t, r, 10, "c1"), seq[0], seq[1])
	cont := func(token, contToken string, from, after int64) []dialect.Claimed {
		return s.claimP(t, r, &dialect.ClaimParams{Token: token, Limit: 10, Oldest: 10, ContToken: contToken,
			Cont: []dialect.Continuation{{Key: "k", From: from, After: after}}})
	}
	wantSeqs(t, "no continuation", s.claim(t, r, 10, "c2"), nil...)
	wantSeqs(t, "another token", cont("c3", "other", seq[0], seq[1]), nil...)
	evs := cont("c4", "c1", seq[0], seq[1])
	wantSeqs(t, "continued while leased", evs, seq[2], seq[3])
	s.mark(t, r, &dialect.MarkParams{Token: "c1", Acked: seq[:2]})
	s.exec(t, tb, `UPDATE {t} SET "lease_until" = `+s.h.At(time.Second)+` WHERE "sequence" IN ($1, $2)`, seq[2], seq[3])
	wantSeqs(t, "less than a third of the lease left", cont("c5", "c4", seq[2], seq[3]), nil...)
	s.mark(t, r, &dialect.MarkParams{Token: "c4", Acked: seq[2:4]})
	wantSeqs(t, "continued after the marks", cont("c6", "c4", seq[2], seq[3]), seq[4], seq[5])
}

// floors (Capabilities.Floors): events below the floors are claimed only when due again; the
// claim reports the next floors' candidates and its transaction; Sweep finds what the floors
// hold below them; LockHolders names the writers holding the table.
func (s *suite) floors(t *testing.T) {
	if !s.h.Dialect.Capabilities().Floors {
		t.Skip("no Capabilities.Floors: LowKeyed and LowUnordered are plain scan starts")
	}
	ctx := context.Background()
	tb := s.table(t)
	r := s.h.Dialect.NewRelay(tb, cfg(10, 10), all)
	seq := s.insert(t, tb, ev("a", "", ""), ev("a", "k", ""), ev("a", "", ""), ev("a", "k", ""))
	u1, k1, u2, k2 := seq[0], seq[1], seq[2], seq[3]
	res, err := r.Claim(ctx, s.h.Ex, &dialect.ClaimParams{Token: "f1", Limit: 10, Oldest: 10, LowKeyed: k2, LowUnordered: u2})
	if err != nil {
		t.Fatal(err)
	}
	wantSeqs(t, "above the floors", res.Events, u2)
	if f := res.Floors; f == nil || f.NextKeyed != k2 || f.NextUnordered != u2 || f.MaxSeq != k2 || f.Xid <= 0 || f.Xmin <= 0 {
		t.Fatalf("Floors = %+v; want next keyed %d, next unordered %d, max seq %d, a transaction", res.Floors, k2, u2, k2)
	}
	sw, ok := r.(dialect.Sweeper)
	if !ok {
		t.Fatal("a Floors relay does not implement dialect.Sweeper")
	}
	if k, u, err := sw.Sweep(ctx, s.h.Ex, k2, u2); err != nil || k != k1 || u != u1 {
		t.Fatalf("Sweep(%d, %d) = %d, %d, %v; want %d, %d", k2, u2, k, u, err, k1, u1)
	}
	if k, u, err := sw.Sweep(ctx, s.h.Ex, k1, u1); err != nil || k != 0 || u != 0 {
		t.Fatalf("Sweep(%d, %d) = %d, %d, %v; want 0, 0", k1, u1, k, u, err)
	}
	// u1 and k1 fail and come due again: claimed below the floors.
	wantSeqs(t, "from 0", s.claim(t, r, 10, "f2"), u1, k1, k2)
	s.mark(t, r, fail("f2", false, u1, k1))
	s.mark(t, r, &dialect.MarkParams{Token: "f2", Released: []int64{k2}})
	s.backdate(t, tb, "next_attempt_at", time.Second, u1, k1)
	wantSeqs(t, "due again below the floors", s.claimP(t, r, &dialect.ClaimParams{Token: "f3", Limit: 10, Oldest: 10, LowKeyed: k2 + 1, LowUnordered: u2 + 1}), u1, k1, k2)

	ll, ok := r.(dialect.LockLooker)
	if !ok {
		t.Fatal("a Floors relay does not implement dialect.LockLooker")
	}
	if h, err := ll.LockHolders(ctx, s.h.Ex); err != nil || len(h) != 0 {
		t.Fatalf("LockHolders with no writer = %v, %v", h, err)
	}
	err = s.inTx(ctx, func(ex dialect.Executor) error {
		if _, err := s.h.Dialect.Insert(ctx, ex, &dialect.InsertParams{Table: tb, Rows: []dialect.InsertRow{ev("a", "", "")}}); err != nil {
			return err
		}
		if h, err := ll.LockHolders(ctx, s.h.Ex); err != nil || len(h) != 1 {
			t.Errorf("LockHolders beside an open writer = %v, %v; want one", h, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// payloadBytes: a binary payload table stores and returns the bytes as written.
func (s *suite) payloadBytes(t *testing.T) {
	tb := s.table(t, func(tb *dialect.Table) { tb.Payload = dialect.PayloadBytea })
	r := ev("a", "", "")
	r.Payload = []byte{0, 0xff, 0xfe, '\n', 'x', 0x80}
	s.insert(t, tb, r)
	evs := s.claim(t, s.h.Dialect.NewRelay(tb, cfg(10, 10), all), 10, "b")
	if len(evs) != 1 || !bytes.Equal(evs[0].Payload, r.Payload) || evs[0].Headers != `{"h":"v"}` {
		t.Fatalf("claimed %+v, want payload %v", evs, r.Payload)
	}
}

// payloadAsWritten: JSON payloads and headers come back byte for byte as written (spacing and
// key order kept), from a claim and from ListDead.
func (s *suite) payloadAsWritten(t *testing.T) {
	tb := s.table(t)
	r := ev("a", "", "")
	r.Payload, r.Headers = []byte(`{"b": 1,  "a":[1, 2.50], "u":"\u00e9"}`), `{"z":"1",  "a": "x"}`
	seq := s.deadLetter(t, tb, r)
	dead, err := s.h.Dialect.ListDead(context.Background(), s.h.Ex, tb, dialect.DeadFilter{Topics: []dialect.Topic{{All: true}}}, 10)
	if err != nil || len(dead) != 1 || dead[0].Sequence != seq[0] {
		t.Fatalf("ListDead = %+v, %v", dead, err)
	}
	if string(dead[0].Payload) != string(r.Payload) || dead[0].Headers != r.Headers {
		t.Fatalf("ListDead payload %s headers %s, want %s and %s as written", dead[0].Payload, dead[0].Headers, r.Payload, r.Headers)
	}
	if n, err := s.h.Dialect.RetryDead(context.Background(), s.h.Ex, tb, dialect.DeadFilter{IDs: []string{r.ID}}); err != nil || n != 1 {
		t.Fatalf("RetryDead = %d, %v", n, err)
	}
	evs := s.claim(t, s.h.Dialect.NewRelay(tb, cfg(10, 10), all), 10, "w")
	if len(evs) != 1 || string(evs[0].Payload) != string(r.Payload) || evs[0].Headers != r.Headers {
		t.Fatalf("claimed %+v, want payload %s headers %s as written", evs, r.Payload, r.Headers)
	}
}

// emptyCalls: no rows to insert, no keys to read, no sequences to renew or mark.
func (s *suite) emptyCalls(t *testing.T) {
	ctx := context.Background()
	d := s.h.Dialect
	tb := s.table(t)
	if st, err := s.insertRes(t, &dialect.InsertParams{Table: tb}); err != nil || len(st) != 0 {
		t.Fatalf("Insert of no rows = %+v, %v", st, err)
	}
	if st, err := d.ReadStored(ctx, s.h.Ex, tb, nil); err != nil || len(st) != 0 {
		t.Fatalf("ReadStored of no keys = %+v, %v", st, err)
	}
	r := d.NewRelay(tb, cfg(10, 10), all)
	if n, err := r.Renew(ctx, s.h.Ex, "tok", nil); err != nil || n != 0 {
		t.Fatalf("Renew of nothing = %d, %v", n, err)
	}
	if res := s.mark(t, r, &dialect.MarkParams{Token: "tok"}); len(res) != 0 {
		t.Fatalf("Mark of nothing = %+v", res)
	}
	wantSeqs(t, "empty table", s.claim(t, r, 10, "tok"), nil...)
}

// expiredLease: a relay whose lease expired but was not taken over still holds its events:
// renew, ack and failure under its token apply.
func (s *suite) expiredLease(t *testing.T) {
	ctx := context.Background()
	tb := s.table(t)
	r := s.h.Dialect.NewRelay(tb, cfg(10, 10), all)
	seq := s.insertN(t, tb, 2)
	wantSeqs(t, "claim", s.claim(t, r, 10, "late"), seq...)
	s.backdate(t, tb, "lease_until", time.Second, seq...)
	if n, err := r.Renew(ctx, s.h.Ex, "late", seq[:1]); err != nil || n != 1 {
		t.Fatalf("Renew after expiry = %d, %v; want 1", n, err)
	}
	if g := s.get(t, tb, seq[0]); !g.Leased {
		t.Fatalf("renewed row %v, want a live lease", g)
	}
	res := s.mark(t, r, &dialect.MarkParams{Token: "late", Acked: seq[1:]})
	if len(res) != 1 || !s.get(t, tb, seq[1]).Published {
		t.Fatalf("ack after expiry = %+v, want the event published", res)
	}
}

// wakeProbe (dialect.WakeProber): the counter is 0 before the first write and every write or
// Announce advances it; the snapshot and the running transactions are read only when it moved
// or when asked, and name an open writer.
func (s *suite) wakeProbe(t *testing.T) {
	wp, ok := s.h.Dialect.(dialect.WakeProber)
	if !ok {
		t.Skip("the dialect is no dialect.WakeProber")
	}
	if s.h.CurrentTx == nil {
		t.Fatal("the dialect is a dialect.WakeProber but the harness has no CurrentTx")
	}
	ctx := context.Background()
	tb := s.table(t)
	target, cache, err := wp.ProbeTarget(ctx, s.h.Ex, tb)
	if err != nil || target == 0 || cache != 1 {
		t.Fatalf("ProbeTarget = %d, %d, %v; want a target and cache 1", target, cache, err)
	}
	probe := func(last int64, full bool) dialect.ProbeState {
		t.Helper()
		st, err := wp.Probe(ctx, s.h.Ex, target, last, full)
		if err != nil {
			t.Fatalf("Probe(%d, %v): %v", last, full, err)
		}
		return st
	}
	st, err := wp.Probe(ctx, s.h.Ex, target, 0, false)
	if s.expect(t, "WakeProbe", err == nil, "Probe: %v", err); err != nil {
		return
	}
	if st.Counter != 0 || st.Xmax != 0 || st.Running != nil {
		t.Fatalf("Probe before any write = %+v, want counter 0 and nothing read", st)
	}
	seq := s.insertN(t, tb, 2)
	if st := probe(0, false); st.Counter != seq[1] || st.Xmax == 0 || st.Running == nil {
		t.Fatalf("Probe after two writes = %+v, want counter %d with the snapshot read", st, seq[1])
	}
	if st := probe(seq[1], false); st.Counter != seq[1] || st.Xmax != 0 || st.InProgress != nil || st.Running != nil {
		t.Fatalf("Probe of an unchanged counter = %+v, want counter %d and nothing else read", st, seq[1])
	}
	if err := wp.Announce(ctx, s.h.Ex, tb); err != nil {
		t.Fatal(err)
	}
	if st := probe(seq[1], false); st.Counter != seq[1]+1 {
		t.Fatalf("Probe after Announce = %+v, want counter %d", st, seq[1]+1)
	}
	err = s.inTx(ctx, func(ex dialect.Executor) error {
		if _, err := s.h.Dialect.Insert(ctx, ex, &dialect.InsertParams{Table: tb, Rows: []dialect.InsertRow{ev("a", "", "")}}); err != nil {
			return err
		}
		x, err := s.h.CurrentTx(ctx, ex)
		if err != nil {
			return err
		}
		st := probe(seq[1]+2, true)
		if !slices.Contains(st.Running, x) || (!slices.Contains(st.InProgress, x) && int32(x-st.Xmax) < 0) {
			t.Errorf("Probe beside open writer %d = xmax %d, in progress %v, running %v; want it running and not ended", x, st.Xmax, st.InProgress, st.Running)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
