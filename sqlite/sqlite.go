// Package sqlite adds outbox.DialectSQLite to a program: import it for its side effect,
//
//	import _ "github.com/watermill-outbox/outbox/sqlite"
//
// and set SchemaConfig.Dialect = outbox.DialectSQLite. Without the import NewPublisher,
// NewSubscriber, Migrate and SchemaConfig.Validate return a *outbox.ConfigError naming this
// package, so a program that does not use SQLite links none of its SQL.
//
// The package links no SQLite driver: open the database with the database/sql driver of your
// choice, such as modernc.org/sqlite, through outbox.SQLiteDSN.
package sqlite

import (
	"github.com/watermill-outbox/outbox/internal/dialect"
	impl "github.com/watermill-outbox/outbox/internal/dialect/sqlite"
)

func init() { dialect.Register(impl.Dialect{}) }
