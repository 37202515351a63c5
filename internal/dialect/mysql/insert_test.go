package mysql

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/watermill-outbox/outbox/internal/dialect"
)

func TestInsertReturnsEventsInOrder(t *testing.T) {
	tb := newTable(t)
	before := time.Now().UTC().Add(-2 * time.Second)
	rows := []dialect.InsertRow{ev("a", `{"b": 1,  "a": [2]}`, "k1", ""), ev("b", `"x"`, "", ""), ev("a", `3`, "k1", "i1")}
	rows[1].Headers = `{"h":"v"}`
	out := mustInsert(t, tb, rows...)
	if len(out) != 3 {
		t.Fatalf("got %d stored events, want 3", len(out))
	}
	for i, s := range out {
		r := rows[i]
		if s.Duplicate || s.ID != r.ID || s.Topic != r.Topic || (s.OrderingKey == nil) != (r.OrderingKey == nil) || (s.IdempotencyKey == nil) != (r.IdempotencyKey == nil) {
			t.Errorf("event %d = %+v, want row %+v", i, s, r)
		}
		if i > 0 && s.Sequence != out[i-1].Sequence+1 {
			t.Errorf("sequence %d after %d, want consecutive", s.Sequence, out[i-1].Sequence)
		}
		if s.CreatedAt.Before(before) || s.CreatedAt.After(time.Now().UTC().Add(2*time.Second)) || s.CreatedAt.Location() != time.UTC {
			t.Errorf("created_at %v not now (UTC)", s.CreatedAt)
		}
	}
	// The payload's bytes are kept as written (no JSON normalisation); headers too.
	var payload, headers string
	if err := testDB.QueryRow("SELECT payload, headers FROM "+namesOf(tb).table+" WHERE sequence = ?", out[0].Sequence).Scan(&payload, &headers); err != nil {
		t.Fatal(err)
	}
	if payload != `{"b": 1,  "a": [2]}` || headers != "{}" {
		t.Errorf("stored payload %q headers %q", payload, headers)
	}
	// The writes locked existing stripe rows (Migrate made them all): no row was added.
	var rowsN, stripesN int64
	if err := testDB.QueryRow("SELECT COUNT(*), SUM(ordering_key IN (?, ?)) FROM "+namesOf(tb).keys, stripe("i", "i1"), stripe("o", "k1")).Scan(&rowsN, &stripesN); err != nil {
		t.Fatal(err)
	}
	if rowsN != 2*lockStripes || stripesN != 2 {
		t.Errorf("key-lock table: %d rows (want %d), the stripes of i1 and k1 present: %d (want 2)", rowsN, 2*lockStripes, stripesN)
	}
}

func TestInsertIdempotencyKeys(t *testing.T) {
	tb := newTable(t)
	first := mustInsert(t, tb, ev("t", `1`, "", "ik"))[0]
	// The key again (new id): the stored event, Duplicate; also twice in one call, next to a
	// new key.
	out := mustInsert(t, tb, ev("t", `2`, "", "ik"), ev("t", `3`, "", "new"), ev("t", `4`, "", "new"))
	if !out[0].Duplicate || out[0].ID != first.ID || out[0].Sequence != first.Sequence || !out[0].CreatedAt.Equal(first.CreatedAt) {
		t.Errorf("repeat = %+v, want the stored %+v as Duplicate", out[0], first)
	}
	if out[1].Duplicate || !out[2].Duplicate || out[2].ID != out[1].ID || out[2].Sequence != out[1].Sequence {
		t.Errorf("same key twice in one call: %+v, %+v", out[1], out[2])
	}
	if n := queryInt64s(t, "SELECT COUNT(*) FROM "+namesOf(tb).table)[0]; n != 2 {
		t.Errorf("%d rows, want 2", n)
	}
	// The same event id under another key is an error, not absorbed.
	dup := ev("t", `5`, "", "other")
	dup.ID = first.ID
	_, err := New().Insert(context.Background(), sqlEx(testDB), &dialect.InsertParams{Table: tb, Rows: []dialect.InsertRow{dup}})
	if !errors.Is(err, ErrDuplicateEventID) {
		t.Fatalf("duplicate id under another key: %v, want ErrDuplicateEventID", err)
	}
	// And without a key: the unique key's error, mapped alike.
	dup.IdempotencyKey = nil
	_, err = New().Insert(context.Background(), sqlEx(testDB), &dialect.InsertParams{Table: tb, Rows: []dialect.InsertRow{dup}})
	if !errors.Is(err, ErrDuplicateEventID) {
		t.Fatalf("duplicate id without a key: %v, want ErrDuplicateEventID", err)
	}
}

