package postgres

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/watermill-outbox/outbox/internal/dialect"
	"github.com/watermill-outbox/outbox/internal/pgtest"
)

// TestClaimFlatUnderHeldSnapshot writes and drains rounds of events (100 keys, 1,000 keyed and
// 200 unordered events a round, through the Publisher's INSERT) while another connection holds a
// REPEATABLE READ snapshot taken before the first round, so that no index entry of a published
// event can be removed. It measures each claim's buffers with EXPLAIN (ANALYZE, BUFFERS) of the
// same claim in a rolled-back transaction. With the floors and per-key lows (as the Subscriber
// keeps them) a claim's buffers per event stay flat; without them (scans from sequence 0, head
// checks from each key's start: the claim before the floors) they grow with every round, which
// shows the measure can fail.
func TestClaimFlatUnderHeldSnapshot(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: 2 × 12 rounds of 1,200 events")
	}
	ctx := context.Background()
	db := pgtest.StdDB(t)
	ex := dialect.StdSQL{D: db, Pgx: true}
	cfg := dialect.RelayConfig{BatchSize: 2000, MaxRunPerKey: 100, KeyScan: 1000, LeaseDuration: 30 * time.Second, MaxAttempts: 10, RetryBase: time.Second, RetryMax: time.Minute}
	const rounds = 12
	run := func(t *testing.T, floors bool) (first, last float64) {
		name, tbl := migratedTable(t, db)
		d := Dialect{}
		holdSnapshot(t, db, name)
		r := d.NewRelay(tbl, cfg, dialect.TopicSelection{Include: dialect.Topic{All: true}}).(*relay)
		var fl dialect.FloorTracker
		lows := map[string]int64{}
		for round := 1; round <= rounds; round++ {
			rows := make([]dialect.InsertRow, 0, 1200)
			for i := range 1200 {
				row := dialect.InsertRow{ID: uuid.NewString(), Topic: "t", Payload: []byte(`{}`), Headers: "{}"}
				if i < 1000 {
					k := fmt.Sprintf("k%d", i%100)
					row.OrderingKey = &k
				}
				rows = append(rows, row)
			}
			if err := dialect.WithTx(ctx, ex, nil, func(tx dialect.Executor) error {
				_, err := d.Insert(ctx, tx, &dialect.InsertParams{Table: tbl, Rows: rows})
				return err
			}); err != nil {
				t.Fatal(err)
			}
			p := &dialect.ClaimParams{Token: fmt.Sprintf("tok%d", round), Limit: cfg.BatchSize, Oldest: cfg.BatchSize}
			if floors {
				p.LowKeyed, p.LowUnordered = fl.Keyed, fl.Unordered
				for k, v := range lows {
					p.KeyLows = append(p.KeyLows, dialect.KeyLow{Key: k, Low: v})
				}
			}
			buffers := explainBuffers(t, db, r, p)
			res, err := r.Claim(ctx, ex, p)
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Events) != 1200 {
				t.Fatalf("round %d: claimed %d events, want 1200", round, len(res.Events))
			}
			acked := make([]int64, 0, len(res.Events))
			for _, e := range res.Events {
				acked = append(acked, e.Sequence)
				if e.Rank == 1 {
					lows[*e.OrderingKey] = e.Sequence
				}
			}
			fl.Update(res.Floors, time.Now())
			marked, err := r.Mark(ctx, ex, &dialect.MarkParams{Token: p.Token, Acked: acked})
			if err != nil || len(marked) != 1200 {
				t.Fatalf("round %d: marked %d, %v", round, len(marked), err)
			}
			perEvent := float64(buffers) / 1200
			t.Logf("round %2d: %6d buffers, %.2f per event (floors %d/%d)", round, buffers, perEvent, p.LowKeyed, p.LowUnordered)
			switch round {
			case 2: // round 1 has no floors yet
				first = perEvent
			case rounds:
				last = perEvent
			}
		}
		return first, last
	}
	var withFirst, withLast, withoutFirst, withoutLast float64
	t.Run("floors", func(t *testing.T) { withFirst, withLast = run(t, true) })
	t.Run("from zero", func(t *testing.T) { withoutFirst, withoutLast = run(t, false) })
	t.Logf("buffers per event, round 2 → %d: with floors %.2f → %.2f (%.2f×), from zero %.2f → %.2f (%.2f×)",
		rounds, withFirst, withLast, withLast/withFirst, withoutFirst, withoutLast, withoutLast/withoutFirst)
	if withLast > 1.3*withFirst {
		t.Errorf("with floors a claim's buffers per event grew from %.2f to %.2f under a held snapshot", withFirst, withLast)
	}
	if withoutLast < 2*withoutFirst {
		t.Errorf("from zero a claim's buffers per event grew only from %.2f to %.2f: the measure does not show the held snapshot", withoutFirst, withoutLast)
	}
}

