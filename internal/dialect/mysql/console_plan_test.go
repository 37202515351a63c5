package mysql

import (
	"context"
	"database/sql"
	"os"
	"strings"
	"testing"

	"github.com/watermill-outbox/outbox/internal/dialect/dialecttest"
)

// TestOperatorPlans: every statement of the operator's reads and actions (dialect.Operator,
// console.sql) and of the narrowed dead-letter filters reads the outbox table through an index
// range, a lookup or a loose index scan, never a full scan of the table or of an index: the
// pending index's live entries, the key index (outbox_key, NULL once published), the
// dead_lettered_at and published_at indexes' ranges, the primary key. The table holds 20,000
// published events, 1,000 pending (some failed, some leased) and 50 dead-lettered ones,
// ANALYZEd. OUTBOX_PLAN_DUMP=file writes the plans there.
func TestOperatorPlans(t *testing.T) {
	ctx := context.Background()
	db := needDB(t)
	tb := newTable(t)
	n := namesOf(tb)
	for _, q := range []string{
		"INSERT INTO " + n.table + " (`id`, `topic`, `payload`, `ordering_key`, `outbox_key`, `created_at`, `published_at`)" +
			" SELECT UUID(), CONCAT('t', seq % 5), '{}', IF(seq % 2 = 0, CONCAT('k', seq % 500), NULL), NULL," +
			" UTC_TIMESTAMP(6) - INTERVAL seq SECOND, UTC_TIMESTAMP(6) - INTERVAL seq SECOND + INTERVAL 500000 MICROSECOND FROM seq_1_to_20000",
		"INSERT INTO " + n.table + " (`id`, `topic`, `payload`, `ordering_key`, `attempts`, `last_error`, `next_attempt_at`, `lease_until`, `leased_by`)" +
			" SELECT UUID(), CONCAT('t', seq % 5), '{}', IF(seq % 2 = 0, CONCAT('k', seq % 100), NULL), IF(seq % 50 = 0, 1, 0), IF(seq % 50 = 0, 'boom', NULL)," +
			" IF(seq % 50 = 0, UTC_TIMESTAMP(6) + INTERVAL 1 HOUR, NULL), IF(seq % 3 = 0, UTC_TIMESTAMP(6) + INTERVAL 1 MINUTE, NULL), IF(seq % 3 = 0, 'r#0123456789ab#1', NULL) FROM seq_1_to_1000",
		"INSERT INTO " + n.table + " (`id`, `topic`, `payload`, `ordering_key`, `attempts`, `last_error`, `dead_lettered_at`)" +
			" SELECT UUID(), CONCAT('t', seq % 5), '{}', IF(seq % 2 = 0, CONCAT('k', seq % 100), NULL), 5, 'boom', UTC_TIMESTAMP(6) - INTERVAL seq MINUTE FROM seq_1_to_50",
		"ANALYZE TABLE " + n.table,
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	var key string
	var head int64
	if err := db.QueryRowContext(ctx, "SELECT o.`ordering_key`, o.`sequence` FROM "+n.table+" o WHERE o.`outbox_pending` = 1 AND o.`attempts` > 0"+
		" AND o.`sequence` = (SELECT MIN(e.`sequence`) FROM "+n.table+" e WHERE e.`outbox_key` = o.`outbox_key`) ORDER BY o.`sequence` LIMIT 1").Scan(&key, &head); err != nil {
		t.Fatal(err)
	}
	d := New()
	ops := dialecttest.OperatorCalls(ctx, d, tb, key, head)
	var dump strings.Builder
	for _, op := range ops {
		t.Run(op.Name, func(t *testing.T) {
			tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback()
			ex := &planEx{Executor: sqlEx(tx), table: n.name}
			if err := op.Run(ex); err != nil {
				t.Fatal(err)
			}
			plans := strings.Join(ex.plans, "-- then\n")
			dump.WriteString("== " + op.Name + "\n" + plans)
			reads := 0
			for _, line := range strings.Split(plans, "\n") {
				f := strings.Fields(line)
				if len(f) < 5 || !strings.Contains(" o h e r T ", " "+f[2]+" ") {
					continue
				}
				reads++
				if f[3] == "ALL" || f[3] == "index" || strings.HasPrefix(f[4], "key=()") {
					t.Errorf("a statement reads the table without an index range: %q\n%s", line, plans)
				}
			}
			if reads == 0 {
				t.Errorf("no read of the table in the plans:\n%s", plans)
			}
		})
	}
	if f := os.Getenv("OUTBOX_PLAN_DUMP"); f != "" {
		if err := os.WriteFile(f, []byte(dump.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
