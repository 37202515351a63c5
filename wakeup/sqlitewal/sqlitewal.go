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
// log's index, the shared-memory file "<database>-shm", right after; file notifications see only
// the first step. A relay woken by the frames may poll before the commit is visible and find
// nothing. So after each write to the log the watcher also reads the index's header (the first
// 96 bytes of "-shm": two copies of the 48-byte header, which change at every commit) and,
// when it still shows the commit seen at the last wake-up, re-reads it every millisecond
// (for up to settleFor) and wakes the listeners again as soon as it changes.
//
// Polling stays the safety net: a notification lost (the watch queue overflowed) only delays
// delivery until the next PollInterval, and such an overflow also wakes every listener.
package sqlitewal

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/fsnotify/fsnotify"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/wakeup"
)

// Watcher is an outbox.Wakeup for one SQLite database file. Safe for concurrent use.
type Watcher struct {
	hub          *wakeup.Hub
	fw           *fsnotify.Watcher
	db, wal, shm string
	logger       watermill.LoggerAdapter
	// seen is the index header at the last wake-up (only the run goroutine uses it).
	seen []byte

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
		shm:    abs + "-shm",
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
// header is read every settleEvery until it changes, for at most settleFor.
const (
	settleEvery = time.Millisecond
	settleFor   = 2 * time.Second
)

// header returns the index's two header copies (96 bytes), nil when the index cannot be read
// (no "-shm" file: another journal mode, or exclusive locking mode).
func (w *Watcher) header() []byte {
	f, err := os.Open(w.shm)
	if err != nil {
		return nil
	}
	defer f.Close()
	b := make([]byte, 96)
	if _, err := io.ReadFull(f, b); err != nil {
		return nil
	}
	return b
}

// settled reports whether hdr shows a commit the last wake-up did not see: it differs from
// w.seen and its two copies agree (a writer is not halfway through updating it).
func (w *Watcher) settled(hdr []byte) bool {
	return hdr != nil && !bytes.Equal(hdr, w.seen) && bytes.Equal(hdr[:48], hdr[48:])
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
				hdr := w.header()
				if w.settled(hdr) {
					w.seen = hdr
					settleUntil = time.Time{}
				} else if hdr != nil {
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
			if hdr := w.header(); w.settled(hdr) {
				w.seen = hdr
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
	})
	return err
}

var _ outbox.Wakeup = (*Watcher)(nil)