// explainBuffers returns the shared buffers (hit + read) of claim p, run under EXPLAIN (ANALYZE,
// BUFFERS) in a transaction that is rolled back.
func explainBuffers(t *testing.T, db *sql.DB, r *relay, p *dialect.ClaimParams) int64 {
	t.Helper()
	ctx := context.Background()
	st, named := r.claim, r.claimArgs(p)
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback() //nolint:errcheck
	var plan string
	ex := dialect.StdSQL{D: tx, Pgx: true}
	if err := tx.QueryRowContext(ctx, `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) `+st.SQL, ex.OneShot(st.Args(named))...).Scan(&plan); err != nil {
		t.Fatal(err)
	}
	var doc []struct {
		Plan struct {
			Hit  int64 `json:"Shared Hit Blocks"`
			Read int64 `json:"Shared Read Blocks"`
		} `json:"Plan"`
	}
	if err := json.Unmarshal([]byte(plan), &doc); err != nil {
		t.Fatal(err)
	}
	return doc[0].Plan.Hit + doc[0].Plan.Read
}

// TestFloorsWaitForOpenWriters: the floors never pass an event whose writer is still open, and
// an open transaction that writes elsewhere (it holds the cluster's xmin back) does not hold them.
// A writer of the outbox W1 inserts an event and stays open; W2 inserts a later one and commits;
// an unrelated transaction writes to another table and stays open. After claims spread over more
// than dialect.SettleWait (so the floors look at the table's lock holders), the floors stay at or
// below W1's event, and the claim after W1's commit leases it. Once W1 has ended, the floors pass
// both events although the unrelated transaction is still open.
func TestFloorsWaitForOpenWriters(t *testing.T) {
	ctx := context.Background()
	db := pgtest.StdDB(t)
	ex := dialect.StdSQL{D: db, Pgx: true}
	_, tbl := migratedTable(t, db)
	d := Dialect{}
	other := pgtest.Table(t)
	if _, err := db.ExecContext(ctx, `CREATE TABLE `+dialect.DoubleQuote(other)+` (x int)`); err != nil {
		t.Fatal(err)
	}
	unrelated, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer unrelated.Rollback() //nolint:errcheck
	if _, err := unrelated.ExecContext(ctx, `INSERT INTO `+dialect.DoubleQuote(other)+` VALUES (1)`); err != nil {
		t.Fatal(err)
	}
	insert := func(tx *sql.Tx, key string) int64 {
		t.Helper()
		k := key
		st, err := d.Insert(ctx, dialect.StdSQL{D: tx, Tx: true, Pgx: true}, &dialect.InsertParams{Table: tbl,
			Rows: []dialect.InsertRow{{ID: uuid.NewString(), Topic: "t", Payload: []byte(`{}`), Headers: "{}", OrderingKey: &k}}})
		if err != nil || len(st) != 1 {
			t.Fatalf("insert: %v", err)
		}
		return st[0].Sequence
	}
	w1, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer w1.Rollback() //nolint:errcheck
	s1 := insert(w1, "a")
	w2, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	s2 := insert(w2, "b")
	if err := w2.Commit(); err != nil {
		t.Fatal(err)
	}
	cfg := dialect.RelayConfig{BatchSize: 100, MaxRunPerKey: 10, KeyScan: 100, LeaseDuration: 30 * time.Second, MaxAttempts: 10, RetryBase: time.Second, RetryMax: time.Minute}
	r := d.NewRelay(tbl, cfg, dialect.TopicSelection{Include: dialect.Topic{All: true}}).(*relay)
	var fl dialect.FloorTracker
	var got []int64
	claim := func() {
		t.Helper()
		p := &dialect.ClaimParams{Token: uuid.NewString(), Limit: 100, Oldest: 100, LowKeyed: fl.Keyed, LowUnordered: fl.Unordered}
		res, err := r.Claim(ctx, ex, p)
		if err != nil {
			t.Fatal(err)
		}
		var acked []int64
		for _, e := range res.Events {
			acked = append(acked, e.Sequence)
			got = append(got, e.Sequence)
		}
		now := time.Now()
		fl.Update(res.Floors, now)
		if fl.LookAtLocks(now) {
			h, err := r.LockHolders(ctx, ex)
			if err != nil {
				t.Fatal(err)
			}
			fl.CheckLocks(h, now)
		}
		if _, err := r.Mark(ctx, ex, &dialect.MarkParams{Token: p.Token, Acked: acked}); err != nil {
			t.Fatal(err)
		}
	}
	for end := time.Now().Add(3 * dialect.SettleWait); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		claim()
		if fl.Keyed > s1 {
			t.Fatalf("keyed floor %d passed the open writer's event %d", fl.Keyed, s1)
		}
	}
	if len(got) != 1 || got[0] != s2 {
		t.Fatalf("claimed %v before W1's commit, want [%d]", got, s2)
	}
	if err := w1.Commit(); err != nil {
		t.Fatal(err)
	}
	claim()
	if len(got) != 2 || got[1] != s1 {
		t.Fatalf("claimed %v after W1's commit, want [%d %d]", got, s2, s1)
	}
	for end := time.Now().Add(3 * dialect.SettleWait); time.Now().Before(end) && fl.Keyed <= s2; time.Sleep(20 * time.Millisecond) {
		claim()
	}
	if fl.Keyed <= s2 {
		t.Fatalf("keyed floor %d did not pass %d while an unrelated transaction held xmin", fl.Keyed, s2)
	}
}

