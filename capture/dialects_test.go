package capture_test

import (
	"context"
	"errors"
	"testing"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/capture"
	"github.com/watermill-outbox/outbox/internal/mariadbtest"
	_ "github.com/watermill-outbox/outbox/mysql" // outbox.DialectMySQL
)

// TestMariaDBRefused: the package generates triggers for PostgreSQL and SQLite only: on a
// MariaDB/MySQL outbox every function returns a *outbox.ConfigError for SchemaConfig.Dialect
// (ErrUnsupportedDB) before any SQL, on a working MariaDB handle, and Supports says so.
func TestMariaDBRefused(t *testing.T) {
	if capture.Supports(outbox.DialectMySQL) || !capture.Supports(outbox.DialectPostgreSQL) || !capture.Supports(outbox.DialectSQLite) {
		t.Fatalf("Supports: MySQL %v, PostgreSQL %v, SQLite %v; want false, true, true",
			capture.Supports(outbox.DialectMySQL), capture.Supports(outbox.DialectPostgreSQL), capture.Supports(outbox.DialectSQLite))
	}
	db := mariadbtest.Raw(t)
	schema := outbox.SchemaConfig{Table: "outbox_capture_refused", Dialect: outbox.DialectMySQL}
	tables := []capture.Table{{Name: "orders"}}
	ctx := context.Background()
	for name, call := range map[string]func() error{
		"Install":   func() error { return capture.Install(ctx, db, schema, tables...) },
		"SQL":       func() error { _, err := capture.SQL(ctx, db, schema, tables...); return err },
		"Uninstall": func() error { return capture.Uninstall(ctx, db, schema, tables...) },
		"Verify":    func() error { return capture.Verify(ctx, db, schema, tables...) },
	} {
		err := call()
		var ce *outbox.ConfigError
		if !errors.As(err, &ce) || ce.Field != "SchemaConfig.Dialect" || !errors.Is(err, outbox.ErrUnsupportedDB) {
			t.Errorf("%s: %v, want a *outbox.ConfigError for SchemaConfig.Dialect wrapping ErrUnsupportedDB", name, err)
		}
	}
}
