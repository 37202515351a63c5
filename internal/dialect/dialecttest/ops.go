package dialecttest

import (
	"context"
	"encoding/json"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/watermill-outbox/outbox/internal/dialect"
)

// deadLetter inserts rows and dead-letters them (a permanent failure, error "boom").
func (s *suite) deadLetter(t *testing.T, tb *dialect.Table, rows ...dialect.InsertRow) []int64 {
	t.Helper()
	seq := s.insert(t, tb, rows...)
	r := s.h.Dialect.NewRelay(tb, cfg(100, 100), all)
	wantSeqs(t, "dead-letter setup", s.claimP(t, r, &dialect.ClaimParams{Token: "dl", Limit: 100, Oldest: 100}), seq...)
	if res := s.mark(t, r, fail("dl", true, seq...)); len(res) != len(seq) {
		t.Fatalf("dead-lettered %d of %d", len(res), len(seq))
	}
	return seq
}

// deadLetters: ListDead, RetryDead and PurgeDead by topic (exact, prefix), by id and by age; no
// topic and no id selects nothing.
func (s *suite) deadLetters(t *testing.T) {
	ctx := context.Background()
	d := s.h.Dialect
	tb := s.table(t)
	rows := []dialect.InsertRow{ev("d.a", "", "ik"), ev("d.a", "", ""), ev("d.b", "", ""), ev("e", "", "")}
	seq := s.deadLetter(t, tb, rows...)
	live := s.insert(t, tb, ev("d.a", "", ""))[0]
	s.backdate(t, tb, "dead_lettered_at", 2*time.Hour, seq[3])
	s.backdate(t, tb, "dead_lettered_at", time.Hour, seq[2])
	exact := func(v string) dialect.Topic { return dialect.Topic{Value: v} }
	prefix := func(v string) dialect.Topic { return dialect.Topic{Prefix: true, Value: v} }
	list := func(f dialect.DeadFilter, limit int) []int64 {
		t.Helper()
		got, err := d.ListDead(ctx, s.h.Ex, tb, f, limit)
		if err != nil {
			t.Fatalf("ListDead(%+v): %v", f, err)
		}
		out := make([]int64, len(got))
		for i, g := range got {
			out[i] = g.Sequence
		}
		return out
	}
	cases := []struct {
		name  string
		f     dialect.DeadFilter
		limit int
		want  []int64 // in order: dead_lettered_at, then sequence
	}{
		{"nothing", dialect.DeadFilter{}, 10, nil},
		{"exact", dialect.DeadFilter{Topics: []dialect.Topic{exact("d.a")}}, 10, seq[:2]},
		{"prefix", dialect.DeadFilter{Topics: []dialect.Topic{prefix("d.")}}, 10, []int64{seq[2], seq[0], seq[1]}},
		{"all", dialect.DeadFilter{Topics: []dialect.Topic{{All: true}}}, 10, []int64{seq[3], seq[2], seq[0], seq[1]}},
		{"limit", dialect.DeadFilter{Topics: []dialect.Topic{{All: true}}}, 2, []int64{seq[3], seq[2]}},
		{"ids", dialect.DeadFilter{IDs: []string{rows[1].ID, rows[3].ID, uuid.NewString()}}, 10, []int64{seq[3], seq[1]}},
		{"topic or id", dialect.DeadFilter{Topics: []dialect.Topic{exact("d.b")}, IDs: []string{rows[0].ID}}, 10, []int64{seq[2], seq[0]}},
		{"older than 90m", dialect.DeadFilter{Topics: []dialect.Topic{{All: true}}, OlderThan: 90 * time.Minute}, 10, []int64{seq[3]}},
		{"older than 30m", dialect.DeadFilter{Topics: []dialect.Topic{{All: true}}, OlderThan: 30 * time.Minute}, 10, []int64{seq[3], seq[2]}},
		{"older, by id", dialect.DeadFilter{IDs: []string{rows[0].ID, rows[3].ID}, OlderThan: 30 * time.Minute}, 10, []int64{seq[3]}},
	}
	for _, c := range cases {
		if got := list(c.f, c.limit); !slices.Equal(got, c.want) {
			t.Errorf("ListDead %s = %v, want %v", c.name, got, c.want)
		}
		if c.limit < 10 {
			continue
		}
		if n, err := d.CountDead(ctx, s.h.Ex, tb, c.f); err != nil || n != int64(len(c.want)) {
			t.Errorf("CountDead %s = %d, %v; want %d", c.name, n, err, len(c.want))
		}
	}
	full, err := d.ListDead(ctx, s.h.Ex, tb, dialect.DeadFilter{IDs: []string{rows[0].ID}}, 10)
	if err != nil || len(full) != 1 {
		t.Fatalf("ListDead by id: %v, %v", full, err)
	}
	if g := full[0]; g.ID != rows[0].ID || g.Topic != "d.a" || string(g.Payload) != `{"n":1}` || g.Headers != `{"h":"v"}` || g.OrderingKey != nil ||
		strOf(g.IdempotencyKey) != "ik" || g.CreatedAt.IsZero() || g.Attempts != 1 || strOf(g.LastError) != "boom" || g.DeadLetteredAt.IsZero() ||
		g.DeadLetteredAt.Before(g.CreatedAt) {
		t.Fatalf("ListDead row %+v", g)
	}

	n, err := d.RetryDead(ctx, s.h.Ex, tb, dialect.DeadFilter{Topics: []dialect.Topic{exact("d.a")}, OlderThan: 30 * time.Minute})
	if err != nil || n != 0 {
		t.Fatalf("RetryDead of recent d.a = %d, %v; want 0", n, err)
	}
	if n, err = d.RetryDead(ctx, s.h.Ex, tb, dialect.DeadFilter{Topics: []dialect.Topic{exact("d.a")}}); err != nil || n != 2 {
		t.Fatalf("RetryDead d.a = %d, %v; want 2", n, err)
	}
	for _, sq := range seq[:2] {
		if g := s.get(t, tb, sq); g.Dead || g.Attempts != 0 || g.Leased || g.Published {
			t.Fatalf("retried row %v, want pending with no attempts", g)
		}
	}
	r := d.NewRelay(tb, cfg(10, 10), all)
	wantSeqs(t, "retried events are due at once", s.claim(t, r, 10, "after-retry"), seq[0], seq[1], live)
	if n, err = d.PurgeDead(ctx, s.h.Ex, tb, dialect.DeadFilter{Topics: []dialect.Topic{prefix("d.")}, OlderThan: 90 * time.Minute}); err != nil || n != 0 {
		t.Fatalf("PurgeDead of recent d.* = %d, %v; want 0", n, err)
	}
	if n, err = d.CountDead(ctx, s.h.Ex, tb, dialect.DeadFilter{IDs: []string{rows[2].ID, rows[0].ID}}); err != nil || n != 1 {
		t.Fatalf("CountDead by id = %d, %v; want 1 (the other is no longer dead)", n, err)
	}
	if n, err = d.PurgeDead(ctx, s.h.Ex, tb, dialect.DeadFilter{IDs: []string{rows[2].ID, rows[0].ID}}); err != nil || n != 1 {
		t.Fatalf("PurgeDead by id = %d, %v; want 1 (the other is no longer dead)", n, err)
	}
	if n, err = d.PurgeDead(ctx, s.h.Ex, tb, dialect.DeadFilter{}); err != nil || n != 0 {
		t.Fatalf("PurgeDead with no filter = %d, %v; want 0", n, err)
	}
	var left []int64
	for _, g := range s.rows(t, tb) {
		left = append(left, g.Seq)
	}
	if want := []int64{seq[0], seq[1], seq[3], live}; !slices.Equal(left, want) {
		t.Fatalf("rows after purge %v, want %v", left, want)
	}
}

