package sqlitewal_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	_ "modernc.org/sqlite"

	"github.com/watermill-outbox/outbox"
	_ "github.com/watermill-outbox/outbox/sqlite"
	"github.com/watermill-outbox/outbox/wakeup/sqlitewal"
)

var schema = outbox.SchemaConfig{Dialect: outbox.DialectSQLite}

// The writer child: the test binary run again with these variables set publishes events into
// the database at a rate, from its own process, then exits (see TestMain).
const (
	envDB     = "SQLITEWAL_CHILD_DB"
	envEvents = "SQLITEWAL_CHILD_EVENTS"
	envRate   = "SQLITEWAL_CHILD_RATE"
	envFirst  = "SQLITEWAL_CHILD_FIRST"
)

func TestMain(m *testing.M) {
	if path := os.Getenv(envDB); path != "" {
		if err := childWrite(path); err != nil {
			fmt.Fprintln(os.Stderr, "writer child:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// childWrite publishes SQLITEWAL_CHILD_EVENTS events, one transaction each, paced at
// SQLITEWAL_CHILD_RATE per second; event i carries "<first+i> <unix nanoseconds before COMMIT>".
// At the end it prints its writerStats on standard output as JSON.
func childWrite(path string) error {
	n, _ := strconv.Atoi(os.Getenv(envEvents))
	rate, _ := strconv.Atoi(os.Getenv(envRate))
	first, _ := strconv.Atoi(os.Getenv(envFirst))
	db, err := sql.Open("sqlite", outbox.SQLiteDSN(path))
	if err != nil {
		return err
	}
	defer db.Close()
	ctx := context.Background()
	start := time.Now()
	waits, commits := make([]time.Duration, 0, n), make([]time.Duration, 0, n)
	for i := range n {
		if rate > 0 {
			time.Sleep(time.Until(start.Add(time.Duration(i) * time.Second / time.Duration(rate))))
		}
		began := time.Now()
		tx, err := db.BeginTx(ctx, nil) // BEGIN IMMEDIATE: waits for the write lock
		if err != nil {
			return err
		}
		waits = append(waits, time.Since(began))
		pub, err := outbox.NewPublisher(tx, outbox.PublisherConfig{Schema: schema}, nil)
		if err != nil {
			return err
		}
		msg := outbox.NewMessage([]byte(fmt.Sprintf(`[%d, %d]`, first+i, time.Now().UnixNano())))
		if err := pub.Publish("walwake", msg); err != nil {
			_ = tx.Rollback()
			return err
		}
		committing := time.Now()
		if err := tx.Commit(); err != nil {
			return err
		}
		commits = append(commits, time.Since(committing))
	}
	st := writerStats{Events: n, Elapsed: time.Since(start)}
	if n > 0 {
		slices.Sort(waits)
		slices.Sort(commits)
		st.BeginP99, st.BeginMax = waits[(n-1)*99/100], waits[n-1]
		st.CommitP99, st.CommitMax = commits[(n-1)*99/100], commits[n-1]
	}
	return json.NewEncoder(os.Stdout).Encode(st)
}

// writerStats is what a writer child reports: its events (one transaction each), the time from
// its start to its last COMMIT, and the 99th percentile and maximum of its waits for the write
// lock (BEGIN IMMEDIATE, through SQLite's busy handler) and of its COMMITs (which run the WAL
// checkpoint when they pass wal_autocheckpoint).
type writerStats struct {
	Events               int
	Elapsed              time.Duration
	BeginP99, BeginMax   time.Duration
	CommitP99, CommitMax time.Duration
}

// startWriter runs the writer child on path and returns a function waiting for its exit.
func startWriter(t testing.TB, path string, first, events, rate int) func() error {
	t.Helper()
	wait := startWriterStats(t, path, first, events, rate)
	return func() error {
		_, err := wait()
		return err
	}
}

// startWriterStats runs the writer child on path and returns a function waiting for its exit
// and returning its report.
func startWriterStats(t testing.TB, path string, first, events, rate int) func() (writerStats, error) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envDB+"="+path, envEvents+"="+strconv.Itoa(events),
		envRate+"="+strconv.Itoa(rate), envFirst+"="+strconv.Itoa(first))
	cmd.Stderr = os.Stderr
	var out bytes.Buffer
	cmd.Stdout = &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return func() (writerStats, error) {
		var st writerStats
		if err := cmd.Wait(); err != nil {
			return st, err
		}
		err := json.Unmarshal(out.Bytes(), &st)
		return st, err
	}
}

func openDB(t testing.TB) (string, *sql.DB) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "outbox.db")
	db, err := sql.Open("sqlite", outbox.SQLiteDSN(path))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if err := outbox.Migrate(context.Background(), db, schema); err != nil {
		t.Fatal(err)
	}
	return path, db
}

