package chaos

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
)

// missing skips tb (fails it when CI=true) because a program the suite needs is not installed.
func missing(tb testing.TB, what string, err error) {
	tb.Helper()
	if os.Getenv("CI") == "true" {
		tb.Fatalf("%s not found and CI=true: %v", what, err)
	}
	tb.Skipf("%s not found (in CI this fails): %v", what, err)
}

// freePort returns a TCP port on 127.0.0.1 that nothing listened on a moment ago.
func freePort(tb testing.TB) int {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// childEnv is this process's environment without OUTBOX_* variables, so a relay takes its
// settings from its flags only.
func childEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "OUTBOX_") {
			env = append(env, kv)
		}
	}
	return env
}

// buildOutbox builds cmd/outbox into dir and returns the binary's path.
func buildOutbox(tb testing.TB, dir string) string {
	tb.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	bin := filepath.Join(dir, "outbox")
	cmd := exec.Command(goBin, "build", "-o", bin, "github.com/watermill-outbox/outbox/cmd/outbox")
	if out, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("go build ./cmd/outbox: %v\n%s", err, out)
	}
	return bin
}

// pgBinDir finds the directory of PostgreSQL's server programs: `pg_config --bindir` when it
// holds initdb, otherwise the newest /usr/lib/postgresql/*/bin.
func pgBinDir() (string, error) {
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		dir := strings.TrimSpace(string(out))
		if _, err := os.Stat(filepath.Join(dir, "initdb")); err == nil {
			return dir, nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return versionOf(dirs[i]) > versionOf(dirs[j]) })
	for _, dir := range dirs {
		if _, err := os.Stat(filepath.Join(dir, "initdb")); err == nil {
			return dir, nil
		}
	}
	return "", errors.New("no initdb in `pg_config --bindir` or /usr/lib/postgresql/*/bin")
}

func versionOf(binDir string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return v
}

// pgCluster is a private PostgreSQL cluster in a temp dir, listening on 127.0.0.1 only.
type pgCluster struct {
	bin, data, logFile string
	port               int
	// cred runs the server programs as a non-root user: PostgreSQL refuses to run as root.
	cred *syscall.Credential
}

// startPostgres creates and starts a private cluster under dir (which must be traversable by
// the postgres user) and stops it when tb ends.
func startPostgres(tb testing.TB, dir string) *pgCluster {
	tb.Helper()
	bin, err := pgBinDir()
	if err != nil {
		missing(tb, "initdb/pg_ctl", err)
	}
	c := &pgCluster{bin: bin, port: freePort(tb)}
	home := filepath.Join(dir, "pg")
	if err := os.Mkdir(home, 0o700); err != nil {
		tb.Fatal(err)
	}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			missing(tb, "a postgres user to run initdb/postgres as (PostgreSQL refuses root)", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		c.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(home, uid, gid); err != nil {
			tb.Fatal(err)
		}
	}
	c.data, c.logFile = filepath.Join(home, "data"), filepath.Join(home, "server.log")
	if out, err := c.run("initdb", "-D", c.data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C", "--no-sync"); err != nil {
		tb.Fatalf("initdb: %v\n%s", err, out)
	}
	// fsync=off: the suite crashes processes, never the machine, so written WAL survives in the
	// page cache; synchronous_commit stays on, so an acknowledged COMMIT is in the WAL.
	conf := fmt.Sprintf("\nlisten_addresses = '127.0.0.1'\nport = %d\nunix_socket_directories = ''\nfsync = off\nmax_connections = 100\nshared_buffers = 64MB\n", c.port)
	f, err := os.OpenFile(filepath.Join(c.data, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err == nil {
		_, err = f.WriteString(conf)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		tb.Fatal(err)
	}
	if out, err := c.ctl("start"); err != nil {
		tb.Fatalf("pg_ctl start: %v\n%s\n%s", err, out, c.serverLog())
	}
	tb.Cleanup(func() { _, _ = c.ctl("stop", "-m", "immediate") })
	return c
}

// run runs one of the cluster's programs as the cluster's user and returns its output.
func (c *pgCluster) run(prog string, args ...string) ([]byte, error) {
	cmd := exec.Command(filepath.Join(c.bin, prog), args...)
	cmd.Dir = filepath.Dir(filepath.Dir(c.data))
	cmd.Env = childEnv()
	if c.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
	}
	return cmd.CombinedOutput()
}

// ctl runs pg_ctl on the cluster with -w (wait until done) plus args after the action.
func (c *pgCluster) ctl(action string, args ...string) ([]byte, error) {
	return c.run("pg_ctl", append([]string{action, "-D", c.data, "-l", c.logFile, "-w", "-t", "60"}, args...)...)
}

// DSN is the superuser connection string of database postgres.
func (c *pgCluster) DSN() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", c.port)
}

