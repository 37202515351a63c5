package wal_test

import (
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/watermill-outbox/outbox/capture"
	"github.com/watermill-outbox/outbox/capture/wal"
)

// itemChange is a delivered change of table item: its key and version, the epoch of its
// delivery (source restarts or relay processes before it) and boot, the server incarnation
// that recorded it (server restarts before it; always 0 where the test does not track it).
type itemChange struct {
	id, v, epoch, boot int
}

// versions reads the item rows' versions (id → v) from the database.
func versions(t testing.TB, pool *pgxpool.Pool) map[int]int {
	t.Helper()
	rows, err := pool.Query(ctx, `SELECT id, v FROM item`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[int]int{}
	for rows.Next() {
		var id, v int
		if err := rows.Scan(&id, &v); err != nil {
			t.Fatal(err)
		}
		out[id] = v
	}
	return out
}

// checkOrder checks delivered changes against the final versions: every version of every key
// delivered (0 lost), new versions of a key in order (0 reordered); it returns the number of
// duplicates (a version delivered again), each of which must follow a restart after the
// version's first delivery.
func checkOrder(t testing.TB, got []itemChange, final map[int]int) (dups int) {
	t.Helper()
	a, b := checkCauses(t, got, final)
	return a + b
}

// checkCauses is checkOrder returning the duplicates by cause: afterEpoch were delivered again
// in a later epoch by the same server incarnation, afterBoot by a later server incarnation. A
// duplicate of the same epoch and incarnation as the version's first delivery fails t.
func checkCauses(t testing.TB, got []itemChange, final map[int]int) (afterEpoch, afterBoot int) {
	t.Helper()
	next := map[int]int{}
	first := map[[2]int]itemChange{}
	for _, c := range got {
		switch n := next[c.id]; {
		case c.v < n:
			f := first[[2]int{c.id, c.v}]
			switch {
			case c.boot > f.boot:
				afterBoot++
			case c.epoch > f.epoch && c.boot == f.boot:
				afterEpoch++
			default:
				t.Fatalf("key %d: version %d delivered twice without a restart in between (first epoch %d boot %d, again epoch %d boot %d)", c.id, c.v, f.epoch, f.boot, c.epoch, c.boot)
			}
		case c.v == n:
			next[c.id] = n + 1
			first[[2]int{c.id, c.v}] = c
		default:
			t.Fatalf("key %d: version %d delivered before %d (reordered or lost)", c.id, c.v, n)
		}
	}
	lost := 0
	for id, v := range final {
		if next[id] != v+1 {
			lost += v + 1 - next[id]
		}
	}
	if lost != 0 {
		t.Fatalf("%d versions lost", lost)
	}
	return afterEpoch, afterBoot
}

// allDelivered reports whether got holds every version of final, each key's in order.
func allDelivered(got []itemChange, final map[int]int) bool {
	next := map[int]int{}
	for _, c := range got {
		if c.v == next[c.id] {
			next[c.id]++
		}
	}
	for id, v := range final {
		if next[id] != v+1 {
			return false
		}
	}
	return true
}

func decodeItems(t testing.TB, rs []received) []itemChange {
	t.Helper()
	out := make([]itemChange, 0, len(rs))
	for _, r := range rs {
		ch, err := capture.DecodePayload(r.payload)
		if err != nil {
			t.Fatal(err)
		}
		row, err := capture.Row[struct{ ID, V int }](ch.After)
		if err != nil {
			t.Fatalf("%s: %v", r.payload, err)
		}
		if r.key != fmt.Sprintf("item:%d", row.ID) {
			t.Fatalf("ordering key %q for id %d", r.key, row.ID)
		}
		out = append(out, itemChange{id: row.ID, v: row.V, epoch: r.epoch})
	}
	return out
}

// writeItems runs writers updating random keys (1-3 per transaction, in key order) until n
// transactions committed, retrying through outages.
func writeItems(pool *pgxpool.Pool, keys, n, writers int) *sync.WaitGroup {
	return writeLoad(pool, keys, n, writers, false)
}

// writeChanges is writeItems counting updated rows instead of transactions: it stops once at
// least n rows were updated (give or take the last transactions in flight).
func writeChanges(pool *pgxpool.Pool, keys, n, writers int) *sync.WaitGroup {
	return writeLoad(pool, keys, n, writers, true)
}

func writeLoad(pool *pgxpool.Pool, keys, n, writers int, rows bool) *sync.WaitGroup {
	var wg sync.WaitGroup
	var done atomic.Int64
	for range writers {
		wg.Go(func() {
			for done.Load() < int64(n) {
				ids := []int{rand.IntN(keys), rand.IntN(keys), rand.IntN(keys)}[:1+rand.IntN(3)]
				sort.Ints(ids)
				tag, err := pool.Exec(ctx, `UPDATE item SET v = v + 1 WHERE id = ANY($1)`, ids)
				if err != nil {
					time.Sleep(20 * time.Millisecond) // the server is restarting: retry
					continue
				}
				if rows {
					done.Add(tag.RowsAffected())
				} else {
					done.Add(1)
				}
			}
		})
	}
	return &wg
}

func itemTable(t testing.TB, pool *pgxpool.Pool, keys int) []capture.Table {
	exec(t, pool, `CREATE TABLE item (id int PRIMARY KEY, v int NOT NULL)`)
	tables := []capture.Table{{Name: "item", Fields: []string{"id", "v"}}}
	if err := wal.Setup(ctx, pool, wal.Config{Tables: tables}); err != nil {
		t.Fatal(err)
	}
	exec(t, pool, fmt.Sprintf(`INSERT INTO item SELECT g, 0 FROM generate_series(0, %d) g`, keys-1))
	return tables
}

// TestOrderAcrossRestarts: writers update 200 keys concurrently while the source is cancelled
// and restarted three times (without a final confirmation of what it delivered) and the
// server is restarted once mid-stream: every version of every key is delivered, each key's
// versions in commit order; versions delivered twice only follow a restart.
func TestOrderAcrossRestarts(t *testing.T) {
	srv, pool := logicalPG(t)
	const keys = 200
	tables := itemTable(t, pool, keys)
	rec := &recorder{}
	newSource := func() *wal.Source {
		src, err := wal.New(pool, wal.Config{Tables: tables, Destination: rec, BatchSize: 100, StatusInterval: 50 * time.Millisecond, RetryBackoff: 20 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		return src
	}
	stop := run(t, newSource())
	wg := writeItems(pool, keys, 4000, 4)
	for i := range 3 {
		seen := len(rec.snapshot())
		waitFor(t, 60*time.Second, "progress", func() bool { return len(rec.snapshot()) > seen+300 })
		if err := stop(); err != nil {
			t.Fatal(err)
		}
		rec.restart()
		stop = run(t, newSource())
		if i == 1 {
			srv.Stop(t)
			rec.restart()
			srv.Restart(t)
		}
	}
	wg.Wait()
	final := versions(t, pool)
	total := 0
	for _, v := range final {
		total += v + 1
	}
	waitFor(t, 120*time.Second, "every version", func() bool { return allDelivered(decodeItems(t, rec.snapshot()), final) })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	got := decodeItems(t, rec.snapshot())
	dups := checkOrder(t, got, final)
	t.Logf("%d versions, %d delivered, %d duplicates after 3 source restarts and 1 server restart", total, len(got), dups)
}
