package mysql

import (
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
	})
}