func (c *pgCluster) serverLog() string {
	b, _ := os.ReadFile(c.logFile)
	return tail(string(b), 20)
}

// restart runs `pg_ctl restart -m mode` and returns the moment the server first accepted a
// connection again, observed by connecting every 10 ms from before the restart begins.
func (c *pgCluster) restart(mode string) (time.Time, error) {
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	upc := make(chan time.Time, 1)
	sawDown := make(chan struct{})
	go func() {
		down := false
		for ctx.Err() == nil {
			cctx, cancel := context.WithTimeout(ctx, time.Second)
			conn, err := pgx.Connect(cctx, c.DSN())
			if err == nil {
				_, err = conn.Exec(cctx, "SELECT 1")
				_ = conn.Close(cctx)
			}
			cancel()
			switch {
			case err != nil && !down:
				down = true
				close(sawDown)
			case err == nil && down:
				upc <- time.Now()
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
	out, err := c.ctl("restart", "-m", mode)
	if err != nil {
		return time.Time{}, fmt.Errorf("pg_ctl restart -m %s: %w\n%s\n%s", mode, err, out, c.serverLog())
	}
	select {
	case up := <-upc:
		return up, nil
	case <-time.After(30 * time.Second):
		select {
		case <-sawDown:
			return time.Time{}, errors.New("server down and not accepting connections 30 s after pg_ctl restart returned")
		default:
			return time.Time{}, errors.New("never saw the server refuse a connection during the restart")
		}
	}
}

// redisServer is a private redis-server on 127.0.0.1 with an append-only file fsynced on every
// write, so a write Redis acknowledged survives SIGKILL and a restart on the same port.
type redisServer struct {
	tb   testing.TB
	dir  string
	port int

	child
}

// child is a server process of the suite that tests signal and wait for.
type child struct {
	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
}

// startRedis starts a private redis-server in dir and stops it when tb ends.
func startRedis(tb testing.TB, dir string) *redisServer {
	tb.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		missing(tb, "redis-server", err)
	}
	r := &redisServer{tb: tb, dir: filepath.Join(dir, "redis"), port: freePort(tb)}
	if err := os.Mkdir(r.dir, 0o755); err != nil {
		tb.Fatal(err)
	}
	if err := r.start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		r.signal(syscall.SIGCONT)
		r.signal(syscall.SIGKILL)
		r.waitExit(10 * time.Second)
	})
	return r
}

// Addr is host:port of the server.
func (r *redisServer) Addr() string { return fmt.Sprintf("127.0.0.1:%d", r.port) }

