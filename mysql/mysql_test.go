package mysql_test

import (
	"testing"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/internal/linktest"
	_ "github.com/watermill-outbox/outbox/mysql"
)

// This test binary imports outbox/mysql and not outbox/sqlite, as a MariaDB/MySQL-only program
// does.

func TestMySQLLinked(t *testing.T) {
	linktest.Linked(t, outbox.DialectMySQL, outbox.Capabilities{ConcurrentRelays: true, ContinuedRuns: true,
		DatabaseClock: true, SchemaQualified: true})
}

func TestSQLiteNotLinked(t *testing.T) {
	linktest.Unlinked(t, outbox.DialectSQLite, "github.com/watermill-outbox/outbox/sqlite")
}
