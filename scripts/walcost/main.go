// Command walcost measures what each index and column type of the outbox table costs the write
// path on PostgreSQL: 8 writers each commit transactions of one business INSERT plus one keyed
// event (as BenchmarkWritePath), against tables that differ in one respect, in interleaved
// rounds. It reports per variant the median tx/s, the WAL bytes per transaction written to
// each relation of the table (pg_walinspect, by relfilenode: load-independent, unlike tx/s on a
// shared machine), and the CPU time per transaction of the 8 server backends (from /proc: the
// server must run on this machine) and of this process (the writers' client side). The
// "narrow" variants strip the table to what a write-only table would hold, and "narrow
// unordered" also publishes without an ordering key: they show how much of the gap to
// watermill-sql the table's shape explains. It needs a database where it may create tables
// and the pg_walinspect extension (superuser):
//
//	go run ./scripts/walcost -db 'postgres://postgres@127.0.0.1:5432/hwrite' -tx 3000 -rounds 3
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/watermill-outbox/outbox"
)

type variant struct {
	name  string
	cfg   outbox.SchemaConfig
	setup []string // statements run after Migrate (%[1]s = quoted table, %[2]s = index base)
	wm    bool     // watermill-sql v4's publisher and default schema instead
	// unordered publishes events without an ordering key: no per-key lock, no
	// keyed index entries.
	unordered bool
}

