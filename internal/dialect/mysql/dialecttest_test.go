package mysql

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/watermill-outbox/outbox/internal/dialect"
	"github.com/watermill-outbox/outbox/internal/dialect/dialecttest"
	"github.com/watermill-outbox/outbox/internal/mariadbtest"
)

// TestDialectSuite runs the shared dialect suite on the MariaDB/MySQL test database.
func TestDialectSuite(t *testing.T) {
	dialecttest.Run(t, dialecttest.Harness{Dialect: New(), Ex: sqlEx(needDB(t)), Raw: sqlEx(mariadbtest.Raw(t)), TextType: "VARCHAR(64) NULL",
		Table: func(t *testing.T) *dialect.Table { return newTableConfig(t) },
		At: func(d time.Duration) string {
			return fmt.Sprintf("(UTC_TIMESTAMP(6) + INTERVAL %d MICROSECOND)", d.Microseconds())
		},
		Session: func(ctx context.Context, ex dialect.Executor) (int64, error) {
			rs, err := ex.Query(ctx, "SELECT CONNECTION_ID()")
			if err != nil {
				return 0, err
			}
			return dialect.ScanOne[int64](rs)
		},
		Waiting: func(ctx context.Context, id int64) (bool, error) {
			// A lock wait in InnoDB, or a statement running for a second or more: MariaDB
			// 10.11 often lists no transaction at all for a session waiting in the key-lock
			// table's INSERT (seen in information_schema.INNODB_TRX while PROCESSLIST showed
			// the statement executing).
			rs, err := sqlEx(needDB(t)).Query(ctx, `SELECT (SELECT COUNT(*) FROM information_schema.INNODB_TRX WHERE trx_mysql_thread_id = ? AND trx_state = 'LOCK WAIT')
	+ (SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = ? AND COMMAND <> 'Sleep' AND TIME >= 1)`, id, id)
			if err != nil {
				return false, err
			}
			n, err := dialect.ScanOne[int64](rs)
			return n > 0, err
		},
	})
}
