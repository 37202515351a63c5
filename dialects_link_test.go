package outbox

// The root package's tests run every dialect.
import (
	_ "github.com/watermill-outbox/outbox/mysql"
	_ "github.com/watermill-outbox/outbox/sqlite"
)
