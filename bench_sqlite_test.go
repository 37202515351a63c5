package outbox_test

import (
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/watermill-outbox/outbox"
)

// BenchmarkDrainSQLite drains a backlog from a SQLite file (modernc.org/sqlite, opened with
// outbox.SQLiteDSN) into an in-memory handler that acks at once, with the relay settings of
// BenchmarkDrain (BatchSize 1000, MaxRunPerKey 100, Concurrency 100), one and two relays.
// Reports events/s. OUTBOX_BENCH_EVENTS sets the backlog (default 100000); OUTBOX_BENCH_SHAPE
// runs one shape only (unordered, 1000keys, distinctkeys, 10hotkeys).
func BenchmarkDrainSQLite(b *testing.B) {
	n := envInt("OUTBOX_BENCH_EVENTS", 100000)
	shapes := []drainShape{{"unordered", 0}, {"1000keys", 1000}, {"distinctkeys", n}, {"10hotkeys", 10}}
	if only := os.Getenv("OUTBOX_BENCH_SHAPE"); only != "" {
		shapes = slices.DeleteFunc(shapes, func(s drainShape) bool { return s.name != only })
	}
	for _, sh := range shapes {
		for _, relays := range []int{1, 2} {
			b.Run(fmt.Sprintf("sqlite/%s/relays=%d", sh.name, relays), func(b *testing.B) {
				for range b.N {
					b.StopTimer()
					db, err := sql.Open("sqlite", outbox.SQLiteDSN(filepath.Join(b.TempDir(), "bench.db")))
					if err != nil {
						b.Fatal(err)
					}
					schema := outbox.SchemaConfig{Dialect: outbox.DialectSQLite}
					if err := outbox.Migrate(ctx, db, schema); err != nil {
						b.Fatal(err)
					}
					pub, err := outbox.NewPublisher(db, outbox.PublisherConfig{Schema: schema, MaxOrderingKeysPerCall: 1000}, nil)
					if err != nil {
						b.Fatal(err)
					}
					enqueueBacklog(b, pub, n, sh.keys)
					drain(b, db, schema, n, relays, func() int {
						var left int
						db.QueryRow(`SELECT count(*) FROM watermill_outbox WHERE published_at IS NULL`).Scan(&left)
						return left
					})
					db.Close()
				}
			})
		}
	}
}
