package dialect

import "sync"

// The dialects linked into the program, by Name. PostgreSQL is built into the root package;
// the others register themselves when the program imports their public package
// (github.com/watermill-outbox/outbox/sqlite, …/mysql), so a program links only the drivers
// of the databases it uses.
var (
	registryMu sync.RWMutex
	registry   = map[string]Dialect{}
)

// Register makes d the dialect named d.Name(). It is called from the init function of a public
// dialect package. Registering a name twice panics (two packages claiming one database is a
// programming error). Safe for concurrent use.
func Register(d Dialect) {
	registryMu.Lock()
	defer registryMu.Unlock()
	name := d.Name()
	if _, dup := registry[name]; dup {
		panic("outbox: dialect " + name + " registered twice")
	}
	registry[name] = d
}

// Registered returns the dialect registered under name, or nil when the program did not
// import its package. Safe for concurrent use.
func Registered(name string) Dialect {
	registryMu.RLock()
	defer registryMu.RUnlock()
	return registry[name]
}
