package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/watermill-outbox/outbox/internal/dialect"
)

// written is one event as a writer committed it: its key, sequence and the key's commit
// number (the n-th committed transaction that wrote the key).
type written struct {
	key    string
	seq    int64
	commit int64
}

// writeConcurrently runs 8 writers that each commit transactions of 1–3 events over 20 shared
// keys (several events of one key in a call included) until total events are written, and
// returns what they committed. After its Insert each transaction increments its keys' commit
// counters (rows of a side table, locked until COMMIT, so the counter order of one key is its
// commit order) after a random pause of up to 1 ms, which lets transactions that are not
// serialised by the key locks overtake each other.
func writeConcurrently(t *testing.T, d *Dialect, tb *dialect.Table, total int) []written {
	db := needDB(t)
	counters := namesOf(tb).table[:len(namesOf(tb).table)-1] + "_commits`"
	exec(t, "CREATE TABLE "+counters+" (k VARCHAR(10) PRIMARY KEY, n BIGINT NOT NULL)")
	t.Cleanup(func() { _, _ = db.Exec("DROP TABLE IF EXISTS " + counters) })
	keys := make([]string, 20)
	for i := range keys {
		keys[i] = fmt.Sprintf("key%02d", i)
		exec(t, "INSERT INTO "+counters+" VALUES (?, 0)", keys[i])
	}
	var (
		mu   sync.Mutex
		out  []written
		left = total
	)
	take := func() int {
		mu.Lock()
		defer mu.Unlock()
		n := min(1+rand.IntN(3), left)
		left -= n
		return n
	}
	ctx := context.Background()
	var wg sync.WaitGroup
	errc := make(chan error, 8)
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := take(); n > 0; n = take() {
				if err := func() error {
					tx, err := db.BeginTx(ctx, nil)
					if err != nil {
						return err
					}
					defer tx.Rollback()
					rows := make([]dialect.InsertRow, n)
					for i := range rows {
						rows[i] = ev("t", `1`, keys[rand.IntN(len(keys))], "")
					}
					stored, err := d.Insert(ctx, sqlEx(tx), &dialect.InsertParams{Table: tb, Rows: rows})
					if err != nil {
						return err
					}
					time.Sleep(time.Duration(rand.IntN(1000)) * time.Microsecond)
					commit := map[string]int64{}
					var sorted []string
					for _, r := range rows {
						if _, ok := commit[*r.OrderingKey]; !ok {
							commit[*r.OrderingKey] = 0
							sorted = append(sorted, *r.OrderingKey)
						}
					}
					sort.Strings(sorted)
					for _, k := range sorted {
						if _, err := tx.Exec("UPDATE "+counters+" SET n = n + 1 WHERE k = ?", k); err != nil {
							return err
						}
						var c int64
						if err := tx.QueryRow("SELECT n FROM "+counters+" WHERE k = ?", k).Scan(&c); err != nil {
							return err
						}
						commit[k] = c
					}
					if err := tx.Commit(); err != nil {
						return err
					}
					mu.Lock()
					for _, s := range stored {
						out = append(out, written{key: *s.OrderingKey, seq: s.Sequence, commit: commit[*s.OrderingKey]})
					}
					mu.Unlock()
					return nil
				}(); err != nil {
					errc <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatalf("writer: %v", err)
	}
	return out
}

// reorders counts, per key, the events whose commit came before an event of the same key with
// a lower sequence (in sequence order, a drop of the commit number).
func reorders(ws []written) int {
	byKey := map[string][]written{}
	for _, w := range ws {
		byKey[w.key] = append(byKey[w.key], w)
	}
	n := 0
	for _, evs := range byKey {
		sort.Slice(evs, func(i, j int) bool { return evs[i].seq < evs[j].seq })
		for i := 1; i < len(evs); i++ {
			if evs[i].commit < evs[i-1].commit {
				n++
			}
		}
	}
	return n
}

// Per-key commit order under 8 concurrent writers on shared keys: every key's events commit in
// sequence order (0 reorders), and a relay draining the table delivers each key in that order.
// Without the key locks the same workload reorders (the control shows the check can fail).
func TestPerKeyCommitOrder(t *testing.T) {
	const total = 2500
	tb := newTable(t)
	ws := writeConcurrently(t, New(), tb, total)
	if len(ws) != total {
		t.Fatalf("%d events written, want %d", len(ws), total)
	}
	if n := reorders(ws); n != 0 {
		t.Fatalf("%d events committed out of their key's sequence order", n)
	}
	// Drain: each key's delivery order must be its commit order.
	commitOf := map[int64]written{}
	for _, w := range ws {
		commitOf[w.seq] = w
	}
	cfg := relayConfig(200, 20)
	r := New().NewRelay(tb, cfg, all)
	delivered := map[string][]int64{}
	for i := 0; ; i++ {
		res := claim(t, r, cfg, fmt.Sprint("drain#", i))
		if len(res.Events) == 0 {
			break
		}
		for _, e := range res.Events {
			delivered[*e.OrderingKey] = append(delivered[*e.OrderingKey], e.Sequence)
		}
		if _, err := r.Mark(context.Background(), sqlEx(testDB), &dialect.MarkParams{Token: fmt.Sprint("drain#", i), Acked: seqsOf(res.Events)}); err != nil {
			t.Fatal(err)
		}
	}
	n := 0
	for k, seqs := range delivered {
		n += len(seqs)
		for i := 1; i < len(seqs); i++ {
			a, b := commitOf[seqs[i-1]], commitOf[seqs[i]]
			if b.commit < a.commit || seqs[i] < seqs[i-1] {
				t.Fatalf("key %s: delivered %d (commit %d) after %d (commit %d)", k, seqs[i], b.commit, seqs[i-1], a.commit)
			}
		}
	}
	if n != total {
		t.Fatalf("delivered %d events, want %d", n, total)
	}

	control := newTable(t)
	cws := writeConcurrently(t, &Dialect{noKeyLocks: true}, control, total)
	t.Logf("with key locks: 0 reorders in %d events; without: %d", total, reorders(cws))
	if reorders(cws) == 0 {
		t.Fatalf("the control without key locks showed no reorder: the check proves nothing")
	}
}

// Which errors abort only the statement: a lock wait timeout (1205) on a key lock leaves the
// writer's transaction usable; a deadlock (1213) rolls back the whole transaction (InnoDB).
func TestLockErrorsStatementOrTransaction(t *testing.T) {
	db := needDB(t)
	tb := newTable(t)
	ctx := context.Background()
	d := New()
	ins := func(tx *sql.Tx, key string) error {
		_, err := d.Insert(ctx, sqlEx(tx), &dialect.InsertParams{Table: tb, Rows: []dialect.InsertRow{ev("t", `1`, key, "")}})
		return err
	}
	begin := func() *sql.Tx {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = tx.Rollback() })
		if _, err := tx.Exec("SET SESSION innodb_lock_wait_timeout = 1"); err != nil {
			t.Fatal(err)
		}
		return tx
	}
	code := func(err error) uint16 {
		var me *mysql.MySQLError
		if errors.As(err, &me) {
			return me.Number
		}
		return 0
	}
	// Lock wait timeout.
	tx1, tx2 := begin(), begin()
	if err := ins(tx1, "A"); err != nil {
		t.Fatal(err)
	}
	if err := ins(tx2, "J"); err != nil {
		t.Fatal(err)
	}
	if err := ins(tx2, "A"); code(err) != 1205 {
		t.Fatalf("second writer of A: %v, want error 1205", err)
	}
	if err := ins(tx2, "K"); err != nil {
		t.Fatalf("insert after the timeout: %v", err)
	}
	if err := tx2.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := tx1.Commit(); err != nil {
		t.Fatal(err)
	}
	keys := func() map[string]int64 {
		rs, err := db.Query("SELECT ordering_key, COUNT(*) FROM " + namesOf(tb).table + " GROUP BY ordering_key")
		if err != nil {
			t.Fatal(err)
		}
		defer rs.Close()
		m := map[string]int64{}
		for rs.Next() {
			var k string
			var n int64
			if err := rs.Scan(&k, &n); err != nil {
				t.Fatal(err)
			}
			m[k] = n
		}
		return m
	}
	if got := keys(); got["A"] != 1 || got["J"] != 1 || got["K"] != 1 || len(got) != 3 {
		t.Fatalf("after the timeout: events per key %v, want A, J, K once", got)
	}
	// Deadlock: two writers taking B and C in opposite orders in separate calls.
	tx3, tx4 := begin(), begin()
	if err := ins(tx3, "B"); err != nil {
		t.Fatal(err)
	}
	if err := ins(tx4, "C"); err != nil {
		t.Fatal(err)
	}
	// Whichever request comes first, each transaction then waits for the other's key: the
	// cycle forms without any ordering between the two calls.
	errc := make(chan error, 1)
	go func() { errc <- ins(tx3, "C") }()
	err4 := ins(tx4, "B")
	err3 := <-errc
	if code(err3) != 1213 && code(err4) != 1213 {
		t.Fatalf("opposite key orders: %v, %v; want a deadlock (1213)", err3, err4)
	}
	_ = tx3.Commit()
	_ = tx4.Commit()
	got := keys()
	if got["B"]+got["C"] != 2 {
		t.Fatalf("after the deadlock: B %d, C %d; want the survivor's two events only (the victim's B or C rolled back with its transaction)", got["B"], got["C"])
	}
}