// start starts redis-server and waits until it answers PING.
func (r *redisServer) start() error {
	cmd := exec.Command("redis-server", "--port", strconv.Itoa(r.port), "--bind", "127.0.0.1", "--dir", r.dir,
		"--appendonly", "yes", "--appendfsync", "always", "--save", "", "--daemonize", "no",
		"--logfile", filepath.Join(r.dir, "redis.log"))
	cmd.Env = childEnv()
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("redis-server: %w", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	r.mu.Lock()
	r.cmd, r.done = cmd, done
	r.mu.Unlock()
	c := redis.NewClient(&redis.Options{Addr: r.Addr(), MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(20 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redis-server on %s not answering PING after 20 s: %w", r.Addr(), err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// signal sends sig to the running server, if any.
func (c *child) signal(sig syscall.Signal) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cmd != nil && c.cmd.Process != nil {
		_ = c.cmd.Process.Signal(sig)
	}
}

// waitExit waits until the server process has exited and reports whether it did in time.
func (c *child) waitExit(timeout time.Duration) bool {
	c.mu.Lock()
	done := c.done
	c.mu.Unlock()
	if done == nil {
		return true
	}
	select {
	case <-done:
		return true
	case <-time.After(timeout):
		return false
	}
}

// logLine is one line a relay wrote, stamped when the test read it.
type logLine struct {
	at    time.Time
	relay string
	text  string
}

// relayLogs collects the output lines of relays, across restarts.
type relayLogs struct {
	mu    sync.Mutex
	lines []logLine
}

func (l *relayLogs) add(relay, text string) {
	l.mu.Lock()
	l.lines = append(l.lines, logLine{at: time.Now(), relay: relay, text: text})
	l.mu.Unlock()
}

// between returns the lines of relay stamped within [from, to], except debug and trace lines.
func (l *relayLogs) between(relay string, from, to time.Time) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, ln := range l.lines {
		if ln.relay != relay || ln.at.Before(from) || ln.at.After(to) {
			continue
		}
		if strings.Contains(ln.text, "level=DEBUG") || strings.Contains(ln.text, "level=TRACE") {
			continue
		}
		out = append(out, ln.text)
	}
	return out
}

// first returns relay's first line containing sub stamped after t.
func (l *relayLogs) first(relay, sub string, after time.Time) (string, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, ln := range l.lines {
		if ln.relay == relay && ln.at.After(after) && strings.Contains(ln.text, sub) {
			return ln.text, true
		}
	}
	return "", false
}

// tailOf returns relay's last n lines, each cut to width bytes.
func (l *relayLogs) tailOf(relay string, n, width int) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, ln := range l.lines {
		if ln.relay == relay {
			text := ln.text
			if len(text) > width {
				text = text[:width] + "…"
			}
			out = append(out, text)
		}
	}
	if len(out) > n {
		out = out[len(out)-n:]
	}
	return strings.Join(out, "\n")
}

// relayProc is one `outbox relay` process with a fixed --relay-name, restartable.
type relayProc struct {
	bin, name string
	args      []string
	logs      *relayLogs

	mu       sync.Mutex
	cmd      *exec.Cmd
	done     chan struct{}
	stopping bool
	// died records an exit nobody asked for (the relay must survive every fault).
	died atomic.Value // string
}

// start starts the process and returns when it is running.
func (r *relayProc) start() error {
	cmd := exec.Command(r.bin, append([]string{"relay", "--relay-name", r.name}, r.args...)...)
	cmd.Env = childEnv()
	// Gone with the test process, even when it dies of a timeout.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return err
	}
	cmd.Stdout = cmd.Stderr
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start relay %s: %w", r.name, err)
	}
	done := make(chan struct{})
	r.mu.Lock()
	r.cmd, r.done, r.stopping = cmd, done, false
	r.mu.Unlock()
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			r.logs.add(r.name, sc.Text())
		}
		err := cmd.Wait()
		r.mu.Lock()
		if !r.stopping {
			r.died.Store(fmt.Sprintf("relay %s exited on its own: %v", r.name, err))
		}
		r.mu.Unlock()
		close(done)
	}()
	return nil
}

// kill sends SIGKILL and waits for the process to be gone.
func (r *relayProc) kill() {
	r.mu.Lock()
	r.stopping = true
	cmd, done := r.cmd, r.done
	r.mu.Unlock()
	_ = cmd.Process.Signal(syscall.SIGKILL)
	<-done
}

// stop asks the relay to stop (SIGTERM) and waits up to timeout, then kills it.
func (r *relayProc) stop(timeout time.Duration) {
	r.mu.Lock()
	r.stopping = true
	cmd, done := r.cmd, r.done
	r.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(timeout):
		_ = cmd.Process.Signal(syscall.SIGKILL)
		<-done
	}
}

// deathNote is why the relay exited on its own, or "".
func (r *relayProc) deathNote() string {
	s, _ := r.died.Load().(string)
	return s
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
