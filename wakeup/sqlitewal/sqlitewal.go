// Package sqlitewal wakes the relays of a SQLite outbox as soon as any process commits to the
// database file, with no help from the writers: it watches the database's write-ahead log with
// the operating system's file notifications (inotify on Linux, kqueue on the BSDs and macOS,
// ReadDirectoryChangesW on Windows, through github.com/fsnotify/fsnotify).
//
// Without it a relay in another process than the writers learns of new events only at its next
// poll (SubscriberConfig.PollInterval, 5s by default); wakeup.NewInProcess serves only relays in
// the writers' own process. A database opened with outbox.SQLiteDSN is in WAL mode, where every
// commit appends to the file "<database>-wal" (https://www.sqlite.org/wal.html); each write to
// it wakes every listening subscription, which then polls (a notification cannot tell which
// topics were written).
//
//	w, err := sqlitewal.New("/var/lib/app/outbox.db", logger)
//	if err != nil {
//		return err // no file notifications: the relay would still work by polling
//	}
//	defer w.Close()
//	sub, err := outbox.NewSubscriber(db, outbox.SubscriberConfig{Schema: schema, Wakeup: w}, logger)
//
// Costs and limits:
//   - The relay's own leases and marks also write the log, so a subscription polls once more
//     after each batch it marks; a claim that finds nothing writes nothing and wakes nobody.
//   - Notifications are coalesced per subscription (one pending value), so a burst of commits
//     costs one poll, not one per commit.
//   - File notifications see writes of processes on the same machine (one kernel). A database on
//     a network file system is not supported by SQLite's WAL mode in the first place.
//   - In another journal mode (DELETE, TRUNCATE) the database file itself is written at every
//     commit; writes to it wake the listeners too.
//
// A writer appends its commit's frames to the log first and publishes the commit in the
// log's index (shared memory) right after; file notifications see only the first step. A relay
// woken by the frames may poll before the commit is visible and find nothing. So after each
// write to the log the watcher asks SQLite, on a connection of its own, whether a commit
// became visible since its last wake-up (PRAGMA data_version, modernc.org/sqlite); when none
// did yet, it asks again every millisecond (for up to settleFor) and wakes the listeners again
// as soon as one did. (It never opens the "-shm" file itself: closing any descriptor of a file
// drops every POSIX lock the process holds on it, SQLite's included.)
//
// Polling stays the safety net: a notification lost (the watch queue overflowed) only delays
// delivery until the next PollInterval, and such an overflow also wakes every listener.
package sqlitewal

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/fsnotify/fsnotify"
	_ "modernc.org/sqlite" // the watcher's own connection (PRAGMA data_version)

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/wakeup"
)

// Watcher is an outbox.Wakeup for one SQLite database file. Safe for concurrent use.
type Watcher struct {
	hub     *wakeup.Hub
	fw      *fsnotify.Watcher
	db, wal string
	logger  watermill.LoggerAdapter
	// conn is the watcher's own connection, opened at the first write to the log (the
	// database may not exist before); seen is its data_version at the last wake-up. Only the
	// run goroutine uses them.
	conn *sql.DB
	seen int64
	// versionFn replaces version when set (tests).
	versionFn atomic.Pointer[func() (int64, bool)]

	closeOnce sync.Once
	done      chan struct{}
}

// New watches the SQLite database at path (the file given to outbox.SQLiteDSN; relative paths
// are taken from the working directory). The database need not exist yet: the watch is on its
// directory, which must exist. A nil logger logs nothing. Errors: path is empty or its directory
// cannot be watched (it does not exist, or the process reached its limit of watches, on Linux
// fs.inotify.max_user_watches / max_user_instances). Close releases the watch.
func New(path string, logger watermill.LoggerAdapter) (*Watcher, error) {
	if path == "" {
		return nil, errors.New("sqlitewal: empty database path")
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("sqlitewal: %w", err)
	}
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	fw, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, fmt.Errorf("sqlitewal: file notifications: %w", err)
	}
	if err := fw.Add(filepath.Dir(abs)); err != nil {
		_ = fw.Close()
		return nil, fmt.Errorf("sqlitewal: watching the directory of %s: %w", abs, err)
	}
	w := &Watcher{
		hub:    wakeup.NewHub(),
		fw:     fw,
		db:     abs,
		wal:    abs + "-wal",
		logger: logger.With(watermill.LogFields{"database": abs}),
		done:   make(chan struct{}),
	}
	// Subscribed from the start: each Listen channel receives one value at once, so a
	// subscription polls for what was committed before it listened.
	w.hub.SetSubscribed(true)
	go w.run()
	return w, nil
}