// A concurrent writer of the same idempotency key waits for the first: it sees the first's
// event when it commits (also in a REPEATABLE READ snapshot taken before), and writes its own
// when the first rolls back.
func TestInsertIdempotencyKeyConcurrent(t *testing.T) {
	db := needDB(t)
	tb := newTable(t)
	ctx := context.Background()
	for _, commit := range []bool{true, false} {
		key := map[bool]string{true: "c1", false: "c2"}[commit]
		tx1, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		a, err := New().Insert(ctx, sqlEx(tx1), &dialect.InsertParams{Table: tb, Rows: []dialect.InsertRow{ev("t", `1`, "", key)}})
		if err != nil {
			t.Fatal(err)
		}
		tx2, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead})
		if err != nil {
			t.Fatal(err)
		}
		var one int
		if err := tx2.QueryRow("SELECT COUNT(*) FROM " + namesOf(tb).table).Scan(&one); err != nil { // the snapshot
			t.Fatal(err)
		}
		type result struct {
			out []dialect.Stored
			err error
		}
		done := make(chan result, 1)
		go func() {
			out, err := New().Insert(ctx, sqlEx(tx2), &dialect.InsertParams{Table: tb, Rows: []dialect.InsertRow{ev("t", `2`, "", key)}})
			done <- result{out, err}
		}()
		select {
		case r := <-done:
			t.Fatalf("second writer did not wait: %+v", r)
		case <-time.After(300 * time.Millisecond):
		}
		if commit {
			err = tx1.Commit()
		} else {
			err = tx1.Rollback()
		}
		if err != nil {
			t.Fatal(err)
		}
		r := <-done
		if r.err != nil {
			t.Fatalf("second writer: %v", r.err)
		}
		if commit && (!r.out[0].Duplicate || r.out[0].ID != a[0].ID || r.out[0].Sequence != a[0].Sequence) {
			t.Errorf("after the first committed: %+v, want its event %+v as Duplicate", r.out[0], a[0])
		}
		if !commit && (r.out[0].Duplicate || r.out[0].ID == a[0].ID) {
			t.Errorf("after the first rolled back: %+v, want a new event", r.out[0])
		}
		if err := tx2.Commit(); err != nil {
			t.Fatal(err)
		}
	}
}