func main() {
	dsn := flag.String("db", "postgres://postgres@127.0.0.1:5432/hwrite", "database (pg_walinspect installed)")
	total := flag.Int("tx", 3000, "transactions per round and variant")
	rounds := flag.Int("rounds", 3, "interleaved rounds")
	only := flag.String("only", "", "comma-separated variant names (default all)")
	flag.Parse()
	ctx := context.Background()
	pcfg, err := pgxpool.ParseConfig(*dsn)
	if err != nil {
		log.Fatal(err)
	}
	pcfg.MaxConns = 16 // 8 writers hold one each; setup needs more
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	must := func(_ any, err error) {
		if err != nil {
			log.Fatal(err)
		}
	}
	must(pool.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_walinspect`))
	must(pool.Exec(ctx, `DROP TABLE IF EXISTS walcost_biz; CREATE TABLE walcost_biz (id bigserial PRIMARY KEY, v int)`))
	topicIdx := `CREATE INDEX %[2]s_topic_idx ON %[1]s ("topic", "sequence")`
	jsonbHeaders := `ALTER TABLE %[1]s ALTER COLUMN "headers" TYPE jsonb`
	// Dropping the relay's columns drops every index whose key or predicate names one of them
	// (all but the primary key, the unique id and the idempotency index).
	narrow := []string{
		`ALTER TABLE %[1]s DROP COLUMN "attempts", DROP COLUMN "last_error", DROP COLUMN "next_attempt_at", DROP COLUMN "lease_until", DROP COLUMN "leased_by", DROP COLUMN "published_at", DROP COLUMN "dead_lettered_at", DROP COLUMN "delivery_starts"`,
		`DROP INDEX IF EXISTS %[2]s_key_idx`,
		`ALTER TABLE %[1]s SET (fillfactor = 100)`,
	}
	variants := []variant{
		{name: "old: jsonb+topic_idx", cfg: outbox.SchemaConfig{PayloadType: outbox.PayloadJSONB}, setup: []string{jsonbHeaders, topicIdx}},
		{name: "json+topic_idx", setup: []string{topicIdx}},
		{name: "new: json", cfg: outbox.SchemaConfig{}},
		{name: "json-unique_id", setup: []string{`ALTER TABLE %[1]s DROP CONSTRAINT %[2]s_id_key`}},
		{name: "json ff100", cfg: outbox.SchemaConfig{FillFactor: 100}},
		{name: "json-claim_idx", setup: []string{`DROP INDEX %[2]s_keyed_idx`, `DROP INDEX %[2]s_key_idx`}}, // what the claim's indexes cost (not a usable table)
		// What a table that writers only append to would cost (a storage redesign: no lease or
		// mark columns, no claim indexes; not a usable outbox table). The dropped columns stay
		// in the row as null-bitmap bits, so this is an upper bound of a truly narrow table's cost.
		{name: "narrow+unique_id", setup: narrow},
		{name: "narrow", setup: append(slices.Clone(narrow), `ALTER TABLE %[1]s DROP CONSTRAINT %[2]s_id_key`)},
		{name: "narrow unordered", setup: append(slices.Clone(narrow), `ALTER TABLE %[1]s DROP CONSTRAINT %[2]s_id_key`), unordered: true},
		{name: "watermill-sql", wm: true},
	}
	if *only != "" {
		keep := strings.Split(*only, ",")
		variants = slices.DeleteFunc(variants, func(v variant) bool { return !slices.Contains(keep, v.name) })
	}
	type result struct {
		rate []float64
		wal  []map[string]float64
	}
	results := map[string]*result{}
	for r := range *rounds {
		order := slices.Clone(variants)
		if r%2 == 1 {
			slices.Reverse(order)
		}
		for _, v := range order {
			rate, wal := runVariant(ctx, pool, v, *total)
			if results[v.name] == nil {
				results[v.name] = &result{}
			}
			results[v.name].rate = append(results[v.name].rate, rate)
			results[v.name].wal = append(results[v.name].wal, wal)
			fmt.Fprintf(os.Stderr, "round %d %-22s %7.0f tx/s  WAL/tx %s\n", r+1, v.name, rate, fmtWAL(wal))
		}
	}
	median := func(xs []float64) float64 {
		xs = slices.Clone(xs)
		sort.Float64s(xs)
		return xs[len(xs)/2]
	}
	fmt.Printf("medians of %d interleaved rounds, %d tx each, 8 writers:\n", *rounds, *total)
	base := median(results[variants[len(variants)-1].name].rate)
	for _, v := range variants {
		res := results[v.name]
		keys := map[string]bool{}
		for _, w := range res.wal {
			for k := range w {
				keys[k] = true
			}
		}
		med := map[string]float64{}
		for k := range keys {
			var xs []float64
			for _, w := range res.wal {
				xs = append(xs, w[k])
			}
			med[k] = median(xs)
		}
		fmt.Printf("%-22s %7.0f tx/s (%.2fx of %s)  WAL bytes/tx %s\n", v.name, median(res.rate), median(res.rate)/base, variants[len(variants)-1].name, fmtWAL(med))
	}
}

func fmtWAL(w map[string]float64) string {
	var keys []string
	for k := range w {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, " %s=%.0f", k, w[k])
	}
	return b.String()
}

// runVariant creates the variant's table, runs total transactions with 8 writers, and returns
// tx/s and WAL bytes per transaction by relation (suffix of the relation name; "commit" for
// commit records of the writers' transactions, "all" for every record in the window).
func runVariant(ctx context.Context, pool *pgxpool.Pool, v variant, total int) (float64, map[string]float64) {
	table := "walcost_" + strconv.Itoa(int(time.Now().UnixNano()%1e9))
	var publish func(tx pgx.Tx, i int) error
	if v.wm {
		topic := table
		table = "watermill_" + topic
		p, err := wmsql.NewPublisher(wmsql.BeginnerFromPgx(pool), wmsql.PublisherConfig{SchemaAdapter: wmsql.DefaultPostgreSQLSchema{}, AutoInitializeSchema: true}, nil)
		if err != nil {
			log.Fatal(err)
		}
		if err := p.Publish(topic, message.NewMessage(watermill.NewUUID(), []byte(`{}`))); err != nil {
			log.Fatal(err)
		}
		publish = func(tx pgx.Tx, i int) error {
			p, err := wmsql.NewPublisher(wmsql.TxFromPgx(tx), wmsql.PublisherConfig{SchemaAdapter: wmsql.DefaultPostgreSQLSchema{}}, nil)
			if err != nil {
				return err
			}
			return p.Publish(topic, message.NewMessage(watermill.NewUUID(), []byte(`{"order":`+strconv.Itoa(i)+`}`)))
		}
	} else {
		cfg := v.cfg
		cfg.Table = table
		if err := outbox.Migrate(ctx, pool, cfg); err != nil {
			log.Fatal(err)
		}
		for _, st := range v.setup {
			if _, err := pool.Exec(ctx, fmt.Sprintf(st, `"`+table+`"`, table)); err != nil {
				log.Fatalf("%s: %v", st, err)
			}
		}
		publish = func(tx pgx.Tx, i int) error {
			p, err := outbox.NewPublisher(tx, outbox.PublisherConfig{Schema: cfg}, nil)
			if err != nil {
				return err
			}
			m := outbox.NewMessage([]byte(`{"order":` + strconv.Itoa(i) + `}`))
			if !v.unordered {
				outbox.SetOrderingKey(m, "customer-"+strconv.Itoa(i%1000))
			}
			return p.Publish("orders", m)
		}
	}
	defer pool.Exec(ctx, `DROP TABLE IF EXISTS "`+table+`"`)
	if _, err := pool.Exec(ctx, `CHECKPOINT`); err != nil {
		log.Fatal(err)
	}
	var start, end string
	if err := pool.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&start); err != nil {
		log.Fatal(err)
	}
	// Each writer holds one connection, so its backend's CPU time can be read from /proc.
	conns := make([]*pgxpool.Conn, 8)
	pids := make([]int, 8)
	for w := range conns {
		c, err := pool.Acquire(ctx)
		if err != nil {
			log.Fatal(err)
		}
		defer c.Release()
		conns[w], pids[w] = c, int(c.Conn().PgConn().PID())
	}
	serverCPU0, clientCPU0 := backendCPU(pids), processCPU()
	var next atomic.Int64
	var wg sync.WaitGroup
	t0 := time.Now()
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1))
				if i > total {
					return
				}
				if err := pgx.BeginFunc(ctx, conns[w], func(tx pgx.Tx) error {
					if _, err := tx.Exec(ctx, `INSERT INTO walcost_biz (v) VALUES ($1)`, i); err != nil {
						return err
					}
					return publish(tx, i)
				}); err != nil {
					log.Fatal(err)
				}
			}
		}()
	}
	wg.Wait()
	rate := float64(total) / time.Since(t0).Seconds()
	serverCPU, clientCPU := backendCPU(pids)-serverCPU0, processCPU()-clientCPU0
	if err := pool.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&end); err != nil {
		log.Fatal(err)
	}
	// pg_walinspect reads only flushed WAL.
	for flushed := false; !flushed; time.Sleep(10 * time.Millisecond) {
		if err := pool.QueryRow(ctx, `SELECT pg_current_wal_flush_lsn() >= $1::pg_lsn`, end).Scan(&flushed); err != nil {
			log.Fatal(err)
		}
	}
	// Each record is charged to the relation of its first block reference; names are shortened
	// to the part after the table name ("" = the heap).
	rows, err := pool.Query(ctx, `
WITH rels AS (
	SELECT c.relfilenode, CASE WHEN c.oid = $3::regclass THEN 'heap' ELSE coalesce(nullif(replace(c.relname, $4, ''), ''), 'heap') END AS name
	FROM pg_class c WHERE c.oid = $3::regclass OR c.oid IN (SELECT indexrelid FROM pg_index WHERE indrelid = $3::regclass)),
w AS (SELECT record_length, resource_manager, record_type, substring(block_ref from 'rel \d+/\d+/(\d+)')::oid AS rel FROM pg_get_wal_records_info($1::pg_lsn, $2::pg_lsn))
SELECT r.name, sum(w.record_length) FROM w JOIN rels r ON r.relfilenode = w.rel GROUP BY r.name
UNION ALL SELECT 'all', sum(record_length) FROM w`, start, end, `"`+table+`"`, table+"_")
	if err != nil {
		log.Fatal(err)
	}
	wal := map[string]float64{}
	for rows.Next() {
		var name string
		var bytes int64
		if err := rows.Scan(&name, &bytes); err != nil {
			log.Fatal(err)
		}
		wal[strings.TrimSuffix(name, "_idx")] = float64(bytes) / float64(total)
	}
	if err := rows.Err(); err != nil {
		log.Fatal(err)
	}
	wal["cpu-server-us"] = serverCPU.Seconds() * 1e6 / float64(total)
	wal["cpu-client-us"] = clientCPU.Seconds() * 1e6 / float64(total)
	return rate, wal
}

// backendCPU returns the CPU time (user + system) the processes pids have used, from
// /proc/<pid>/stat (the server must run on this machine).
func backendCPU(pids []int) time.Duration {
	var ticks int64
	for _, pid := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			log.Fatal(err)
		}
		f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
		u, _ := strconv.ParseInt(f[11], 10, 64)
		st, _ := strconv.ParseInt(f[12], 10, 64)
		ticks += u + st
	}
	return time.Duration(ticks) * 10 * time.Millisecond // USER_HZ = 100
}

// processCPU returns this process's CPU time (user + system).
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		log.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
