package linktest_test

import (
	"testing"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/internal/linktest"
)

// This test binary imports neither outbox/sqlite nor outbox/mysql, as a PostgreSQL-only program.

func TestPostgreSQLOnly(t *testing.T) {
	linktest.Linked(t, outbox.DialectPostgreSQL, outbox.Capabilities{Notify: true, ConcurrentRelays: true,
		ContinuedRuns: true, DatabaseClock: true, SchemaQualified: true, ClaimAhead: true})
	linktest.Unlinked(t, outbox.DialectSQLite, "github.com/watermill-outbox/outbox/sqlite")
	linktest.Unlinked(t, outbox.DialectMySQL, "github.com/watermill-outbox/outbox/mysql")
}
