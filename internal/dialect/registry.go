package dialect

import (
	"database/sql/driver"
	"reflect"
	"strings"
	"sync"
)

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

// driverPackages maps a fragment of a database/sql driver's package path to the name of the
// dialect the driver speaks, tried in order. Recognising a driver needs no dialect linked.
var driverPackages = []struct{ fragment, name string }{
	{"sqlite", "sqlite"},
	{"pgx", "postgresql"},
	{"lib/pq", "postgresql"},
	{"mysql", "mysql"},
}

// DriverDialect returns the name of the dialect a database/sql driver speaks, told from its
// package path; ok is false for a driver it does not recognise.
func DriverDialect(drv driver.Driver) (name string, ok bool) {
	if drv == nil {
		return "", false
	}
	t := reflect.TypeOf(drv)
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	pkg := strings.ToLower(t.PkgPath())
	for _, p := range driverPackages {
		if strings.Contains(pkg, p.fragment) {
			return p.name, true
		}
	}
	return "", false
}