// TestListenWakesOnCommit: a listener gets its first value at once, then one after a commit of
// another connection, and its channel closes when its context ends.
func TestListenWakesOnCommit(t *testing.T) {
	path, db := openDB(t)
	w, err := sqlitewal.New(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	ctx, cancel := context.WithCancel(context.Background())
	ch := w.Listen(ctx, func(string) bool { return false }) // accept is not consulted
	recv := func(what string) {
		t.Helper()
		select {
		case _, ok := <-ch:
			if !ok {
				t.Fatalf("%s: channel closed", what)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: no wake-up within 10s", what)
		}
	}
	recv("first value")
	// Drain anything the migration's own writes left pending, then commit once more.
	drain := time.After(200 * time.Millisecond)
	for done := false; !done; {
		select {
		case <-ch:
		case <-drain:
			done = true
		}
	}
	if _, err := db.Exec(`CREATE TABLE IF NOT EXISTS marker (x INTEGER)`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`INSERT INTO marker VALUES (1)`); err != nil {
		t.Fatal(err)
	}
	recv("after a commit")
	cancel()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case _, ok := <-ch:
			if !ok {
				if err := w.Close(); err != nil {
					t.Fatal(err)
				}
				if err := w.Close(); err != nil { // idempotent
					t.Fatal(err)
				}
				return
			}
		case <-deadline:
			t.Fatal("channel not closed after its context ended")
		}
	}
}

func TestNewErrors(t *testing.T) {
	if _, err := sqlitewal.New("", nil); err == nil {
		t.Fatal("empty path accepted")
	}
	if _, err := sqlitewal.New(filepath.Join(t.TempDir(), "missing", "outbox.db"), nil); err == nil {
		t.Fatal("a path in a missing directory accepted")
	}
}