// purgeKeyed: retrying, purging or cleaning up a key's dead-lettered head lets its successors be claimed
// again, in order.
func (s *suite) purgeKeyed(t *testing.T) {
	ctx := context.Background()
	d := s.h.Dialect
	for _, op := range []string{"purge", "retry", "cleanup"} {
		t.Run(op, func(t *testing.T) {
			tb := s.table(t)
			r := d.NewRelay(tb, cfg(10, 10), all)
			seq := s.insert(t, tb, ev("a", "k", ""), ev("a", "k", ""), ev("a", "k", ""))
			wantSeqs(t, "run", s.claim(t, r, 10, "p1"), seq...)
			s.mark(t, r, &dialect.MarkParams{Token: "p1", Released: seq[1:]})
			s.mark(t, r, fail("p1", true, seq[0]))
			wantSeqs(t, "behind the dead letter", s.claim(t, r, 10, "p2"), nil...)
			f := dialect.DeadFilter{Topics: []dialect.Topic{{Value: "a"}}}
			var n int64
			var err error
			want := seq
			switch op {
			case "purge":
				n, err = d.PurgeDead(ctx, s.h.Ex, tb, f)
				want = seq[1:]
			case "retry":
				n, err = d.RetryDead(ctx, s.h.Ex, tb, f)
			default:
				s.backdate(t, tb, "dead_lettered_at", 2*time.Hour, seq[0])
				n, err = d.Cleanup(ctx, s.h.Ex, tb, "dead_lettered_at", time.Hour, 10)
				want = seq[1:]
			}
			if err != nil || n != 1 {
				t.Fatalf("%s = %d, %v; want 1", op, n, err)
			}
			wantSeqs(t, "after "+op, s.claim(t, r, 10, "p3"), want...)
		})
	}
}

