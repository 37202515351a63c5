// Package dburl is the seam between programs that take a database URL (cmd/outbox) and the
// dialects: opening a URL returns the dialect's URL, and what the program does with the
// database that differs by database — connecting and its messages, schema checks, quoting,
// its own tables' SQL, the relay's wakeup — is a method of it. Each dialect implements it in
// its own package (internal/dialect/postgres/pgurl, internal/dialect/sqlite/sqliteurl,
// internal/dialect/mysql/mysqlurl), which registers itself on import; a program links only
// the dialects it imports.
package dburl

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/internal/dialect"
)

// ConnectTimeout bounds connecting to a server when the URL sets no timeout of its own.
const ConnectTimeout = 5 * time.Second

// Parser recognises and parses the URLs of one dialect.
type Parser interface {
	// Parse returns the URL of s (trimmed, not empty); ok is false when s is none of this
	// dialect's forms. forms lists every accepted form, for error messages. Errors are
	// one line, hide any password and name the accepted form.
	Parse(s, forms string) (u URL, ok bool, err error)
}

// URL is a parsed database URL.
type URL interface {
	// Dialect is the database's outbox dialect.
	Dialect() outbox.Dialect
	// SQL is the dialect's SQL layer (error classification, capabilities).
	SQL() dialect.Dialect
	// Raw is the URL as given (scheme lower-cased); Shown the same with any password hidden.
	Raw() string
	Shown() string
	// HostPort is the server's address as host:port (a PostgreSQL socket path), or the SQLite
	// file's path.
	HostPort() string
	// File is the SQLite file's path, "" for a server database.
	File() string
	// Where names the database for messages ("PostgreSQL at host:5432/app").
	Where() string
	// DropCommand is the command-line client's invocation that drops tables (the outbox
	// table's companions included) from this database, for messages.
	DropCommand(tables []string) string
	// Open connects and checks that the connection works. Errors are one line, name the fix,
	// and wrap a *ConnectFailure when the server could not be reached or refused the
	// connection.
	Open(ctx context.Context, o OpenOptions) (DB, error)
}

// OpenOptions say how URL.Open treats a database that does not exist yet.
type OpenOptions struct {
	// Create allows creating a missing SQLite file; otherwise a missing file is reported as a
	// missing outbox table, naming MigrateHint.
	Create bool
	// MigrateHint is the command that creates the outbox table, for messages.
	MigrateHint string
	// ApplicationName names the sessions to the server where it has such a name
	// (PostgreSQL's application_name); "" keeps the URL's.
	ApplicationName string
}

// Exec runs one statement in a transaction of DB.InTx.
type Exec func(query string, args ...any) error

// DB is an open database.
type DB interface {
	// Handle is the handle for the outbox packages: *pgxpool.Pool or *sql.DB.
	Handle() any
	// NewHandle opens a second handle on the same database (a pool of its own), with its
	// closer; a database with one writer returns Handle and a no-op.
	NewHandle(ctx context.Context) (any, func(), error)
	Close()
	// Exec runs one statement outside any transaction (placeholders as Params writes them).
	Exec(ctx context.Context, query string, args ...any) error
	// Strings runs query and returns its single text column.
	Strings(ctx context.Context, query string, args ...any) ([]string, error)
	// Int runs query and returns its single integer.
	Int(ctx context.Context, query string, args ...any) (int64, error)
	// InTx runs fn in a transaction: tx is the handle for outbox.NewPublisher (pgx.Tx or
	// *sql.Tx), exec runs statements in it. It commits when fn returns nil and rolls back
	// otherwise, returning fn's error.
	InTx(ctx context.Context, fn func(tx any, exec Exec) error) error

	// SchemaExists reports whether the schema (MariaDB/MySQL: database) name exists.
	SchemaExists(ctx context.Context, name string) (bool, error)
	// CreateSchema names what qualifies a table ("schema"; "database" on MariaDB/MySQL) and
	// the statement that creates the one named name.
	CreateSchema(name string) (word, stmt string)
	// SchemaGone reports whether err says that the schema (database) of a qualified table
	// does not exist.
	SchemaGone(err error) bool
	// Ident quotes a possibly qualified table name as an identifier.
	Ident(name string) string
	// Params returns n placeholders for a VALUES list.
	Params(n int) string
	// KeyType is the column type of a short text primary key.
	KeyType() string
	// OutboxTables returns the tables an outbox table named table consists of (itself and its
	// companions; a companion named after a hash is not returned).
	OutboxTables(table string) []string
	// MatchTables returns the outbox tables (those with a leased_by column) whose name
	// matches the glob pattern, sorted.
	MatchTables(ctx context.Context, pattern string) ([]string, error)
	// RelayWakeup returns what wakes a relay between polls besides the Subscriber itself (nil
	// for nothing, else closed by the caller) and logs how the relay wakes.
	RelayWakeup(cfg outbox.SubscriberConfig, logger watermill.LoggerAdapter) Wakeup

	Bench
}

// Wakeup is a relay's wakeup that the caller closes.
type Wakeup interface {
	outbox.Wakeup
	Close() error
}