func TestInsertScopedKeys(t *testing.T) {
	tb := newTable(t, withExtra(dialect.Column{Name: "tenant", Type: "VARCHAR(64) NULL"}, dialect.Column{Name: "n", Type: "INT NULL"}), withScope("tenant"))
	row := func(tenant, key string) dialect.InsertRow {
		r := ev("t", `1`, "", key)
		r.Extra = ptr(`{"tenant":"` + tenant + `","n":7}`)
		return r
	}
	p := func(rows ...dialect.InsertRow) *dialect.InsertParams {
		return &dialect.InsertParams{Table: tb, Rows: rows, ExtraNames: []string{"n", "tenant"}}
	}
	ctx := context.Background()
	a, err := New().Insert(ctx, sqlEx(testDB), p(row("A", "k"), row("B", "k")))
	if err != nil {
		t.Fatal(err)
	}
	if a[0].Duplicate || a[1].Duplicate || a[0].ID == a[1].ID {
		t.Fatalf("two tenants' key k: %+v", a)
	}
	b, err := New().Insert(ctx, sqlEx(testDB), p(row("B", "k"), row("C", "k")))
	if err != nil {
		t.Fatal(err)
	}
	if !b[0].Duplicate || b[0].ID != a[1].ID || b[1].Duplicate {
		t.Fatalf("B again, C new: %+v", b)
	}
	res, err := New().ResolveScoped(ctx, sqlEx(testDB), tb, []dialect.Probe{{Index: 4, Key: "k", Extra: map[string]any{"tenant": "A"}}, {Index: 5, Key: "k", Extra: map[string]any{"tenant": "Z"}}})
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 1 || res[0].Index != 4 || res[0].ID != a[0].ID || !res[0].Same || !res[0].Duplicate {
		t.Fatalf("ResolveScoped = %+v", res)
	}
	var n int
	if err := testDB.QueryRow("SELECT n FROM "+namesOf(tb).table+" WHERE id = ?", a[0].ID).Scan(&n); err != nil || n != 7 {
		t.Fatalf("extra column n = %d, %v", n, err)
	}
}

