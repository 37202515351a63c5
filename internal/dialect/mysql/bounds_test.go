package mysql

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/watermill-outbox/outbox/internal/dialect"
)

// handlerReads returns the session's Handler_read_* total on conn.
func handlerReads(t testing.TB, conn *sql.Conn) int64 {
	t.Helper()
	rs, err := conn.QueryContext(context.Background(), "SHOW SESSION STATUS LIKE 'Handler_read%'")
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	var total int64
	for rs.Next() {
		var name, val string
		if err := rs.Scan(&name, &val); err != nil {
			t.Fatal(err)
		}
		n, _ := strconv.ParseInt(val, 10, 64)
		total += n
	}
	return total
}

// reads returns the Handler_read_* rows fn causes on conn (less what reading the counters
// costs).
func reads(t testing.TB, conn *sql.Conn, fn func()) int64 {
	t.Helper()
	base := handlerReads(t, conn)
	idle := handlerReads(t, conn) - base
	before := handlerReads(t, conn)
	fn()
	return handlerReads(t, conn) - before - idle
}

// fillBacklog writes published (published first, older) and then pending events over keys
// keys (every tenth pending event unordered).
func fillBacklog(t testing.TB, tb *dialect.Table, published, pending, keys int) {
	t.Helper()
	write := func(n int, unorderedEvery int) {
		for done := 0; done < n; {
			rows := make([]dialect.InsertRow, min(5000, n-done))
			for i := range rows {
				k := fmt.Sprintf("key%04d", rand.IntN(keys))
				if unorderedEvery > 0 && (done+i)%unorderedEvery == 0 {
					k = ""
				}
				rows[i] = ev("t", `{"n":1}`, k, "")
			}
			mustInsert(t, tb, rows...)
			done += len(rows)
		}
	}
	write(published, 10)
	exec(t, "UPDATE "+namesOf(tb).table+" SET published_at = UTC_TIMESTAMP(6) - INTERVAL 1 DAY, outbox_key = NULL")
	write(pending, 10)
	exec(t, "ANALYZE TABLE "+namesOf(tb).table)
}

// The relay's statements read live rows only: a claim, a mark and Backlog cost the same
// (Handler_read_* rows) on 10,000 pending events with and without 100,000 published ones, and
// stay within a small multiple of the batch. The figures are logged for the DDL's comments.
func TestIndexBounds(t *testing.T) {
	db := needDB(t)
	ctx := context.Background()
	measure := func(published int) map[string]int64 {
		tb := newTable(t)
		began := time.Now()
		fillBacklog(t, tb, published, 10000, 1000)
		t.Logf("%d published + 10,000 pending written in %v", published, time.Since(began).Round(time.Millisecond))
		conn, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		ex := sqlEx(conn)
		cfg := relayConfig(100, 10)
		r := New().NewRelay(tb, cfg, all)
		out := map[string]int64{}
		var res *dialect.ClaimResult
		out["claim"] = reads(t, conn, func() {
			res, err = r.Claim(ctx, ex, &dialect.ClaimParams{Token: "b1", Limit: 100, Oldest: 100})
			if err != nil {
				t.Fatal(err)
			}
		})
		if len(res.Events) != 100 || res.Scanned == nil || *res.Scanned != 100 {
			t.Fatalf("claim leased %d events, skip scan %v; want 100 and a full skip scan", len(res.Events), res.Scanned)
		}
		out["mark"] = reads(t, conn, func() {
			if _, err := r.Mark(ctx, ex, &dialect.MarkParams{Token: "b1", Acked: seqsOf(res.Events)}); err != nil {
				t.Fatal(err)
			}
		})
		out["claim2"] = reads(t, conn, func() {
			if _, err := r.Claim(ctx, ex, &dialect.ClaimParams{Token: "b2", Limit: 100, Oldest: 100}); err != nil {
				t.Fatal(err)
			}
		})
		out["backlog"] = reads(t, conn, func() {
			if _, err := New().Backlog(ctx, ex, tb); err != nil {
				t.Fatal(err)
			}
		})
		tbl := namesOf(tb).table
		// Without the generated flag: the oldest pending keyed events by their own columns.
		out["walk without outbox_pending"] = reads(t, conn, func() {
			rs, err := conn.QueryContext(ctx, "SELECT sequence FROM "+tbl+" WHERE published_at IS NULL AND dead_lettered_at IS NULL AND ordering_key IS NOT NULL ORDER BY sequence LIMIT 100")
			if err != nil {
				t.Fatal(err)
			}
			for rs.Next() {
			}
			rs.Close()
		})
		out["walk with outbox_pending"] = reads(t, conn, func() {
			rs, err := conn.QueryContext(ctx, "SELECT sequence FROM "+tbl+" FORCE INDEX ("+namesOf(tb).pending+") WHERE outbox_pending = 1 ORDER BY sequence LIMIT 100")
			if err != nil {
				t.Fatal(err)
			}
			for rs.Next() {
			}
			rs.Close()
		})
		out["cleanup 1000"] = reads(t, conn, func() {
			if _, err := New().Cleanup(ctx, ex, tb, "published_at", time.Hour, 1000); err != nil {
				t.Fatal(err)
			}
		})
		return out
	}
	live := measure(0)
	hist := measure(100000)
	for _, k := range []string{"claim", "mark", "claim2", "backlog", "walk with outbox_pending", "walk without outbox_pending", "cleanup 1000"} {
		t.Logf("%-28s Handler_read_*: %7d without history, %7d with 100,000 published", k, live[k], hist[k])
	}
	for _, k := range []string{"claim", "mark", "claim2", "backlog", "walk with outbox_pending"} {
		if d := hist[k] - live[k]; d > live[k]/10+50 || d < -(live[k]/10+50) {
			t.Errorf("%s: %d reads with history, %d without: history costs", k, hist[k], live[k])
		}
	}
	if live["claim"] > 3000 {
		t.Errorf("a claim of 100 read %d rows", live["claim"])
	}
}