// Bench is the SQL of cmd/outbox's bench that differs by database.
type Bench interface {
	// Settle flushes a seeded table's pages and statistics so that the timed part starts
	// alike.
	Settle(ctx context.Context, table string)
	// RawIndex gives the raw loop's table the index a hand-written loop on it would have.
	RawIndex(ctx context.Context, table string) error
	// RawRound is one round of the raw loop: lease the oldest 1,000 claimable rows, read them
	// as a relay would, mark them published. It returns how many it marked.
	RawRound(ctx context.Context, table string) (int, error)
	// RawEventsColumns is the column list of the write path's comparator, a plain events
	// table.
	RawEventsColumns() string
	// HoldSnapshot opens a transaction that takes a snapshot (reads the table once) and stays
	// idle until release.
	HoldSnapshot(ctx context.Context, table string) (release func(), err error)
}

// Title names u's database in messages ("PostgreSQL", "SQLite", "MariaDB/MySQL").
func Title(u URL) string { return u.SQL().Capabilities().Title }

// ConnectFailure is a failure to connect to the database server (down, unreachable, or
// refusing the connection): one that may pass.
type ConnectFailure struct{ Err error }

func (e *ConnectFailure) Error() string { return e.Err.Error() }

// Unwrap returns the message's error.
func (e *ConnectFailure) Unwrap() error { return e.Err }

var (
	mu      sync.RWMutex
	parsers = map[string]Parser{}
)

// Register makes p the parser of the dialect named name. Registering a name twice panics.
// Safe for concurrent use.
func Register(name string, p Parser) {
	mu.Lock()
	defer mu.Unlock()
	if _, dup := parsers[name]; dup {
		panic("dburl: " + name + " registered twice")
	}
	parsers[name] = p
}

// Parse returns the URL of s from the first registered parser (by name) that recognises it;
// ok is false when none does. forms lists the accepted forms for messages.
func Parse(s, forms string) (u URL, ok bool, err error) {
	mu.RLock()
	names := make([]string, 0, len(parsers))
	for n := range parsers {
		names = append(names, n)
	}
	sort.Strings(names)
	ps := make([]Parser, len(names))
	for i, n := range names {
		ps[i] = parsers[n]
	}
	mu.RUnlock()
	for _, p := range ps {
		if u, ok, err := p.Parse(s, forms); ok || err != nil {
			return u, true, err
		}
	}
	return nil, false, nil
}

// OneLine folds a message onto one line.
func OneLine(s string) string {
	s = strings.TrimSpace(s)
	s = strings.ReplaceAll(s, "\r", "")
	return strings.Join(strings.Fields(strings.ReplaceAll(s, "\n", " ; ")), " ")
}

// RedactDSN hides a password in s: as url.URL.Redacted does when s parses as a URL with a
// host part, else the text between the first ':' and the last '@' of what follows the scheme
// ("scheme://" or "scheme:") up to the first '/', '?' or '#' (a URL with a bad port, or
// "mysql:user:password@host/db", still shows no password).
func RedactDSN(s string) string {
	u, err := url.Parse(s)
	if err == nil && u.Opaque == "" {
		if u.User != nil {
			return u.Redacted()
		}
		return s
	}
	i := strings.IndexByte(s, ':')
	if i < 0 {
		return s
	}
	start := i + 1
	if strings.HasPrefix(s[start:], "//") {
		start += 2
	}
	auth := s[start:]
	if end := strings.IndexAny(auth, "/?#"); end >= 0 {
		auth = auth[:end]
	}
	at := strings.LastIndexByte(auth, '@')
	colon := strings.IndexByte(auth, ':')
	if at < 0 || colon < 0 || colon > at {
		return s
	}
	return s[:start+colon+1] + "xxxxx" + s[start+at:]
}

// URLErrText is the cause of a url.Parse error without the URL, which can carry a password.
func URLErrText(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err.Error()
	}
	return err.Error()
}

// ShellQuote quotes s for a POSIX shell when it holds anything but safe characters.
func ShellQuote(s string) string {
	safe := true
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./:@%+=,", r)) {
			safe = false
			break
		}
	}
	if safe && s != "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// Unreachable is the message of a connection to server at where that failed before the
// server answered: the network error, "timed out", or else cause (err's text, as the caller
// cleaned it). shown is the URL as shown.
func Unreachable(server, where, cause, shown string, err error) error {
	var opErr *net.OpError
	if errors.As(err, &opErr) {
		cause = opErr.Error()
	} else if errors.Is(err, context.DeadlineExceeded) {
		cause = "timed out"
	}
	return &ConnectFailure{fmt.Errorf("cannot connect to %s at %s (%s): check that the server runs and that --db %s names the right host, port and database", server, where, OneLine(cause), shown)}
}

// QuoteParts quotes each part of a possibly qualified name ("schema.table") with q, doubling
// q inside.
func QuoteParts(name, q string) string {
	parts := strings.Split(name, ".")
	for i, p := range parts {
		parts[i] = q + strings.ReplaceAll(p, q, q+q) + q
	}
	return strings.Join(parts, ".")
}
