package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/watermill-outbox/outbox/internal/dialect"
)

// opsTable migrates an outbox table on db and seeds one event for each operation: "retry" and
// "purge" dead-lettered an hour ago, "clean" published an hour ago, and "take" leased for an
// hour by an earlier relay named "relay" (token "relay#aaaaaaaaaaaa#1").
func opsTable(t *testing.T, db *sql.DB) *dialect.Table {
	t.Helper()
	ctx := context.Background()
	tbl := &dialect.Table{Parts: []string{"outbox"}, IndexBase: "outbox"}
	if err := (Dialect{}).Migrate(ctx, dialect.StdSQL{D: db}, tbl); err != nil {
		t.Fatal(err)
	}
	hourAgo, inHour := micros(time.Now().Add(-time.Hour)), micros(time.Now().Add(time.Hour))
	for _, st := range []string{
		fmt.Sprintf(`INSERT INTO outbox (id, topic, payload, dead_lettered_at) VALUES ('retry', 't', '{}', %d), ('purge', 't', '{}', %d)`, hourAgo, hourAgo),
		fmt.Sprintf(`INSERT INTO outbox (id, topic, payload, published_at) VALUES ('clean', 't', '{}', %d)`, hourAgo),
		fmt.Sprintf(`INSERT INTO outbox (id, topic, payload, leased_by, lease_until) VALUES ('take', 't', '{}', 'relay#aaaaaaaaaaaa#1', %d)`, inHour),
	} {
		if _, err := db.Exec(st); err != nil {
			t.Fatal(err)
		}
	}
	return tbl
}

// operations are the writes an operator's calls make (RetryDeadLettered, PurgeDeadLettered,
// CleanupPublished) and a relay's take-back at its start, each touching one event of opsTable.
func operations(ex dialect.Executor, tbl *dialect.Table) map[string]func(context.Context) (int64, error) {
	d := Dialect{}
	return map[string]func(context.Context) (int64, error){
		"RetryDead": func(ctx context.Context) (int64, error) {
			return d.RetryDead(ctx, ex, tbl, dialect.DeadFilter{IDs: []string{"retry"}})
		},
		"PurgeDead": func(ctx context.Context) (int64, error) {
			return d.PurgeDead(ctx, ex, tbl, dialect.DeadFilter{IDs: []string{"purge"}})
		},
		"Cleanup": func(ctx context.Context) (int64, error) {
			return d.Cleanup(ctx, ex, tbl, "published_at", time.Minute, 100)
		},
		"TakeBack": func(ctx context.Context) (int64, error) {
			return d.TakeBack(ctx, ex, tbl, "relay#", "relay#bbbbbbbbbbbb#")
		},
	}
}

// TestOperationsTakeTheTurn: each operation's write waits for the process's turn to write (held
// here by the test for the busy timeout), like the relay's and the Publishers' writes, and then
// changes exactly its event.
func TestOperationsTakeTheTurn(t *testing.T) {
	const busy = 300 * time.Millisecond
	db := openPool(t, filepath.Join(t.TempDir(), "ops.db"), int(busy/time.Millisecond))
	ctx := context.Background()
	tbl := opsTable(t, db)
	ex := dialect.StdSQL{D: db}
	for name, op := range operations(ex, tbl) {
		end, err := writeTurn(ctx, ex)
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		n, err := op(ctx)
		waited := time.Since(start)
		end()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if n != 1 {
			t.Fatalf("%s changed %d events, want 1", name, n)
		}
		if waited < busy {
			t.Fatalf("%s wrote after %s, without waiting for the turn", name, waited)
		}
	}
	var dead, published, leased, total int
	if err := db.QueryRow(`SELECT count(dead_lettered_at), count(published_at), count(leased_by), count(*) FROM outbox`).Scan(&dead, &published, &leased, &total); err != nil {
		t.Fatal(err)
	}
	if dead != 0 || published != 0 || leased != 0 || total != 2 {
		t.Fatalf("after the operations: %d dead, %d published, %d leased of %d events; want 0, 0, 0 of 2 (retry, take)", dead, published, leased, total)
	}
}

// TestOperationsBesideBusyWriters: with 8 writers in the process writing through the turn
// without a pause (as a busy relay and Publishers do), every operation succeeds. Outside the
// turn they met those writers in the busy handler and lost its draw: 3-4 of 20 deletes failed
// with SQLITE_BUSY after a 500 ms busy timeout.
func TestOperationsBesideBusyWriters(t *testing.T) {
	db := openPool(t, filepath.Join(t.TempDir(), "ops.db"), 500)
	ctx := context.Background()
	tbl := opsTable(t, db)
	if _, err := db.Exec(`CREATE TABLE t (x INTEGER)`); err != nil {
		t.Fatal(err)
	}
	ex := dialect.StdSQL{D: db}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	started := make(chan struct{}, 8)
	for w := range 8 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				if err := withRelayTx(ctx, ex, false, false, func(ex dialect.Executor) error {
					_, err := ex.Exec(ctx, `INSERT INTO t VALUES ($1)`, w)
					return err
				}); err != nil {
					t.Errorf("writer %d: %v", w, err)
					return
				}
				if i == 10 {
					started <- struct{}{}
				}
			}
		})
	}
	for range 8 {
		<-started
	}
	ops := operations(ex, tbl)
	for round := range 5 {
		for name, op := range ops {
			n, err := op(ctx)
			if err != nil {
				t.Errorf("%s, round %d: %v", name, round, err)
				continue
			}
			if want := map[bool]int64{true: 1, false: 0}[round == 0]; n != want {
				t.Errorf("%s, round %d: changed %d events, want %d", name, round, n, want)
			}
		}
	}
	close(stop)
	wg.Wait()
}