func TestResolveUnscopedSame(t *testing.T) {
	tb := newTable(t, withExtra(dialect.Column{Name: "tenant", Type: "VARCHAR(64) NULL"}))
	r := ev("t", `1`, "", "k")
	r.Extra = ptr(`{"tenant":"A"}`)
	a, err := New().Insert(context.Background(), sqlEx(testDB), &dialect.InsertParams{Table: tb, Rows: []dialect.InsertRow{r}, ExtraNames: []string{"tenant"}})
	if err != nil {
		t.Fatal(err)
	}
	res, err := New().ResolveScoped(context.Background(), sqlEx(testDB), tb, []dialect.Probe{
		{Index: 0, Key: "k", Extra: map[string]any{"tenant": "A"}}, {Index: 1, Key: "k", Extra: map[string]any{"tenant": "B"}}, {Index: 2, Key: "k"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 3 || !res[0].Same || res[1].Same || !res[2].Same || res[1].ID != a[0].ID {
		t.Fatalf("ResolveScoped = %+v", res)
	}
	st, err := New().ReadStored(context.Background(), sqlEx(testDB), tb, []string{"k", "none"})
	if err != nil || len(st) != 1 || st[0].ID != a[0].ID || !st[0].Duplicate {
		t.Fatalf("ReadStored = %+v, %v", st, err)
	}
}

// Bad input that reaches SQL fails only its statement: the caller's transaction stays usable
// and commits its business write and its valid events (MariaDB rolls back the failed
// statement, not the transaction).
func TestBadInputLeavesTransactionCommittable(t *testing.T) {
	db := needDB(t)
	tb := newTable(t)
	side := namesOf(tb).table[:len(namesOf(tb).table)-1] + "_side`"
	exec(t, "CREATE TABLE "+side+" (id INT PRIMARY KEY)")
	t.Cleanup(func() { _, _ = db.Exec("DROP TABLE IF EXISTS " + side) })
	ctx := context.Background()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.Exec("INSERT INTO " + side + " VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	good := ev("t", `{"ok":true}`, "key", "")
	if _, err := New().Insert(ctx, sqlEx(tx), &dialect.InsertParams{Table: tb, Rows: []dialect.InsertRow{good}}); err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("é", 256)
	badHeaders := ev("t", `1`, "", "")
	badHeaders.Headers = "{"
	badID := ev("t", `1`, "", "")
	badID.ID = "not-a-uuid"
	dupID := ev("t", `1`, "", "")
	dupID.ID = good.ID
	cases := []struct {
		name string
		row  dialect.InsertRow
		code uint16 // the MariaDB error
	}{
		{"payload not JSON", ev("t", `{nope`, "", ""), 4025},
		{"headers not JSON", badHeaders, 4025},
		{"id not a UUID", badID, 4025},
		{"ordering key too long", ev("t", `1`, long, ""), 1406},
		{"idempotency key too long", ev("t", `1`, "", long), 1406},
		{"topic too long", ev(long, `1`, "", ""), 1406},
		{"empty topic", ev("", `1`, "", ""), 4025},
		{"duplicate id", dupID, 1062},
		{"invalid UTF-8 topic", ev("\xff\xfe", `1`, "", ""), 1366},
	}
	for _, c := range cases {
		_, err := New().Insert(ctx, sqlEx(tx), &dialect.InsertParams{Table: tb, Rows: []dialect.InsertRow{ev("t", `1`, "", ""), c.row}})
		var me *mysql.MySQLError
		if !errors.As(err, &me) || me.Number != c.code {
			t.Errorf("%s: error %v, want MariaDB error %d", c.name, err, c.code)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatalf("commit after the failed inserts: %v", err)
	}
	if n := queryInt64s(t, "SELECT COUNT(*) FROM "+side)[0]; n != 1 {
		t.Errorf("business rows %d, want 1", n)
	}
	if ids := queryInt64s(t, "SELECT COUNT(*) FROM "+namesOf(tb).table+" WHERE id = ?", good.ID); ids[0] != 1 {
		t.Errorf("good event stored %d times, want 1", ids[0])
	}
	if n := queryInt64s(t, "SELECT COUNT(*) FROM "+namesOf(tb).table)[0]; n != 1 {
		t.Errorf("%d events, want only the good one", n)
	}
}

// More rows than one statement takes run in a savepoint: a failure in a later statement
// undoes the earlier ones, and the transaction stays usable.
func TestInsertManyRowsSavepoint(t *testing.T) {
	db := needDB(t)
	tb := newTable(t)
	ctx := context.Background()
	rows := make([]dialect.InsertRow, 2*maxInsertRows+5)
	for i := range rows {
		rows[i] = ev("t", `1`, []string{"a", "b", "c"}[i%3], "")
	}
	out := mustInsert(t, tb, rows...)
	for i := 1; i < len(out); i++ {
		if out[i].Sequence <= out[i-1].Sequence || out[i].ID != rows[i].ID {
			t.Fatalf("row %d: %+v after %+v", i, out[i], out[i-1])
		}
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	for i := range rows {
		rows[i] = ev("t", `1`, "", "")
	}
	rows[len(rows)-1].Payload = []byte("{bad")
	if _, err := New().Insert(ctx, sqlEx(tx), &dialect.InsertParams{Table: tb, Rows: rows}); err == nil {
		t.Fatal("no error for a bad payload in the last statement")
	}
	mine := ev("t", `1`, "", "")
	if _, err := New().Insert(ctx, sqlEx(tx), &dialect.InsertParams{Table: tb, Rows: []dialect.InsertRow{mine}}); err != nil {
		t.Fatalf("insert after the failed one: %v", err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if n := queryInt64s(t, "SELECT COUNT(*) FROM "+namesOf(tb).table)[0]; n != int64(len(rows))+1 {
		t.Fatalf("%d events, want %d (the first call's and one)", n, len(rows)+1)
	}
}

func TestInsertBytea(t *testing.T) {
	tb := newTable(t, withBytea())
	payload := []byte{0, 0xff, 'x', '\'', '\\'}
	r := ev("t", "", "", "")
	r.Payload = payload
	out := mustInsert(t, tb, r)
	var got []byte
	if err := testDB.QueryRow("SELECT payload FROM "+namesOf(tb).table+" WHERE sequence = ?", out[0].Sequence).Scan(&got); err != nil {
		t.Fatal(err)
	}
	if string(got) != string(payload) {
		t.Fatalf("payload %x, want %x", got, payload)
	}
}
