package inbox_test

import (
	"errors"
	"testing"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/inbox"
	"github.com/watermill-outbox/outbox/internal/mariadbtest"
)

// TestMariaDBDriverRefused: the package has no MariaDB/MySQL SQL (Supports), and a MariaDB
// *sql.DB given for a PostgreSQL inbox is refused by New, before any SQL, naming both: the
// driver is told from its package path as the outbox's own handle check tells it.
func TestMariaDBDriverRefused(t *testing.T) {
	if inbox.Supports(outbox.DialectMySQL) || !inbox.Supports(outbox.DialectPostgreSQL) || !inbox.Supports(outbox.DialectSQLite) {
		t.Fatal("Supports: want PostgreSQL and SQLite only")
	}
	_, err := inbox.New(inbox.FromSQL(mariadbtest.Raw(t), nil), inbox.Config{Consumer: "c"}, nil)
	var ce *outbox.ConfigError
	if !errors.As(err, &ce) || ce.Field != "inbox.Config.Schema.Dialect" || ce.Reason != "the database is mysql but the dialect is postgresql" || !errors.Is(err, outbox.ErrUnsupportedDB) {
		t.Fatalf("New: %v, want a *outbox.ConfigError for inbox.Config.Schema.Dialect naming mysql and postgresql", err)
	}
	err = inbox.Migrate(t.Context(), mariadbtest.Raw(t), inbox.SchemaConfig{})
	if !errors.As(err, &ce) || ce.Field != "inbox.SchemaConfig.Dialect" || !errors.Is(err, outbox.ErrUnsupportedDB) {
		t.Fatalf("Migrate: %v, want a *outbox.ConfigError for inbox.SchemaConfig.Dialect", err)
	}
}