// cleanup deletes published (or dead-lettered) events older than the age, batch by batch,
// never pending ones.
func (s *suite) cleanup(t *testing.T) {
	ctx := context.Background()
	d := s.h.Dialect
	tb := s.table(t)
	r := d.NewRelay(tb, cfg(10, 10), all)
	pub := s.insert(t, tb, ev("a", "", ""), ev("a", "k", ""), ev("a", "", ""), ev("a", "", ""))
	wantSeqs(t, "publish", s.claim(t, r, 10, "c1"), pub...)
	s.mark(t, r, &dialect.MarkParams{Token: "c1", Acked: pub})
	dead := s.deadLetter(t, tb, ev("a", "", ""), ev("a", "", ""), ev("a", "", ""))
	pending := s.insert(t, tb, ev("a", "", ""))
	s.backdate(t, tb, "published_at", 2*time.Hour, pub[:3]...)
	s.backdate(t, tb, "dead_lettered_at", 2*time.Hour, dead[:2]...)
	for _, c := range []struct {
		column string
		older  time.Duration
		want   int64
	}{{"published_at", time.Hour, 3}, {"published_at", 0, 4}, {"published_at", 3 * time.Hour, 0}, {"dead_lettered_at", time.Hour, 2}, {"dead_lettered_at", 0, 3}} {
		if n, err := d.CountOlder(ctx, s.h.Ex, tb, c.column, c.older); err != nil || n != c.want {
			t.Fatalf("CountOlder(%s, %v) = %d, %v; want %d", c.column, c.older, n, err, c.want)
		}
	}
	for _, step := range []struct {
		column string
		batch  int
		want   int64
	}{{"published_at", 2, 2}, {"published_at", 2, 1}, {"published_at", 2, 0}, {"dead_lettered_at", 1, 1}, {"dead_lettered_at", 5, 1}, {"dead_lettered_at", 5, 0}} {
		n, err := d.Cleanup(ctx, s.h.Ex, tb, step.column, time.Hour, step.batch)
		if err != nil || n != step.want {
			t.Fatalf("Cleanup(%s, 1h, %d) = %d, %v; want %d", step.column, step.batch, n, err, step.want)
		}
	}
	var left []int64
	for _, g := range s.rows(t, tb) {
		left = append(left, g.Seq)
	}
	if want := []int64{pub[3], dead[2], pending[0]}; !slices.Equal(left, want) {
		t.Fatalf("rows after Cleanup %v, want %v", left, want)
	}
}