// Settling: after a write to the log whose commit the index does not show yet, the index
// data_version is read every settleEvery until it changes, for at most settleFor.
const (
	settleEvery = time.Millisecond
	settleFor   = 2 * time.Second
)

// version returns the database's data_version on the watcher's connection (it changes when
// another connection's commit became visible), or false when it cannot be read.
func (w *Watcher) version() (int64, bool) {
	if f := w.versionFn.Load(); f != nil {
		return (*f)()
	}
	if w.conn == nil {
		c, err := sql.Open("sqlite", outbox.SQLiteDSN(w.db))
		if err != nil {
			return 0, false
		}
		c.SetMaxOpenConns(1)
		w.conn = c
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	var v int64
	if err := w.conn.QueryRowContext(ctx, "PRAGMA data_version").Scan(&v); err != nil {
		return 0, false
	}
	return v, true
}

// run turns file notifications into wake-ups until Close.
func (w *Watcher) run() {
	defer close(w.done)
	settle := time.NewTimer(time.Hour)
	settle.Stop()
	var settleUntil time.Time // zero: not settling
	for {
		select {
		case ev, ok := <-w.fw.Events:
			if !ok {
				return
			}
			if (ev.Name == w.wal || ev.Name == w.db) && ev.Op&(fsnotify.Write|fsnotify.Create) != 0 {
				if v, ok := w.version(); !ok || v != w.seen {
					w.seen = v
					settleUntil = time.Time{}
				} else {
					// The commit is not in the index yet: wake now (it may be by the time a
					// relay reads it) and again when the index shows it.
					settle.Reset(settleEvery)
					settleUntil = time.Now().Add(settleFor)
				}
				w.hub.DispatchAll()
			}
		case <-settle.C:
			if settleUntil.IsZero() {
				// A later notification found the commit meanwhile.
				continue
			}
			if v, ok := w.version(); ok && v != w.seen {
				w.seen = v
				settleUntil = time.Time{}
				w.hub.DispatchAll()
			} else if time.Now().Before(settleUntil) {
				settle.Reset(settleEvery)
			} else {
				settleUntil = time.Time{}
			}
		case err, ok := <-w.fw.Errors:
			if !ok {
				return
			}
			if errors.Is(err, fsnotify.ErrEventOverflow) {
				// Some notifications were dropped: wake everyone rather than miss a commit.
				w.hub.DispatchAll()
			}
			w.logger.Info("SQLite wakeup: file notification error; relays rely on polling until the next notification", watermill.LogFields{"err": err})
		}
	}
}

// Listen implements outbox.Wakeup: the channel receives a value at once, then after every
// write to the database's log, and is closed when ctx ends. accept is not consulted (a write
// does not tell which topics it holds): every listener is woken.
func (w *Watcher) Listen(ctx context.Context, accept func(topic string) bool) <-chan struct{} {
	return w.hub.Listen(ctx, accept)
}

// Close stops watching; open Listen channels stay open until their contexts end but receive
// nothing more. Idempotent; returns the error of releasing the watch, if any.
func (w *Watcher) Close() error {
	var err error
	w.closeOnce.Do(func() {
		err = w.fw.Close()
		<-w.done
		if w.conn != nil {
			err = errors.Join(err, w.conn.Close())
		}
	})
	return err
}

var _ outbox.Wakeup = (*Watcher)(nil)
