package sqlite_test

import (
	"testing"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/internal/linktest"
	_ "github.com/watermill-outbox/outbox/sqlite"
)

// This test binary imports outbox/sqlite and not outbox/mysql, as a SQLite-only program does.

func TestSQLiteLinked(t *testing.T) {
	linktest.Linked(t, outbox.DialectSQLite, outbox.Capabilities{ClaimAhead: true})
}

func TestMySQLNotLinked(t *testing.T) {
	linktest.Unlinked(t, outbox.DialectMySQL, "github.com/watermill-outbox/outbox/mysql")
}
