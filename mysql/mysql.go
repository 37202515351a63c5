// Package mysql adds outbox.DialectMySQL (MariaDB 10.6+, MySQL 8.0.23+) to a program: import
// it for its side effect,
//
//	import _ "github.com/watermill-outbox/outbox/mysql"
//
// and set SchemaConfig.Dialect = outbox.DialectMySQL. Without the import NewPublisher,
// NewSubscriber, Migrate and SchemaConfig.Validate return a *outbox.ConfigError naming this
// package, so a program that does not use MariaDB/MySQL links none of its SQL nor its driver.
//
// The import links github.com/go-sql-driver/mysql (the dialect reads its error numbers), which
// registers the database/sql driver "mysql".
package mysql

import (
	"github.com/watermill-outbox/outbox/internal/dialect"
	impl "github.com/watermill-outbox/outbox/internal/dialect/mysql"
)

func init() { dialect.Register(impl.New()) }