// backlog: exact counts of pending, dead-lettered, unavailable (every pending event of a topic
// that has one classed unavailable) and held events, the oldest
// pending event's created_at, per topic and in all.
func (s *suite) backlog(t *testing.T) {
	ctx := context.Background()
	d := s.h.Dialect
	tb := s.table(t)
	empty, err := d.Backlog(ctx, s.h.Ex, tb)
	if err != nil || empty.Pending != 0 || empty.DeadLettered != 0 || !empty.Oldest.IsZero() || empty.Now.IsZero() {
		t.Fatalf("empty Backlog = %+v, %v", empty, err)
	}
	if by, err := d.BacklogByTopic(ctx, s.h.Ex, tb); err != nil || len(by) != 0 {
		t.Fatalf("empty BacklogByTopic = %+v, %v", by, err)
	}
	s.deadLetter(t, tb, ev("b", "", ""), ev("a", "dk", ""))
	if b, err := d.Backlog(ctx, s.h.Ex, tb); err != nil || b.Pending != 0 || b.DeadLettered != 2 || !b.Oldest.IsZero() || b.Held != 0 {
		t.Fatalf("Backlog of dead letters only = %+v, %v; want 2 dead, nothing pending", b, err)
	}
	r := d.NewRelay(tb, cfg(10, 10), all)
	seq := s.insert(t, tb,
		ev("a", "", ""),   // 0 published
		ev("a", "", ""),   // 1 unavailable
		ev("a", "k", ""),  // 2 failed head of k
		ev("b", "k", ""),  // 3 held behind it
		ev("a", "k", ""),  // 4 held behind it
		ev("b", "", ""),   // 5 pending
		ev("a", "dk", ""), // 6 held behind the dead letter
	)
	wantSeqs(t, "setup", s.claim(t, r, 10, "b1"), seq[:6]...)
	// seq[1]: its destination unavailable, which holds all of topic a; seq[5]: not attempted,
	// which holds nothing.
	s.mark(t, r, &dialect.MarkParams{Token: "b1", Acked: seq[:1], Unavailable: []int64{seq[1], seq[5]}, Notes: []string{"unavailable: down", "not attempted"},
		Keep: []bool{false, true}, Released: []int64{seq[3], seq[4]}})
	s.mark(t, r, fail("b1", false, seq[2]))
	var oldest []time.Time
	rs, err := s.h.Raw.Query(ctx, `SELECT "created_at" FROM `+dialect.DoubleQuote(tb.Parts...)+` WHERE "sequence" = $1`, seq[1])
	if err != nil {
		t.Fatal(err)
	}
	for rs.Next() {
		var v dialect.Time
		if err := rs.Scan(&v); err != nil {
			t.Fatal(err)
		}
		oldest = append(oldest, time.Time(v))
	}
	rs.Close()
	b, err := d.Backlog(ctx, s.h.Ex, tb)
	if err != nil {
		t.Fatal(err)
	}
	if b.Pending != 6 || b.DeadLettered != 2 || b.Unavailable != 4 || b.Held != 3 || len(oldest) != 1 || !b.Oldest.Equal(oldest[0]) || b.Now.IsZero() {
		t.Fatalf("Backlog = %+v; want pending 6, dead 2, unavailable 4 (topic a's pending), held 3, oldest %v", b, oldest)
	}
	by, err := d.BacklogByTopic(ctx, s.h.Ex, tb)
	if err != nil {
		t.Fatal(err)
	}
	if len(by) != 2 || by[0].Topic != "a" || by[1].Topic != "b" {
		t.Fatalf("BacklogByTopic = %+v, want a and b", by)
	}
	a, bb := by[0], by[1]
	if a.Pending != 4 || a.DeadLettered != 1 || a.Unavailable != 4 || a.Held != 2 || !a.Oldest.Equal(oldest[0]) {
		t.Errorf("topic a = %+v; want pending 4, dead 1, unavailable 4, held 2", a)
	}
	if bb.Pending != 2 || bb.DeadLettered != 1 || bb.Unavailable != 0 || bb.Held != 1 {
		t.Errorf("topic b = %+v; want pending 2, dead 1, unavailable 0, held 1", bb)
	}
}

// missingTable: MissingTable recognises the error of a statement on a table that does not exist,
// and no other.
func (s *suite) missingTable(t *testing.T) {
	ctx := context.Background()
	d := s.h.Dialect
	missing := s.h.Table(t)
	if _, err := d.ListDead(ctx, s.h.Ex, missing, dialect.DeadFilter{Topics: []dialect.Topic{{All: true}}}, 10); err == nil || !d.MissingTable(err) {
		t.Fatalf("ListDead on a missing table: %v; MissingTable %v, want true", err, d.MissingTable(err))
	}
	if _, err := d.Backlog(ctx, s.h.Ex, missing); err == nil || !d.MissingTable(err) {
		t.Fatalf("Backlog on a missing table: %v; MissingTable %v, want true", err, d.MissingTable(err))
	}
	tb := s.table(t)
	_, err := s.h.Raw.Exec(ctx, `UPDATE `+dialect.DoubleQuote(tb.Parts...)+` SET "no_such_column" = 1`)
	if err == nil || d.MissingTable(err) {
		t.Fatalf("a missing column: %v; MissingTable %v, want false", err, d.MissingTable(err))
	}
	if d.MissingTable(nil) {
		t.Fatal("MissingTable(nil) is true")
	}
}

