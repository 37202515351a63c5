package mysql

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/watermill-outbox/outbox/internal/dialect"
)

func TestMigrateTwiceAndConcurrently(t *testing.T) {
	db := needDB(t)
	d, ctx := New(), context.Background()
	tb := newTableConfig(t)
	ok, err := d.TableExists(ctx, sqlEx(db), tb)
	if err != nil || ok {
		t.Fatalf("TableExists before Migrate = %v, %v; want false, nil", ok, err)
	}
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = d.Migrate(ctx, sqlEx(db), tb)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("concurrent Migrate %d: %v", i, err)
		}
	}
	if err := d.Migrate(ctx, sqlEx(db), tb); err != nil {
		t.Fatalf("Migrate again: %v", err)
	}
	ok, err = d.TableExists(ctx, sqlEx(db), tb)
	if err != nil || !ok {
		t.Fatalf("TableExists after Migrate = %v, %v; want true, nil", ok, err)
	}
	// A qualified name finds the same table.
	q := *tb
	q.Parts = []string{"test", tb.Name()}
	if ok, err := d.TableExists(ctx, sqlEx(db), &q); err != nil || !ok {
		t.Fatalf("TableExists(test.%s) = %v, %v", tb.Name(), ok, err)
	}
	idx := queryInt64s(t, "SELECT COUNT(DISTINCT INDEX_NAME) FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?", tb.Name())
	if idx[0] != 7 { // PRIMARY, id, pending, key, idempotency, published, dead
		t.Fatalf("indexes = %d, want 7", idx[0])
	}
	// Extra columns declared later are added by the next Migrate.
	tb.Extra = []dialect.Column{{Name: "tenant", Type: "VARCHAR(64) NULL"}}
	if err := d.Migrate(ctx, sqlEx(db), tb); err != nil {
		t.Fatalf("Migrate with an extra column: %v", err)
	}
	cols, err := columnsOf(ctx, sqlQuerier(db), "", tb.Name())
	if err != nil || !cols["tenant"] {
		t.Fatalf("columns = %v, %v; want tenant", cols, err)
	}
	// A transaction is refused (DDL commits implicitly).
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if err := d.Migrate(ctx, sqlEx(tx), tb); !errors.Is(err, ErrHandle) {
		t.Fatalf("Migrate in a transaction = %v, want ErrHandle", err)
	}
}

func TestMigrateScopeMismatch(t *testing.T) {
	db := needDB(t)
	d, ctx := New(), context.Background()
	tb := newTable(t, withExtra(dialect.Column{Name: "tenant", Type: "VARCHAR(64) NULL"}))
	scoped := *tb
	scoped.Scope = []string{"tenant"}
	err := d.Migrate(ctx, sqlEx(db), &scoped)
	var sm *dialect.ScopeMismatch
	if !errors.As(err, &sm) || !strings.Contains(sm.Reason, "has the global idempotency index") {
		t.Fatalf("Migrate with a scope on a global table = %v, want a global *ScopeMismatch", err)
	}
	// The scope migration moves it; then Migrate accepts the scoped config and refuses the
	// global one.
	stmts, err := d.ScopeMigration(&scoped)
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range stmts {
		exec(t, st)
	}
	if err := d.Migrate(ctx, sqlEx(db), &scoped); err != nil {
		t.Fatalf("Migrate after the scope migration: %v", err)
	}
	err = d.Migrate(ctx, sqlEx(db), tb)
	if !errors.As(err, &sm) || !strings.Contains(sm.Reason, "over [tenant idempotency_key]") {
		t.Fatalf("Migrate without a scope on a scoped table = %v (%+v)", err, sm)
	}
	// And back.
	stmts, _ = d.ScopeMigration(tb)
	for _, st := range stmts {
		exec(t, st)
	}
	if err := d.Migrate(ctx, sqlEx(db), tb); err != nil {
		t.Fatalf("Migrate after the way back: %v", err)
	}
}

func TestStatements(t *testing.T) {
	tb := &dialect.Table{Parts: []string{"shop", "out`box"}, IndexBase: "out`box", Extra: []dialect.Column{{Name: "tenant", Type: "INT NULL"}}, Scope: []string{"tenant"}}
	st := New().Statements(tb)
	if len(st) != 3 {
		t.Fatalf("%d statements, want 3 (table, key-lock table, its rows)", len(st))
	}
	if !strings.HasPrefix(st[2], "INSERT INTO `shop`.`out``box_keys` (`ordering_key`) SELECT") {
		t.Errorf("key rows: %s", st[2])
	}
	for _, want := range []string{"CREATE TABLE IF NOT EXISTS `shop`.`out``box` (", "`tenant` INT NULL", "UNIQUE INDEX `out``box_idempotency_scope_idx` (`tenant`, `idempotency_key`)"} {
		if !strings.Contains(st[0], want) {
			t.Errorf("table DDL lacks %q:\n%s", want, st[0])
		}
	}
	if !strings.HasPrefix(st[1], "CREATE TABLE IF NOT EXISTS `shop`.`out``box_keys` (") {
		t.Errorf("key table DDL: %s", st[1])
	}
	if got := New().Quote(tb); got != "`shop`.`out``box`" {
		t.Errorf("Quote = %s", got)
	}
}

// TestMigrateFillsKeyLockRows: Migrate creates every stripe's row ("i:00000" … "o:04095"), so
// writers only ever lock existing rows; a second Migrate leaves them as they are.
func TestMigrateFillsKeyLockRows(t *testing.T) {
	tb := newTable(t)
	for range 2 {
		var n, distinct, i, o int64
		if err := testDB.QueryRow("SELECT COUNT(*), COUNT(DISTINCT ordering_key), SUM(ordering_key LIKE 'i:%'), SUM(ordering_key LIKE 'o:%') FROM "+namesOf(tb).keys).Scan(&n, &distinct, &i, &o); err != nil {
			t.Fatal(err)
		}
		if got := []int64{n, distinct, i, o}; fmt.Sprint(got) != "[8192 8192 4096 4096]" {
			t.Fatalf("key-lock rows (count, distinct, i, o) = %v, want [8192 8192 4096 4096]", got)
		}
		var lo, hi string
		if err := testDB.QueryRow("SELECT MIN(ordering_key), MAX(ordering_key) FROM "+namesOf(tb).keys).Scan(&lo, &hi); err != nil {
			t.Fatal(err)
		}
		if lo != "i:00000" || hi != "o:04095" || stripe("o", "any key") > hi {
			t.Fatalf("rows %s … %s", lo, hi)
		}
		if err := New().Migrate(t.Context(), sqlEx(testDB), tb); err != nil {
			t.Fatal(err)
		}
	}
}
