package dialecttest

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/watermill-outbox/outbox/internal/dialect"
)

// schema: TableExists before and after; Migrate twice; Statements create a usable table and
// run twice.
func (s *suite) schema(t *testing.T) {
	ctx := context.Background()
	d := s.h.Dialect
	tb := s.h.Table(t)
	if ok, err := d.TableExists(ctx, s.h.Ex, tb); err != nil || ok {
		t.Fatalf("TableExists before Migrate = %v, %v; want false", ok, err)
	}
	if cols, err := d.Columns(ctx, s.h.Ex, tb); err != nil || len(cols) != 0 {
		t.Fatalf("Columns before Migrate = %v, %v; want none", cols, err)
	}
	for i := range 2 {
		if err := d.Migrate(ctx, s.h.Ex, tb); err != nil {
			t.Fatalf("Migrate #%d: %v", i+1, err)
		}
	}
	if ok, err := d.TableExists(ctx, s.h.Ex, tb); err != nil || !ok {
		t.Fatalf("TableExists after Migrate = %v, %v; want true", ok, err)
	}
	cols, err := d.Columns(ctx, s.h.Ex, tb)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{"sequence", "id", "topic", "payload", "headers", "ordering_key", "idempotency_key", "created_at", "attempts",
		"last_error", "last_error_class", "next_attempt_at", "lease_until", "leased_by", "published_at", "dead_lettered_at", "delivery_starts"} {
		if !cols[c] {
			t.Errorf("Columns after Migrate = %v: no %s", cols, c)
		}
	}
	if cols["tenant"] {
		t.Errorf("Columns lists tenant before it was added")
	}
	seq := s.insert(t, tb, ev("a", "", ""))
	if got := len(s.rows(t, tb)); got != 1 || seq[0] <= 0 {
		t.Fatalf("after insert: %d rows, sequence %d", got, seq[0])
	}

	// Migrate adds an extra column an existing table lacks.
	grown := *tb
	grown.Extra = []dialect.Column{{Name: "tenant", Type: s.h.TextType}}
	if err := d.Migrate(ctx, s.h.Ex, &grown); err != nil {
		t.Fatalf("Migrate with a new extra column: %v", err)
	}
	if cols, err := d.Columns(ctx, s.h.Ex, &grown); err != nil || !cols["tenant"] {
		t.Fatalf("Columns after adding tenant = %v, %v", cols, err)
	}
	x := ev("a", "", "")
	x.Extra = ptr(`{"tenant":"t1"}`)
	if _, err := s.insertRes(t, &dialect.InsertParams{Table: &grown, Rows: []dialect.InsertRow{x}, ExtraNames: []string{"tenant"}}); err != nil {
		t.Fatalf("Insert into the added column: %v", err)
	}
	evs := s.claim(t, d.NewRelay(&grown, cfg(10, 10), all), 10, "grown")
	if len(evs) != 2 || len(evs[0].Extra) != 1 {
		t.Fatalf("claimed %+v from the grown table, want 2 events with the extra column", evs)
	}

	st := s.h.Table(t)
	stmts := d.Statements(st)
	if len(stmts) == 0 {
		t.Fatal("Statements returned nothing")
	}
	for round := range 2 {
		for _, q := range stmts {
			if _, err := s.h.Ex.Exec(ctx, q); err != nil {
				t.Fatalf("Statements round %d: %s: %v", round+1, q, err)
			}
		}
	}
	if ok, err := d.TableExists(ctx, s.h.Ex, st); err != nil || !ok {
		t.Fatalf("TableExists after Statements = %v, %v; want true", ok, err)
	}
	if err := d.Migrate(ctx, s.h.Ex, st); err != nil {
		t.Fatalf("Migrate after Statements: %v", err)
	}
	r := d.NewRelay(st, cfg(10, 10), all)
	seqs := s.insert(t, st, ev("a", "k", ""), ev("a", "", ""))
	wantSeqs(t, "claim on the Statements' table", s.claim(t, r, 10, "tok"), seqs...)
}

