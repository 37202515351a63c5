package outbox_test

import (
	"database/sql"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	wmsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/internal/mariadbtest"
)

// BenchmarkDrainMariaDB drains a backlog from MariaDB (DialectMySQL) into an in-memory handler
// that acks at once, with BenchmarkDrain's relay settings (BatchSize 1000, MaxRunPerKey 100,
// Concurrency 100, 10 ms poll), for unordered, 1,000-key and 10-hot-key backlogs at one and two
// relays, beside watermill-sql v4's MySQL subscriber (DefaultMySQLSchema, batch 1000, 10 ms
// poll) on the same server. The variants alternate over OUTBOX_BENCH_ROUNDS rounds (default 3,
// reversed every other round), each on a freshly seeded table (seeding untimed); it reports
// each variant's median events/s and ours ÷ watermill-sql per shape and relay count.
// OUTBOX_BENCH_EVENTS sets the backlog (default 50000); OUTBOX_BENCH_SHAPE runs one shape only
// (unordered, 1000keys, 10hotkeys) besides watermill-sql.
//
//	go test -run '^$' -bench 'BenchmarkDrainMariaDB$' -benchtime 1x -timeout 60m .
func BenchmarkDrainMariaDB(b *testing.B) {
	db := mariadbtest.Require(b)
	n := envInt("OUTBOX_BENCH_EVENTS", 50000)
	rounds := envInt("OUTBOX_BENCH_ROUNDS", 3)
	shapes := []drainShape{{"unordered", 0}, {"1000keys", 1000}, {"10hotkeys", 10}}
	if only := os.Getenv("OUTBOX_BENCH_SHAPE"); only != "" {
		shapes = slices.DeleteFunc(shapes, func(s drainShape) bool { return s.name != only })
	}
	var variants []benchVariant
	for _, sh := range shapes {
		for _, relays := range []int{1, 2} {
			variants = append(variants, benchVariant{fmt.Sprintf("outbox/%s/relays=%d", sh.name, relays), func() float64 {
				schema := outbox.SchemaConfig{Table: mariadbtest.Table(b), Dialect: outbox.DialectMySQL}
				seedMariaDB(b, db, schema, n, sh.keys)
				return drainRate(b, db, schema, n, relays, func() int {
					var left int
					db.QueryRow(fmt.Sprintf("SELECT count(*) FROM `%s` WHERE published_at IS NULL", schema.Table)).Scan(&left)
					return left
				})
			}})
		}
	}
	variants = append(variants, benchVariant{"watermill-sql/unordered/relays=1", func() float64 { return watermillMySQLDrain(b, db, n) }})
	med := runInterleaved(b, rounds, variants)
	var table strings.Builder
	fmt.Fprintf(&table, "\nmedians of %d interleaved rounds, %d events each (MariaDB):\n", rounds, n)
	for _, v := range variants {
		fmt.Fprintf(&table, "%-34s %10.0f\n", v.name, med(v.name))
		b.ReportMetric(med(v.name), strings.NewReplacer("/", "-", "relays=", "r").Replace(v.name)+"-ev/s")
	}
	wm := med("watermill-sql/unordered/relays=1")
	for _, sh := range shapes {
		o1, o2 := med(fmt.Sprintf("outbox/%s/relays=1", sh.name)), med(fmt.Sprintf("outbox/%s/relays=2", sh.name))
		fmt.Fprintf(&table, "%-12s r1÷watermill-sql %.2f  r2÷watermill-sql %.2f  r2÷r1 %.2f\n", sh.name, o1/wm, o2/wm, o2/o1)
		b.ReportMetric(o1/wm, sh.name+"-r1÷watermill-sql")
		b.ReportMetric(o2/wm, sh.name+"-r2÷watermill-sql")
	}
	b.Log(table.String())
}

// seedMariaDB writes n events on topic "bench" round-robin over keys (0: unordered) with the
// Publisher, 1,000 per call, then ANALYZEs the table (untimed).
func seedMariaDB(b *testing.B, db *sql.DB, schema outbox.SchemaConfig, n, keys int) {
	if err := outbox.Migrate(ctx, db, schema); err != nil {
		b.Fatal(err)
	}
	pub, err := outbox.NewPublisher(db, outbox.PublisherConfig{Schema: schema, MaxOrderingKeysPerCall: 1000}, nil)
	if err != nil {
		b.Fatal(err)
	}
	enqueueBacklog(b, pub, n, keys)
	if _, err := db.Exec(fmt.Sprintf("ANALYZE TABLE `%s`", schema.Table)); err != nil {
		b.Fatal(err)
	}
}

// watermillMySQLDrain publishes n messages with watermill-sql v4's MySQL publisher (untimed),
// then times its subscriber (batch 1000, 10 ms poll) receiving and acking all of them.
func watermillMySQLDrain(b *testing.B, db *sql.DB, n int) float64 {
	topic := fmt.Sprintf("wmdrain_%d_%d", os.Getpid(), time.Now().UnixNano())
	defer db.Exec(fmt.Sprintf("DROP TABLE IF EXISTS `watermill_%s`, `watermill_offsets_%s`", topic, topic))
	schemaAdapter := wmsql.DefaultMySQLSchema{SubscribeBatchSize: 1000}
	pub, err := wmsql.NewPublisher(wmsql.BeginnerFromStdSQL(db), wmsql.PublisherConfig{SchemaAdapter: schemaAdapter, AutoInitializeSchema: true}, nil)
	if err != nil {
		b.Fatal(err)
	}
	wmPublish(b, pub, topic, n)
	sub, err := wmsql.NewSubscriber(wmsql.BeginnerFromStdSQL(db), wmsql.SubscriberConfig{
		SchemaAdapter: schemaAdapter, OffsetsAdapter: wmsql.DefaultMySQLOffsetsAdapter{},
		InitializeSchema: true, PollInterval: 10 * time.Millisecond,
	}, nil)
	if err != nil {
		b.Fatal(err)
	}
	return wmDrain(b, sub, topic, n)
}
