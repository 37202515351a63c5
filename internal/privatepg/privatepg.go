// Package privatepg runs a private PostgreSQL server for tests that stop and restart it
// (never the shared one): initdb and pg_ctl from /usr/lib/postgresql/*/bin in a temporary
// directory, on a free loopback port, trust authentication, run as the postgres OS user when
// the test runs as root.
package privatepg

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"testing"
)

// Server is a private PostgreSQL server. Its methods fail the test on error.
type Server struct {
	dir, bin string
	port     int
	asUser   bool
}

// Start initialises and starts a server and stops it when tb ends. It skips tb when no
// PostgreSQL binaries are installed (and fails it when env CI=true).
func Start(tb testing.TB) *Server {
	tb.Helper()
	bins, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if len(bins) == 0 {
		if os.Getenv("CI") == "true" {
			tb.Fatal("no /usr/lib/postgresql/*/bin/initdb and CI=true")
		}
		tb.Skip("no /usr/lib/postgresql/*/bin/initdb: a private PostgreSQL cannot be started")
	}
	sort.Strings(bins)
	s := &Server{bin: filepath.Dir(bins[len(bins)-1]), asUser: os.Geteuid() == 0}
	dir, err := os.MkdirTemp("", "privatepg")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = os.RemoveAll(dir) })
	s.dir = dir
	if s.asUser {
		u, err := user.Lookup("postgres")
		if err != nil {
			tb.Fatalf("running as root needs the postgres OS user: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			tb.Fatal(err)
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	s.port = l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	s.run(tb, "initdb", "-D", s.data(), "-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8")
	s.Restart(tb)
	tb.Cleanup(func() { _ = s.cmd("pg_ctl", "-D", s.data(), "-m", "immediate", "stop").Run() })
	return s
}

func (s *Server) data() string { return filepath.Join(s.dir, "data") }

// DSN is the server's connection string (database postgres).
func (s *Server) DSN() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", s.port)
}

// Stop stops the server at once (immediate shutdown: connections are cut).
func (s *Server) Stop(tb testing.TB) {
	tb.Helper()
	s.run(tb, "pg_ctl", "-D", s.data(), "-m", "immediate", "-w", "stop")
}

// Restart starts the server (again) on the same port and waits until it accepts connections.
func (s *Server) Restart(tb testing.TB) {
	tb.Helper()
	opts := fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c fsync=off", s.port, s.dir)
	s.run(tb, "pg_ctl", "-D", s.data(), "-o", opts, "-l", filepath.Join(s.dir, "log"), "-w", "start")
}

func (s *Server) cmd(name string, args ...string) *exec.Cmd {
	path := filepath.Join(s.bin, name)
	if s.asUser {
		return exec.Command("runuser", append([]string{"-u", "postgres", "--", path}, args...)...)
	}
	return exec.Command(path, args...)
}

func (s *Server) run(tb testing.TB, name string, args ...string) {
	tb.Helper()
	if out, err := s.cmd(name, args...).CombinedOutput(); err != nil {
		log, _ := os.ReadFile(filepath.Join(s.dir, "log"))
		tb.Fatalf("%s %v: %v\n%s\n%s", name, args, err, out, log)
	}
}