// replay: CountReplay, ScanReplay and ReadReplay select published events by published_at
// window, topic, key and highest sequence; ScanReplay pages in (published_at, sequence) order
// through events published by one mark (equal times); ReadReplay reads by sequence, in order.
func (s *suite) replay(t *testing.T) {
	ctx := context.Background()
	d := s.h.Dialect
	tb := s.table(t)
	rows := []dialect.InsertRow{ev("a", "k1", ""), ev("a", "k2", ""), ev("b", "k1", ""), ev("a", "", ""), ev("c", "k1", "")}
	seq := s.insert(t, tb, rows...)
	r := d.NewRelay(tb, cfg(10, 10), all)
	wantSeqs(t, "replay setup", s.claim(t, r, 10, "rp"), seq...)
	s.mark(t, r, &dialect.MarkParams{Token: "rp", Acked: seq})
	s.backdate(t, tb, "published_at", 2*time.Hour, seq[0])
	s.backdate(t, tb, "published_at", time.Hour, seq[1])
	pending := s.insert(t, tb, ev("a", "k1", ""))[0]
	now := time.Now()
	win := dialect.ReplayFilter{Since: now.Add(-90 * time.Minute), Until: now.Add(time.Minute)}
	with := func(mod func(*dialect.ReplayFilter)) dialect.ReplayFilter {
		f := win
		mod(&f)
		return f
	}
	for _, c := range []struct {
		name string
		f    dialect.ReplayFilter
		want []int64 // in published_at, sequence order
	}{
		{"window", win, seq[1:]},
		{"wider window", with(func(f *dialect.ReplayFilter) { f.Since = now.Add(-3 * time.Hour) }), seq},
		{"window ends before", with(func(f *dialect.ReplayFilter) { f.Until = now.Add(-30 * time.Minute) }), seq[1:2]},
		{"topic", with(func(f *dialect.ReplayFilter) { f.Topics = []dialect.Topic{{Value: "a"}} }), []int64{seq[1], seq[3]}},
		{"topics", with(func(f *dialect.ReplayFilter) { f.Topics = []dialect.Topic{{Value: "b"}, {Prefix: true, Value: "c"}} }), []int64{seq[2], seq[4]}},
		{"all topics", with(func(f *dialect.ReplayFilter) { f.Topics = []dialect.Topic{{All: true}} }), seq[1:]},
		{"key", with(func(f *dialect.ReplayFilter) { f.Keys = []string{"k1"} }), []int64{seq[2], seq[4]}},
		{"keys and topic", with(func(f *dialect.ReplayFilter) { f.Keys, f.Topics = []string{"k1", "k2"}, []dialect.Topic{{Value: "a"}} }), []int64{seq[1]}},
		{"max sequence", with(func(f *dialect.ReplayFilter) { f.MaxSeq = seq[3] }), seq[1:4]},
		{"nothing", with(func(f *dialect.ReplayFilter) { f.Topics = []dialect.Topic{{Value: "zzz"}} }), nil},
	} {
		n, top, err := d.CountReplay(ctx, s.h.Ex, tb, c.f)
		wantTop := int64(0)
		for _, q := range c.want {
			wantTop = max(wantTop, q)
		}
		if err != nil || n != int64(len(c.want)) || top != wantTop {
			t.Errorf("CountReplay %s = %d, %d, %v; want %d, %d", c.name, n, top, err, len(c.want), wantTop)
		}
		// One event per page: the cursor steps through equal published_at values.
		var got []int64
		var cur dialect.ReplayMark
		for range 10 {
			page, err := d.ScanReplay(ctx, s.h.Ex, tb, c.f, cur, 1)
			if err != nil {
				t.Fatalf("ScanReplay %s: %v", c.name, err)
			}
			if len(page) == 0 {
				break
			}
			got = append(got, page[0].Sequence)
			cur = page[0]
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("ScanReplay %s by pages of 1 = %v, want %v", c.name, got, c.want)
		}
		page, err := d.ScanReplay(ctx, s.h.Ex, tb, c.f, dialect.ReplayMark{}, 100)
		var whole []int64
		for _, m := range page {
			whole = append(whole, m.Sequence)
		}
		if err != nil || !slices.Equal(whole, c.want) {
			t.Errorf("ScanReplay %s = %v, %v; want %v", c.name, whole, err, c.want)
		}
	}
	got, err := d.ReadReplay(ctx, s.h.Ex, tb, []int64{seq[4], pending + 1000, seq[1]})
	if err != nil || len(got) != 2 {
		t.Fatalf("ReadReplay = %+v, %v; want 2 rows", got, err)
	}
	for i, want := range []int{1, 4} {
		g, w := got[i], rows[want]
		if g.Sequence != seq[want] || g.ID != w.ID || g.Topic != w.Topic || strOf(g.OrderingKey) != strOf(w.OrderingKey) || g.Extra != nil ||
			!sameJSON(text(g.Payload), text(w.Payload)) || !sameJSON(g.Headers, w.Headers) {
			t.Errorf("ReadReplay row %d = %+v, want %+v at %d", i, g, w, seq[want])
		}
	}
}

// sameJSON reports whether a and b are the same JSON value (a database may reformat it).
func sameJSON(a, b string) bool {
	var x, y any
	return json.Unmarshal([]byte(a), &x) == nil && json.Unmarshal([]byte(b), &y) == nil && reflect.DeepEqual(x, y)
}