// TestRelayInAnotherProcess: a relay that polls once an hour delivers, in order, the events a
// writer in another process commits, each within seconds: only the file notification can have
// woken it.
func TestRelayInAnotherProcess(t *testing.T) {
	path, db := openDB(t)
	w, err := sqlitewal.New(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	sub, err := outbox.NewSubscriber(db, outbox.SubscriberConfig{Schema: schema, PollInterval: time.Hour, Wakeup: w}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	msgs, err := sub.Subscribe(ctx, "walwake")
	if err != nil {
		t.Fatal(err)
	}
	// The subscription has polled once (empty table) and now waits for a wake-up.
	const events = 20
	wait := startWriter(t, path, 0, events, 20)
	for i := range events {
		select {
		case m := <-msgs:
			var seq, sent int64
			if _, err := fmt.Sscanf(string(m.Payload), "[%d, %d]", &seq, &sent); err != nil {
				t.Fatalf("payload %q: %v", m.Payload, err)
			}
			if seq != int64(i) {
				t.Fatalf("got event %d, want %d", seq, i)
			}
			if lag := time.Since(time.Unix(0, sent)); lag > 30*time.Second {
				t.Fatalf("event %d delivered %v after its commit", i, lag)
			}
			m.Ack()
		case <-time.After(30 * time.Second):
			t.Fatalf("event %d not delivered within 30s (relay polls once an hour)", i)
		}
	}
	if err := wait(); err != nil {
		t.Fatalf("writer: %v", err)
	}
	// A woken relay takes the write lock with busy_timeout 0 on its connection and restores it:
	// every pooled connection still has SQLiteDSN's 10 s.
	var conns []*sql.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range 4 {
		c, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		var ms int
		if err := c.QueryRowContext(ctx, `PRAGMA busy_timeout`).Scan(&ms); err != nil || ms != 10000 {
			t.Fatalf("pooled connection %d: busy_timeout %d (%v), want 10000", len(conns), ms, err)
		}
	}
}

// TestTwoRelaysTwoWriterProcesses: two relays (each its own pool, both woken by the log watch,
// so both lock eagerly and claim reading first) share the events two writer processes commit at
// 500 events/s in all; every event is delivered once, each relay's share in commit order per
// writer (each writer's events are in sequence order, and a relay claims in sequence order).
func TestTwoRelaysTwoWriterProcesses(t *testing.T) {
	path, db := openDB(t)
	db2, err := sql.Open("sqlite", outbox.SQLiteDSN(path))
	if err != nil {
		t.Fatal(err)
	}
	defer db2.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	type got struct {
		relay int
		seq   int64
	}
	delivered := make(chan got, 64)
	for i, h := range []*sql.DB{db, db2} {
		w, err := sqlitewal.New(path, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		sub, err := outbox.NewSubscriber(h, outbox.SubscriberConfig{Schema: schema, PollInterval: time.Hour, Wakeup: w}, watermill.NopLogger{})
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Close()
		msgs, err := sub.Subscribe(ctx, "walwake")
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			for m := range msgs {
				var seq, sent int64
				if _, err := fmt.Sscanf(string(m.Payload), "[%d, %d]", &seq, &sent); err != nil {
					seq = -1
				}
				m.Ack()
				select {
				case delivered <- got{i, seq}:
				case <-ctx.Done():
					return
				}
			}
		}()
	}
	const perWriter = 1000
	waits := []func() error{startWriter(t, path, 0, perWriter, 250), startWriter(t, path, perWriter, perWriter, 250)}
	seen := make(map[int64]int, 2*perWriter)
	last := map[[2]int64]int64{} // (relay, writer) → last sequence seen
	perRelay := [2]int{}
	for len(seen) < 2*perWriter {
		select {
		case g := <-delivered:
			if g.seq < 0 || g.seq >= 2*perWriter {
				t.Fatalf("relay %d: unexpected payload sequence %d", g.relay, g.seq)
			}
			if seen[g.seq]++; seen[g.seq] > 1 {
				t.Fatalf("event %d delivered twice", g.seq)
			}
			k := [2]int64{int64(g.relay), g.seq / perWriter}
			if prev, ok := last[k]; ok && g.seq < prev {
				t.Fatalf("relay %d delivered writer %d's event %d after %d", g.relay, k[1], g.seq, prev)
			}
			last[k] = g.seq
			perRelay[g.relay]++
		case <-ctx.Done():
			t.Fatalf("%d of %d events delivered", len(seen), 2*perWriter)
		}
	}
	for _, w := range waits {
		if err := w(); err != nil {
			t.Fatalf("writer: %v", err)
		}
	}
	t.Logf("events per relay: %v", perRelay)
}

// TestWakesAgainWhenTheCommitBecomesVisible reproduces a writer that appends its commit's
// frames to the log, is descheduled, and publishes the commit in the log's index only later:
// the watcher wakes at the frames (a relay polling then finds nothing yet) and again as soon as
// SQLite shows the commit (data_version changes), although no file notification marks that
// moment. The database's data_version is played by the test.
func TestWakesAgainWhenTheCommitBecomesVisible(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "outbox.db")
	w, err := sqlitewal.New(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	var version atomic.Int64
	sqlitewal.SetVersionFunc(w, func() (int64, bool) { return version.Load(), true })
	ch := w.Listen(context.Background(), nil)
	recv := func(what string) {
		t.Helper()
		select {
		case <-ch:
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: no wake-up within 10s", what)
		}
	}
	// drain takes the wake-ups of a write to the log (one per notification: a create, a
	// write) until none came for 100 ms.
	drain := func() {
		t.Helper()
		for {
			select {
			case <-ch:
			case <-time.After(100 * time.Millisecond):
				return
			}
		}
	}
	appendLog := func(b string) {
		t.Helper()
		f, err := os.OpenFile(path+"-wal", os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteString(b); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
	}
	recv("first value")
	version.Store(1)
	appendLog("frames of commit 1")
	recv("commit 1's frames, already visible")
	drain()

	appendLog("frames of commit 2")
	recv("commit 2's frames")
	drain() // commit 2 is not visible yet
	version.Store(2)
	recv("commit 2 visible")
}