// TestSkipScanStepsOverKnownKeys: under a held snapshot the key skip scan reads the index
// entries of a key's published events only for keys the relay does not know. 100 keys get 100
// published events each (their entries stay in the key index: a REPEATABLE READ snapshot taken
// before them is held), then 2 pending events each. A claim whose walk is full (Oldest 16) runs
// the skip scan over all 100 keys; the relay knows the heads of 90 of them (KeyLows). It must
// lease all 200 events (the 10 unknown keys' heads come from the skip scan, the known ones' from
// their lows) and read at most a third of the buffers of the same claim knowing no key (which
// reads every key's 100 dead entries).
func TestSkipScanStepsOverKnownKeys(t *testing.T) {
	ctx := context.Background()
	db := pgtest.StdDB(t)
	ex := dialect.StdSQL{D: db, Pgx: true}
	cfg := dialect.RelayConfig{BatchSize: 1000, MaxRunPerKey: 100, KeyScan: 1000, LeaseDuration: 30 * time.Second, MaxAttempts: 10, RetryBase: time.Second, RetryMax: time.Minute}
	name, tbl := migratedTable(t, db)
	d := Dialect{}
	holdSnapshot(t, db, name)
	r := d.NewRelay(tbl, cfg, dialect.TopicSelection{Include: dialect.Topic{All: true}}).(*relay)
	insert := func(perKey int) {
		t.Helper()
		var rows []dialect.InsertRow
		for range perKey {
			for k := range 100 {
				key := fmt.Sprintf("k%02d", k)
				rows = append(rows, dialect.InsertRow{ID: uuid.NewString(), Topic: "t", Payload: []byte(`{}`), Headers: "{}", OrderingKey: &key})
			}
		}
		if err := dialect.WithTx(ctx, ex, nil, func(tx dialect.Executor) error {
			_, err := d.Insert(ctx, tx, &dialect.InsertParams{Table: tbl, Rows: rows})
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	for round := range 10 { // 100 published events per key
		insert(10)
		p := &dialect.ClaimParams{Token: fmt.Sprintf("pub%d", round), Limit: cfg.BatchSize, Oldest: cfg.BatchSize}
		res, err := r.Claim(ctx, ex, p)
		if err != nil || len(res.Events) != 1000 {
			t.Fatalf("round %d: claimed %d events, %v", round, len(res.Events), err)
		}
		acked := make([]int64, 0, len(res.Events))
		for _, e := range res.Events {
			acked = append(acked, e.Sequence)
		}
		if marked, err := r.Mark(ctx, ex, &dialect.MarkParams{Token: p.Token, Acked: acked}); err != nil || len(marked) != 1000 {
			t.Fatalf("round %d: marked %d, %v", round, len(marked), err)
		}
	}
	insert(2)
	heads := map[string]int64{}
	rs, err := db.QueryContext(ctx, `SELECT "ordering_key", min("sequence") FROM `+dialect.DoubleQuote(name)+` WHERE "published_at" IS NULL GROUP BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	floor := int64(1 << 62)
	for rs.Next() {
		var k string
		var s int64
		if err := rs.Scan(&k, &s); err != nil {
			t.Fatal(err)
		}
		heads[k] = s
		floor = min(floor, s)
	}
	if err := rs.Err(); err != nil || len(heads) != 100 {
		t.Fatalf("%d pending heads, %v", len(heads), err)
	}
	claim := func(token string, known int) *dialect.ClaimParams {
		p := &dialect.ClaimParams{Token: token, Limit: cfg.BatchSize, Oldest: 16, LowKeyed: floor, LowUnordered: floor}
		for k := range known {
			key := fmt.Sprintf("k%02d", k)
			p.KeyLows = append(p.KeyLows, dialect.KeyLow{Key: key, Low: heads[key]})
		}
		return p
	}
	knowing, blind := explainBuffers(t, db, r, claim("x", 90)), explainBuffers(t, db, r, claim("x", 0))
	t.Logf("claim buffers: knowing 90 of 100 keys %d, knowing none %d", knowing, blind)
	if 3*knowing > blind {
		t.Errorf("knowing 90 of 100 keys the claim read %d buffers, knowing none %d: the skip scan read the known keys' entries", knowing, blind)
	}
	res, err := r.Claim(ctx, ex, claim("final", 90))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Events) != 200 {
		t.Errorf("claimed %d events, want every key's 2 pending events (200)", len(res.Events))
	}
	if res.Scanned == nil || *res.Scanned != 100 {
		t.Errorf("skip scan covered %v keys, want 100 (90 known, stepped over; 10 read)", res.Scanned)
	}
	if res.Floors == nil || res.Floors.ScanHeads != 10 {
		t.Errorf("skip scan found %+v heads of unknown keys, want 10", res.Floors)
	}
}

// migratedTable creates and migrates a fresh outbox table (dropped at the test's end).
func migratedTable(t *testing.T, db *sql.DB) (string, *dialect.Table) {
	t.Helper()
	name := pgtest.Table(t)
	tbl := &dialect.Table{Parts: []string{name}, IndexBase: name, FillFactor: 50, FillDefault: true, LockSeed: 1}
	if err := (Dialect{}).Migrate(context.Background(), dialect.StdSQL{D: db, Pgx: true}, tbl); err != nil {
		t.Fatal(err)
	}
	return name, tbl
}

// holdSnapshot opens a REPEATABLE READ transaction on its own connection and takes its snapshot
// (a read of table), held until the test ends: no row version written after it can be removed.
func holdSnapshot(t *testing.T, db *sql.DB, table string) {
	t.Helper()
	ctx := context.Background()
	held, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		held.ExecContext(ctx, `ROLLBACK`) //nolint:errcheck
		held.Close()
	})
	if _, err := held.ExecContext(ctx, `BEGIN ISOLATION LEVEL REPEATABLE READ`); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := held.QueryRowContext(ctx, `SELECT count(*) FROM `+dialect.DoubleQuote(table)).Scan(&n); err != nil {
		t.Fatal(err)
	}
}
