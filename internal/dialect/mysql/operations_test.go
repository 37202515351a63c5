package mysql

import (
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/watermill-outbox/outbox/internal/dialect"
)

func TestDeadLetterOperations(t *testing.T) {
	tb := newTable(t)
	d, ctx := New(), context.Background()
	out := mustInsert(t, tb, ev("lib.a", `{"x":1}`, "k", "ik"), ev("lib.a", `2`, "k", ""), ev("lib_b", `3`, "", ""), ev("other", `4`, "", ""))
	table := namesOf(tb).table
	exec(t, "UPDATE "+table+" SET dead_lettered_at = UTC_TIMESTAMP(6) - INTERVAL 2 HOUR, attempts = 5, last_error = 'boom' WHERE sequence IN (?, ?)", out[0].Sequence, out[2].Sequence)
	exec(t, "UPDATE "+table+" SET dead_lettered_at = UTC_TIMESTAMP(6), attempts = 5 WHERE sequence = ?", out[3].Sequence)
	allDead := dialect.DeadFilter{Topics: []dialect.Topic{{All: true}}}
	rows, err := d.ListDead(ctx, sqlEx(testDB), tb, allDead, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 3 || rows[0].Sequence != out[0].Sequence || rows[1].Sequence != out[2].Sequence || rows[2].Sequence != out[3].Sequence {
		t.Fatalf("ListDead = %+v", rows)
	}
	r0 := rows[0]
	if r0.ID != out[0].ID || r0.Topic != "lib.a" || string(r0.Payload) != `{"x":1}` || r0.Headers != "{}" || *r0.OrderingKey != "k" || *r0.IdempotencyKey != "ik" ||
		r0.Attempts != 5 || *r0.LastError != "boom" || time.Since(r0.DeadLetteredAt) < 119*time.Minute || !r0.CreatedAt.Equal(out[0].CreatedAt) {
		t.Errorf("dead row %+v", r0)
	}
	// Filters: a prefix ('_' ordinary), ids, age.
	pfx := dialect.DeadFilter{Topics: []dialect.Topic{{Prefix: true, Value: "lib_"}}}
	if rows, _ := d.ListDead(ctx, sqlEx(testDB), tb, pfx, 10); len(rows) != 1 || rows[0].Sequence != out[2].Sequence {
		t.Errorf("prefix lib_: %+v", rows)
	}
	byID := dialect.DeadFilter{IDs: []string{out[3].ID, out[1].ID}}
	if rows, _ := d.ListDead(ctx, sqlEx(testDB), tb, byID, 10); len(rows) != 1 || rows[0].Sequence != out[3].Sequence {
		t.Errorf("by ids: %+v", rows)
	}
	old := dialect.DeadFilter{Topics: []dialect.Topic{{All: true}}, OlderThan: time.Hour}
	if rows, _ := d.ListDead(ctx, sqlEx(testDB), tb, old, 1); len(rows) != 1 || rows[0].Sequence != out[0].Sequence {
		t.Errorf("older than an hour, limit 1: %+v", rows)
	}
	if rows, _ := d.ListDead(ctx, sqlEx(testDB), tb, dialect.DeadFilter{}, 10); len(rows) != 0 {
		t.Errorf("empty filter selected %d", len(rows))
	}
	// Retry the old ones, purge the rest.
	n, err := d.RetryDead(ctx, sqlEx(testDB), tb, old)
	if err != nil || n != 2 {
		t.Fatalf("RetryDead = %d, %v; want 2", n, err)
	}
	var att int
	var dead, next *time.Time
	if err := testDB.QueryRow("SELECT attempts, dead_lettered_at, next_attempt_at FROM "+table+" WHERE sequence = ?", out[0].Sequence).Scan(&att, nullTime{&dead}, nullTime{&next}); err != nil || att != 0 || dead != nil || next != nil {
		t.Fatalf("retried event: attempts %d dead %v next %v (%v)", att, dead, next, err)
	}
	n, err = d.PurgeDead(ctx, sqlEx(testDB), tb, allDead)
	if err != nil || n != 1 {
		t.Fatalf("PurgeDead = %d, %v; want 1", n, err)
	}
	if ids := queryInt64s(t, "SELECT COUNT(*) FROM "+table)[0]; ids != 3 {
		t.Fatalf("%d rows left, want 3", ids)
	}
}

func TestCleanup(t *testing.T) {
	tb := newTable(t)
	d, ctx := New(), context.Background()
	rows := make([]dialect.InsertRow, 7)
	for i := range rows {
		rows[i] = ev("t", `1`, "", "")
	}
	out := mustInsert(t, tb, rows...)
	table := namesOf(tb).table
	exec(t, "UPDATE "+table+" SET published_at = UTC_TIMESTAMP(6) - INTERVAL 2 DAY WHERE sequence <= ?", out[4].Sequence)
	exec(t, "UPDATE "+table+" SET published_at = UTC_TIMESTAMP(6) WHERE sequence = ?", out[5].Sequence)
	exec(t, "UPDATE "+table+" SET dead_lettered_at = UTC_TIMESTAMP(6) - INTERVAL 2 DAY WHERE sequence = ?", out[6].Sequence)
	n, err := d.Cleanup(ctx, sqlEx(testDB), tb, "published_at", 24*time.Hour, 3)
	if err != nil || n != 3 {
		t.Fatalf("Cleanup batch 3 = %d, %v", n, err)
	}
	n, err = d.Cleanup(ctx, sqlEx(testDB), tb, "published_at", 24*time.Hour, 3)
	if err != nil || n != 2 {
		t.Fatalf("second Cleanup = %d, %v; want the 2 left", n, err)
	}
	n, err = d.Cleanup(ctx, sqlEx(testDB), tb, "dead_lettered_at", 24*time.Hour, 100)
	if err != nil || n != 1 {
		t.Fatalf("Cleanup dead letters = %d, %v", n, err)
	}
	if got := queryInt64s(t, "SELECT sequence FROM "+table); !reflect.DeepEqual(got, []int64{out[5].Sequence}) {
		t.Fatalf("left %v, want the recent one", got)
	}
	if _, err := d.Cleanup(ctx, sqlEx(testDB), tb, "created_at", time.Hour, 10); err == nil {
		t.Fatal("Cleanup of created_at accepted")
	}
}

// TestBacklogByTopicNeverFailed: a topic whose pending events never failed (last_error NULL
// throughout) has 0 unavailable and 0 held, not NULL.
func TestBacklogByTopicNeverFailed(t *testing.T) {
	tb := newTable(t)
	d, ctx := New(), context.Background()
	mustInsert(t, tb, ev("fresh", `1`, "k", ""), ev("fresh", `2`, "k", ""), ev("fresh", `3`, "", ""))
	rows, err := d.BacklogByTopic(ctx, sqlEx(testDB), tb)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 {
		t.Fatalf("BacklogByTopic = %+v, want one topic", rows)
	}
	rows[0].Oldest, rows[0].Now = time.Time{}, time.Time{}
	if want := (dialect.BacklogRow{Topic: "fresh", Pending: 3}); rows[0] != want {
		t.Fatalf("BacklogByTopic = %+v, want %+v", rows[0], want)
	}
}

func TestBacklog(t *testing.T) {
	tb := newTable(t)
	d, ctx := New(), context.Background()
	b, err := d.Backlog(ctx, sqlEx(testDB), tb)
	if err != nil || b.Pending != 0 || !b.Oldest.IsZero() || b.Held != 0 || b.Now.IsZero() {
		t.Fatalf("empty Backlog = %+v, %v", b, err)
	}
	// a: failed head + 2 held; b: dead head + 1 held (+1 dead successor, not held);
	// c: unavailable head (not failed) + 1; unordered: 2, one unavailable; 1 published.
	// Unavailable counts every pending event of a topic with an unavailable one (y: 4, z: 1).
	out := mustInsert(t, tb,
		ev("x", `1`, "a", ""), ev("x", `1`, "a", ""), ev("y", `1`, "a", ""),
		ev("x", `1`, "b", ""), ev("y", `1`, "b", ""), ev("y", `1`, "b", ""),
		ev("y", `1`, "c", ""), ev("y", `1`, "c", ""),
		ev("x", `1`, "", ""), ev("z", `1`, "", ""), ev("z", `1`, "d", ""))
	table := namesOf(tb).table
	s := func(i int) int64 { return out[i].Sequence }
	exec(t, "UPDATE "+table+" SET created_at = UTC_TIMESTAMP(6) - INTERVAL 1 HOUR WHERE sequence = ?", s(1))
	exec(t, "UPDATE "+table+" SET attempts = 1, next_attempt_at = UTC_TIMESTAMP(6) + INTERVAL 1 HOUR, created_at = UTC_TIMESTAMP(6) - INTERVAL 3 HOUR WHERE sequence = ?", s(0))
	exec(t, "UPDATE "+table+" SET dead_lettered_at = UTC_TIMESTAMP(6) WHERE sequence IN (?, ?)", s(3), s(5))
	exec(t, "UPDATE "+table+" SET last_error = 'unavailable: down', last_error_class = 'unavailable' WHERE sequence IN (?, ?)", s(6), s(9))
	// x's failed head reads like an outage but is classed a failure: not counted.
	exec(t, "UPDATE "+table+" SET last_error = 'unavailable: looks like it', last_error_class = 'failure' WHERE sequence = ?", s(0))
	exec(t, "UPDATE "+table+" SET published_at = UTC_TIMESTAMP(6), outbox_key = NULL, created_at = UTC_TIMESTAMP(6) - INTERVAL 9 HOUR WHERE sequence = ?", s(10))
	b, err = d.Backlog(ctx, sqlEx(testDB), tb)
	if err != nil {
		t.Fatal(err)
	}
	age := b.Now.Sub(b.Oldest)
	b.Oldest, b.Now = time.Time{}, time.Time{}
	if want := (dialect.BacklogRow{Pending: 8, DeadLettered: 2, Unavailable: 5, Held: 3}); b != want {
		t.Fatalf("Backlog = %+v, want %+v", b, want)
	}
	if age < 3*time.Hour-time.Minute || age > 3*time.Hour+time.Minute {
		t.Errorf("oldest pending age %v, want 3h", age)
	}
	rows, err := d.BacklogByTopic(ctx, sqlEx(testDB), tb)
	if err != nil {
		t.Fatal(err)
	}
	for i := range rows {
		if rows[i].Now.IsZero() {
			t.Errorf("topic %s: no clock", rows[i].Topic)
		}
		rows[i].Now = time.Time{}
		if rows[i].Topic == "x" && b.Oldest.IsZero() {
			if a := time.Since(rows[i].Oldest); a < 3*time.Hour-time.Minute || a > 3*time.Hour+time.Minute {
				t.Errorf("x oldest age %v", a)
			}
		}
		rows[i].Oldest = time.Time{}
	}
	want := []dialect.BacklogRow{
		{Topic: "x", Pending: 3, DeadLettered: 1, Held: 1},
		{Topic: "y", Pending: 4, DeadLettered: 1, Unavailable: 4, Held: 2},
		{Topic: "z", Pending: 1, Unavailable: 1},
	}
	if !reflect.DeepEqual(rows, want) {
		t.Fatalf("BacklogByTopic = %+v, want %+v", rows, want)
	}
}
