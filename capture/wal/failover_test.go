package wal_test

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	oexec "os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/watermill-outbox/outbox/capture/wal"
)

// standby makes a streaming standby of the private server at primaryDSN (pg_basebackup -R) on
// a free loopback port, starts it, and returns its DSN and a function that promotes it.
func standby(t *testing.T, primaryDSN string) (dsn string, promote func()) {
	t.Helper()
	bins, _ := filepath.Glob("/usr/lib/postgresql/*/bin/pg_basebackup")
	if len(bins) == 0 {
		t.Fatal("no pg_basebackup") // privatepg already required the server binaries
	}
	sort.Strings(bins)
	bin := filepath.Dir(bins[len(bins)-1])
	asUser := os.Geteuid() == 0
	dir, err := os.MkdirTemp("", "walstandby")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if asUser {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatal(err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	cmd := func(name string, args ...string) *oexec.Cmd {
		path := filepath.Join(bin, name)
		if asUser {
			return oexec.Command("runuser", append([]string{"-u", "postgres", "--", path}, args...)...)
		}
		return oexec.Command(path, args...)
	}
	runCmd := func(name string, args ...string) {
		if out, err := cmd(name, args...).CombinedOutput(); err != nil {
			log, _ := os.ReadFile(filepath.Join(dir, "log"))
			t.Fatalf("%s %v: %v\n%s\n%s", name, args, err, out, log)
		}
	}
	u, err := url.Parse(primaryDSN)
	if err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(dir, "data")
	runCmd("pg_basebackup", "-h", u.Hostname(), "-p", u.Port(), "-U", "postgres", "-D", data, "-R", "-X", "stream")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	runCmd("pg_ctl", "-D", data, "-o", fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c fsync=off", port, dir), "-l", filepath.Join(dir, "log"), "-w", "start")
	t.Cleanup(func() { _ = cmd("pg_ctl", "-D", data, "-m", "immediate", "stop").Run() })
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port), func() { runCmd("pg_ctl", "-D", data, "-w", "promote") }
}

// TestFailover: a streaming standby promoted after the primary stops has no copy of the
// primary's logical slot (PostgreSQL before 17): the source on the new primary returns a
// *SlotError (missing) instead of streaming from nowhere; Setup there creates a new slot from
// which it streams the changes committed after it (the package doc's "Recovery").
func TestFailover(t *testing.T) {
	srv, pool := logicalPG(t)
	tables := itemTable(t, pool, 10)
	sdsn, promote := standby(t, srv.DSN())
	exec(t, pool, `UPDATE item SET v = 1 WHERE id = 0`)
	var lsn string
	if err := pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&lsn); err != nil {
		t.Fatal(err)
	}
	spool, err := pgxpool.New(ctx, sdsn)
	if err != nil {
		t.Fatal(err)
	}
	defer spool.Close()
	waitFor(t, 30*time.Second, "the standby to replay the update", func() bool {
		var ok bool
		_ = spool.QueryRow(ctx, `SELECT pg_last_wal_replay_lsn() >= $1::pg_lsn`, lsn).Scan(&ok)
		return ok
	})
	pool.Close()
	srv.Stop(t)
	promote()
	waitFor(t, 30*time.Second, "the promotion", func() bool {
		var rec bool
		err := spool.QueryRow(ctx, `SELECT pg_is_in_recovery()`).Scan(&rec)
		return err == nil && !rec
	})
	rec := &recorder{}
	cfg := wal.Config{Tables: tables, Destination: rec, StatusInterval: 50 * time.Millisecond}
	src, err := wal.New(spool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	var se *wal.SlotError
	if err := src.Run(ctx); !errors.As(err, &se) || !errors.Is(err, wal.ErrSlotLost) || se.Reason[:7] != "missing" {
		t.Fatalf("after promotion: Run returned %v, want a *SlotError (missing)", err)
	}
	if err := wal.Setup(ctx, spool, cfg); err != nil {
		t.Fatal(err)
	}
	stop := run(t, src)
	exec(t, spool, `UPDATE item SET v = 2 WHERE id = 0`)
	waitFor(t, 30*time.Second, "the change after the new slot", func() bool { return len(rec.snapshot()) == 1 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if got := decodeItems(t, rec.snapshot()); got[0].id != 0 || got[0].v != 2 {
		t.Fatalf("delivered %+v, want item 0 version 2", got)
	}
}