// scopeMigration: a table with the global idempotency index refuses a scoped config with a
// *dialect.ScopeMismatch until ScopeMigration's statements ran, and the index then scopes keys.
func (s *suite) scopeMigration(t *testing.T) {
	ctx := context.Background()
	d := s.h.Dialect
	tenant := dialect.Column{Name: "tenant", Type: s.h.TextType}
	tb := s.table(t, func(tb *dialect.Table) { tb.Extra = []dialect.Column{tenant} })
	scoped := *tb
	scoped.Scope = []string{"tenant"}
	err := d.Migrate(ctx, s.h.Ex, &scoped)
	var sm *dialect.ScopeMismatch
	if !errors.As(err, &sm) {
		t.Fatalf("Migrate with a scope over the global index: %v, want a *dialect.ScopeMismatch", err)
	}
	stmts, err := d.ScopeMigration(&scoped)
	if err != nil || len(stmts) == 0 {
		t.Fatalf("ScopeMigration: %v, %d statements", err, len(stmts))
	}
	for _, q := range stmts {
		if _, err := s.h.Ex.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	if err := d.Migrate(ctx, s.h.Ex, &scoped); err != nil {
		t.Fatalf("Migrate after ScopeMigration: %v", err)
	}
	if err := d.Migrate(ctx, s.h.Ex, tb); !errors.As(err, &sm) {
		t.Fatalf("unscoped Migrate over the scoped index: %v, want a *dialect.ScopeMismatch", err)
	}
	a, b := ev("t", "", "same"), ev("t", "", "same")
	a.Extra, b.Extra = ptr(`{"tenant":"a"}`), ptr(`{"tenant":"b"}`)
	if _, err := s.insertRes(t, &dialect.InsertParams{Table: &scoped, Rows: []dialect.InsertRow{a, b}, ExtraNames: []string{"tenant"}}); err != nil {
		t.Fatalf("Insert: %v", err)
	}
	if got := len(s.rows(t, tb)); got != 2 {
		t.Fatalf("one idempotency key in two scopes: %d rows, want 2", got)
	}
	// And back to the global index, once the key is stored once.
	s.exec(t, tb, `DELETE FROM {t} WHERE "id" = $1`, b.ID)
	if stmts, err = d.ScopeMigration(tb); err != nil || len(stmts) == 0 {
		t.Fatalf("ScopeMigration to unscoped: %v, %d statements", err, len(stmts))
	}
	for _, q := range stmts {
		if _, err := s.h.Ex.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	if err := d.Migrate(ctx, s.h.Ex, tb); err != nil {
		t.Fatalf("unscoped Migrate after ScopeMigration: %v", err)
	}
	if err := d.Migrate(ctx, s.h.Ex, &scoped); !errors.As(err, &sm) {
		t.Fatalf("scoped Migrate over the global index again: %v, want a *dialect.ScopeMismatch", err)
	}
}

// insert: one Stored per inserted row, in input order, sequences ascending; NoReturn may
// return nothing but stores every row.
func (s *suite) insertRows(t *testing.T) {
	tb := s.table(t)
	rows := []dialect.InsertRow{ev("a", "k1", ""), ev("b", "k1", ""), ev("c", "", ""), ev("a", "k2", "")}
	st, err := s.insertRes(t, &dialect.InsertParams{Table: tb, Rows: rows})
	if err != nil {
		t.Fatal(err)
	}
	if len(st) != len(rows) {
		t.Fatalf("Insert returned %d events, want %d", len(st), len(rows))
	}
	stored := s.rows(t, tb)
	for i, r := range rows {
		g := st[i]
		if g.Duplicate || g.ID != r.ID || g.Topic != r.Topic || strOf(g.OrderingKey) != strOf(r.OrderingKey) || g.IdempotencyKey != nil || g.CreatedAt.IsZero() {
			t.Errorf("Stored[%d] = %+v, want the inserted %s (%s, key %s)", i, g, r.ID, r.Topic, strOf(r.OrderingKey))
		}
		if stored[i].ID != r.ID || stored[i].Seq != g.Sequence {
			t.Errorf("row %d: stored %v, Insert said sequence %d id %s", i, stored[i], g.Sequence, r.ID)
		}
		if i > 0 && g.Sequence <= st[i-1].Sequence {
			t.Errorf("sequences not ascending in input order: %d after %d", g.Sequence, st[i-1].Sequence)
		}
	}
	evs := s.claim(t, s.h.Dialect.NewRelay(tb, cfg(10, 10), all), 10, "read")
	if len(evs) != len(rows) {
		t.Fatalf("claimed %d events, want %d", len(evs), len(rows))
	}
	slices.SortFunc(evs, func(x, y dialect.Claimed) int { return int(x.Sequence - y.Sequence) })
	for i, e := range evs {
		r, g := rows[i], st[i]
		if e.Sequence != g.Sequence || e.ID != r.ID || e.Topic != r.Topic || string(e.Payload) != string(r.Payload) || e.Headers != r.Headers ||
			strOf(e.OrderingKey) != strOf(r.OrderingKey) || !e.CreatedAt.Equal(g.CreatedAt) || e.Attempts != 0 || e.LastError != nil || e.DeliveryStarts != 1 {
			t.Errorf("claimed %+v, want the inserted %+v stored as %+v", e, r, g)
		}
	}
	nr, err := s.insertRes(t, &dialect.InsertParams{Table: tb, Rows: []dialect.InsertRow{ev("a", "", ""), ev("a", "k1", "")}, NoReturn: true})
	if err != nil {
		t.Fatal(err)
	}
	if nr != nil && len(nr) != 2 {
		t.Fatalf("NoReturn Insert returned %d events, want none or 2", len(nr))
	}
	if got := len(s.rows(t, tb)); got != 6 {
		t.Fatalf("%d rows after the NoReturn insert, want 6", got)
	}
	// An id already stored (no idempotency key) is an error.
	again := ev("a", "", "")
	again.ID = rows[2].ID
	if _, err := s.insertRes(t, &dialect.InsertParams{Table: tb, Rows: []dialect.InsertRow{ev("a", "", ""), again}}); err == nil {
		t.Fatal("Insert of a stored id: no error")
	}
	if got := len(s.rows(t, tb)); got != 6 {
		t.Fatalf("%d rows after the refused insert, want 6", got)
	}
}

// insertIdempotent: a repeated idempotency key stores nothing; the stored event is what
// Insert returns for it (Duplicate, one Stored per row) and what ReadStored reads.
func (s *suite) insertIdempotent(t *testing.T) {
	ctx := context.Background()
	d := s.h.Dialect
	tb := s.table(t)
	first, err := s.insertRes(t, &dialect.InsertParams{Table: tb, Rows: []dialect.InsertRow{ev("a", "k", "i1")}})
	if err != nil || len(first) != 1 || first[0].Duplicate || strOf(first[0].IdempotencyKey) != "i1" {
		t.Fatalf("first Insert: %+v, %v", first, err)
	}
	again := []dialect.InsertRow{ev("a", "", "i2"), ev("a", "k", "i1"), ev("b", "", "")}
	st, err := s.insertRes(t, &dialect.InsertParams{Table: tb, Rows: again})
	if err != nil {
		t.Fatalf("repeat Insert: %v", err)
	}
	rows := s.rows(t, tb)
	if len(rows) != 3 {
		t.Fatalf("%d rows after a repeated key, want 3: %v", len(rows), rows)
	}
	if rows[0].ID != first[0].ID || rows[1].ID != again[0].ID || rows[2].ID != again[2].ID {
		t.Fatalf("rows %v, want %s, %s, %s", rows, first[0].ID, again[0].ID, again[2].ID)
	}
	if len(st) != 3 || st[0].Duplicate || st[0].ID != again[0].ID || !st[1].Duplicate || st[1].Sequence != first[0].Sequence ||
		st[1].ID != first[0].ID || st[2].Duplicate || st[2].ID != again[2].ID {
		t.Fatalf("Insert returned %+v, want the new event, the stored one (Duplicate) and the new one", st)
	}
	got, err := d.ReadStored(ctx, s.h.Ex, tb, []string{"i1", "nope"})
	if err != nil || len(got) != 1 || got[0].Sequence != first[0].Sequence || got[0].ID != first[0].ID || strOf(got[0].OrderingKey) != "k" ||
		strOf(got[0].IdempotencyKey) != "i1" || !got[0].CreatedAt.Equal(first[0].CreatedAt) {
		t.Fatalf("ReadStored(i1) = %+v, %v; want %+v", got, err, first[0])
	}
}

// insertExtra: extra columns are stored and claimed; ResolveScoped tells an unscoped table's
// stored event with other extra values apart (Same false), and Insert refuses
// such a write with *dialect.IdempotencyConflict.
func (s *suite) insertExtra(t *testing.T) {
	ctx := context.Background()
	d := s.h.Dialect
	tb := s.table(t, func(tb *dialect.Table) { tb.Extra = []dialect.Column{{Name: "tenant", Type: s.h.TextType}} })
	a, plain := ev("a", "", "i1"), ev("a", "", "")
	a.Extra = ptr(`{"tenant":"acme"}`)
	st, err := s.insertRes(t, &dialect.InsertParams{Table: tb, Rows: []dialect.InsertRow{a, plain}, ExtraNames: []string{"tenant"}})
	if err != nil || len(st) != 2 {
		t.Fatalf("Insert: %+v, %v", st, err)
	}
	evs := s.claim(t, d.NewRelay(tb, cfg(10, 10), all), 10, "tok")
	if len(evs) != 2 {
		t.Fatalf("claimed %d, want 2", len(evs))
	}
	for _, e := range evs {
		want := "acme"
		if e.ID == plain.ID {
			want = "<nil>"
		}
		if len(e.Extra) != 1 || (e.Extra[0] == nil && want != "<nil>") || (e.Extra[0] != nil && text(e.Extra[0]) != want) {
			t.Errorf("claimed %s with Extra %v, want [%s]", e.ID, e.Extra, want)
		}
	}
	res, err := d.ResolveScoped(ctx, s.h.Ex, tb, []dialect.Probe{
		{Index: 4, Key: "i1", Extra: map[string]any{"tenant": "acme"}},
		{Index: 7, Key: "i1", Extra: map[string]any{"tenant": "other"}},
		{Index: 9, Key: "none", Extra: map[string]any{"tenant": "acme"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(res, func(x, y dialect.Resolved) int { return x.Index - y.Index })
	if len(res) != 2 || res[0].Index != 4 || !res[0].Same || res[0].Sequence != st[0].Sequence || res[0].ID != a.ID ||
		res[1].Index != 7 || res[1].Same || res[1].Sequence != st[0].Sequence {
		t.Fatalf("ResolveScoped = %+v; want probe 4 the same event, probe 7 another tenant's (Same false), none for 9", res)
	}
	b := ev("a", "", "i1")
	b.Extra = ptr(`{"tenant":"other"}`)
	_, err = s.insertRes(t, &dialect.InsertParams{Table: tb, Rows: []dialect.InsertRow{ev("a", "", ""), b}, ExtraNames: []string{"tenant"}})
	var c *dialect.IdempotencyConflict
	if !errors.As(err, &c) || c.Index != 1 || c.Key != "i1" {
		t.Fatalf("Insert of another tenant's key: %v, want *IdempotencyConflict{Index 1, Key i1}", err)
	}
	if got := len(s.rows(t, tb)); got != 2 {
		t.Fatalf("%d rows after the refused write, want 2", got)
	}
}

// insertScoped: with an idempotency scope one key is stored once per scope value.
func (s *suite) insertScoped(t *testing.T) {
	ctx := context.Background()
	d := s.h.Dialect
	tb := s.table(t, func(tb *dialect.Table) {
		tb.Extra = []dialect.Column{{Name: "tenant", Type: s.h.TextType}}
		tb.Scope = []string{"tenant"}
	})
	row := func(tenant string) dialect.InsertRow {
		r := ev("a", "", "k")
		r.Extra = ptr(`{"tenant":"` + tenant + `"}`)
		return r
	}
	a, b, a2 := row("a"), row("b"), row("a")
	if _, err := s.insertRes(t, &dialect.InsertParams{Table: tb, Rows: []dialect.InsertRow{a, b}, ExtraNames: []string{"tenant"}}); err != nil {
		t.Fatal(err)
	}
	st, err := s.insertRes(t, &dialect.InsertParams{Table: tb, Rows: []dialect.InsertRow{a2}, ExtraNames: []string{"tenant"}})
	if err != nil {
		t.Fatal(err)
	}
	rows := s.rows(t, tb)
	if len(rows) != 2 || rows[0].ID != a.ID || rows[1].ID != b.ID {
		t.Fatalf("rows %v, want a's and b's", rows)
	}
	if len(st) != 1 || !st[0].Duplicate || st[0].ID != a.ID {
		t.Fatalf("repeat in scope a returned %+v, want a's event as Duplicate", st)
	}
	res, err := d.ResolveScoped(ctx, s.h.Ex, tb, []dialect.Probe{{Index: 0, Key: "k", Extra: map[string]any{"tenant": "b"}}, {Index: 1, Key: "k", Extra: map[string]any{"tenant": "c"}}})
	if err != nil || len(res) != 1 || res[0].Index != 0 || res[0].ID != b.ID || !res[0].Same {
		t.Fatalf("ResolveScoped = %+v, %v; want b's event for probe 0 only", res, err)
	}
}

// insertNotify (Capabilities.Notify): a committed Insert announces each distinct topic once,
// topics longer than MaxNotifyTopicBytes as ""; a rolled-back one announces nothing.
func (s *suite) insertNotify(t *testing.T) {
	if !s.h.Dialect.Capabilities().Notify {
		t.Skip("no Capabilities.Notify")
	}
	if s.h.Listen == nil {
		t.Fatal("the dialect has Capabilities.Notify but the harness no Listen")
	}
	ctx := context.Background()
	tb := s.table(t)
	channel := tb.Name() + "_n"
	got := s.h.Listen(t, channel)
	rollback := errors.New("rollback")
	err := s.inTx(ctx, func(ex dialect.Executor) error {
		if _, err := s.h.Dialect.Insert(ctx, ex, &dialect.InsertParams{Table: tb, Rows: []dialect.InsertRow{ev("gone", "", "")}, Notify: channel, MaxNotifyTopicBytes: 5}); err != nil {
			return err
		}
		return rollback
	})
	if !errors.Is(err, rollback) {
		t.Fatal(err)
	}
	for _, rows := range [][]dialect.InsertRow{{ev("short", "", ""), ev("short", "k", ""), ev("toolong", "", "")}, {ev("end", "", "")}} {
		if _, err := s.insertRes(t, &dialect.InsertParams{Table: tb, Rows: rows, Notify: channel, MaxNotifyTopicBytes: 5}); err != nil {
			t.Fatal(err)
		}
	}
	var notes []string
	deadline := time.After(10 * time.Second)
	for len(notes) == 0 || notes[len(notes)-1] != "end" {
		select {
		case n := <-got:
			notes = append(notes, n)
		case <-deadline:
			t.Fatalf("notifications %q, no \"end\" within 10 s", notes)
		}
	}
	slices.Sort(notes[:len(notes)-1])
	if want := []string{"", "short", "end"}; !slices.Equal(notes, want) {
		t.Fatalf("notifications %q, want %q", notes, want)
	}
}

// insertKeyOrder: a transaction writing an ordering key waits for an open transaction that
// wrote the same key (per-key commit order), not for one that wrote another key, and commits
// after it with a later sequence.
func (s *suite) insertKeyOrder(t *testing.T) {
	tb := s.table(t)
	a, b, c := ev("a", "k", ""), ev("a", "k", ""), ev("a", "other", "")
	if _, err := s.waitingWrite(t, tb, a, b, true, func() {
		if _, err := s.insertRes(t, &dialect.InsertParams{Table: tb, Rows: []dialect.InsertRow{c}}); err != nil {
			t.Errorf("a write of another key beside A and B: %v", err)
		}
	}); err != nil {
		t.Fatalf("B: %v", err)
	}
	rows := s.rows(t, tb)
	seqOf := map[string]int64{}
	for _, r := range rows {
		seqOf[r.ID] = r.Seq
	}
	if len(rows) != 3 || seqOf[a.ID] == 0 || seqOf[b.ID] <= seqOf[a.ID] || seqOf[c.ID] == 0 {
		t.Fatalf("rows %v: want A's, B's after it, and C's", rows)
	}
}

// insertIdempotentRace: a write of an idempotency key an open transaction wrote waits for it;
// when that one commits, the write stores nothing and finds the stored event; when it rolls
// back, the write stores its own.
func (s *suite) insertIdempotentRace(t *testing.T) {
	for _, commit := range []bool{true, false} {
		t.Run(map[bool]string{true: "commit", false: "rollback"}[commit], func(t *testing.T) {
			tb := s.table(t)
			a, b := ev("a", "", "same"), ev("a", "", "same")
			st, err := s.waitingWrite(t, tb, a, b, commit, nil)
			if err != nil {
				t.Fatalf("B: %v", err)
			}
			rows := s.rows(t, tb)
			want := map[bool]string{true: a.ID, false: b.ID}[commit]
			if len(rows) != 1 || rows[0].ID != want {
				t.Fatalf("rows %v, want only %s", rows, want)
			}
			for _, g := range st {
				if g.Duplicate != commit || g.ID != want {
					t.Fatalf("B's Insert returned %+v; want %s (Duplicate %v)", st, want, commit)
				}
			}
			if len(st) != 1 {
				t.Fatalf("B's Insert returned %d events, want 1", len(st))
			}
		})
	}
}

// waitingWrite writes a in transaction A, then b in transaction B, which must wait for A (a
// lock of the database, Harness.Waiting); beside runs while B waits; then A commits (or rolls
// back) and B's result is returned.
func (s *suite) waitingWrite(t *testing.T, tb *dialect.Table, a, b dialect.InsertRow, commit bool, beside func()) ([]dialect.Stored, error) {
	t.Helper()
	if s.h.Session == nil || s.h.Waiting == nil {
		t.Skip("one writer: transactions commit in the order they began")
	}
	ctx := context.Background()
	inserted, release, aDone := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	rollback := errors.New("rollback")
	go func() {
		aDone <- s.inTx(ctx, func(ex dialect.Executor) error {
			_, err := s.h.Dialect.Insert(ctx, ex, &dialect.InsertParams{Table: tb, Rows: []dialect.InsertRow{a}})
			close(inserted)
			if err != nil {
				return err
			}
			<-release
			if !commit {
				return rollback
			}
			return nil
		})
	}()
	<-inserted
	type result struct {
		st  []dialect.Stored
		err error
	}
	session, bDone := make(chan int64, 1), make(chan result, 1)
	go func() {
		var st []dialect.Stored
		err := s.inTx(ctx, func(ex dialect.Executor) error {
			id, err := s.h.Session(ctx, ex)
			if err != nil {
				close(session)
				return err
			}
			session <- id
			st, err = s.h.Dialect.Insert(ctx, ex, &dialect.InsertParams{Table: tb, Rows: []dialect.InsertRow{b}})
			return err
		})
		bDone <- result{st, err}
	}()
	fail := func(format string, args ...any) {
		t.Helper()
		close(release)
		<-aDone
		t.Fatalf(format, args...)
	}
	id, ok := <-session
	if !ok {
		fail("B: %v", (<-bDone).err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		w, err := s.h.Waiting(ctx, id)
		if err != nil {
			fail("Waiting: %v", err)
		}
		if w {
			break
		}
		select {
		case r := <-bDone:
			fail("B's write ended (%v) while A's write of the same key was uncommitted", r.err)
		default:
		}
		if time.Now().After(deadline) {
			fail("B's write is not waiting for A's open transaction after 10 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if beside != nil {
		beside()
	}
	close(release)
	if err := <-aDone; err != nil && !errors.Is(err, rollback) {
		t.Fatalf("A: %v", err)
	}
	r := <-bDone
	return r.st, r.err
}
