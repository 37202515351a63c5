// Package privatepgbouncer runs a private PgBouncer for tests: Debian's pgbouncer binary in a
// temporary directory, on a free loopback port, pool_mode=transaction (a server connection is
// lent to a client for one transaction only, as in most production deployments), trust
// authentication, in front of a PostgreSQL server given by its DSN. It runs as the postgres OS
// user when the test runs as root (PgBouncer refuses to run as root), and is killed with the
// test process.
package privatepgbouncer

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// Binary is where Debian's pgbouncer package installs the server.
const Binary = "/usr/sbin/pgbouncer"

// Bouncer is a running PgBouncer.
type Bouncer struct {
	port int
	db   string
	user string
	dir  string
	cmd  *exec.Cmd
	done chan struct{}
}

// Start runs PgBouncer in transaction pooling mode in front of the server and database of
// upstreamDSN (a loopback address) and stops it when tb ends. It skips tb when the pgbouncer
// binary is missing, and fails it instead when the environment variable CI is "true". Other
// failures fail tb.
func Start(tb testing.TB, upstreamDSN string) *Bouncer {
	tb.Helper()
	if _, err := os.Stat(Binary); err != nil {
		if os.Getenv("CI") == "true" {
			tb.Fatalf("no %s and CI=true (install Debian's pgbouncer package: apt-get install -y pgbouncer)", Binary)
		}
		tb.Skipf("no %s (apt-get install -y pgbouncer): PgBouncer tests cannot run", Binary)
	}
	up, err := pgconn.ParseConfig(upstreamDSN)
	if err != nil {
		tb.Fatal(err)
	}
	if ip := net.ParseIP(up.Host); ip == nil || !ip.IsLoopback() {
		tb.Fatalf("upstream host %q: only a loopback address is allowed", up.Host)
	}
	dir, err := os.MkdirTemp("", "privatepgbouncer")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = os.RemoveAll(dir) })
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	b := &Bouncer{port: l.Addr().(*net.TCPAddr).Port, db: up.Database, user: up.User, dir: dir, done: make(chan struct{})}
	_ = l.Close()
	ini := fmt.Sprintf(`[databases]
%[1]s = host=%[2]s port=%[3]d dbname=%[1]s user=%[4]s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %[5]d
unix_socket_dir =
auth_type = trust
auth_file = %[6]s
admin_users = %[4]s
pool_mode = transaction
max_client_conn = 500
default_pool_size = 40
ignore_startup_parameters = extra_float_digits
server_reset_query =
logfile =
`, up.Database, up.Host, up.Port, up.User, b.port, filepath.Join(dir, "users.txt"))
	write := func(name, text string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			tb.Fatal(err)
		}
	}
	write("pgbouncer.ini", ini)
	write("users.txt", fmt.Sprintf("%q \"\"\n", up.User))
	b.cmd = exec.Command(Binary, filepath.Join(dir, "pgbouncer.ini"))
	// Its own process group (cleanup signals the group), killed if the test process dies
	// before its cleanup (a test timeout).
	b.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			tb.Fatalf("running as root needs the postgres OS user for pgbouncer: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		for _, p := range []string{dir, filepath.Join(dir, "pgbouncer.ini"), filepath.Join(dir, "users.txt")} {
			if err := os.Chown(p, uid, gid); err != nil {
				tb.Fatal(err)
			}
		}
		b.cmd.SysProcAttr.Credential = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	logf, err := os.Create(filepath.Join(dir, "out.log"))
	if err != nil {
		tb.Fatal(err)
	}
	defer logf.Close()
	b.cmd.Stdout, b.cmd.Stderr = logf, logf
	if err := b.cmd.Start(); err != nil {
		tb.Fatalf("start pgbouncer: %v", err)
	}
	go func() { _ = b.cmd.Wait(); close(b.done) }()
	tb.Cleanup(func() {
		pgid := b.cmd.Process.Pid
		_ = syscall.Kill(-pgid, syscall.SIGINT) // SIGINT: immediate shutdown
		select {
		case <-b.done:
		case <-time.After(5 * time.Second):
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
			<-b.done
		}
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", b.Addr(), time.Second)
		if err == nil {
			_ = c.Close()
			return b
		}
		select {
		case <-b.done:
			tb.Fatalf("pgbouncer exited at start: %s", b.Log())
		default:
		}
		if time.Now().After(deadline) {
			tb.Fatalf("pgbouncer not listening on %s after 10 s: %v\n%s", b.Addr(), err, b.Log())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Addr is the host:port PgBouncer listens on.
func (b *Bouncer) Addr() string { return fmt.Sprintf("127.0.0.1:%d", b.port) }

// DSN is a connection string through PgBouncer to the upstream database and user.
// query ("default_query_exec_mode=exec", …) is appended as URL parameters when non-empty.
func (b *Bouncer) DSN(query string) string {
	dsn := fmt.Sprintf("postgres://%s@%s/%s?sslmode=disable", b.user, b.Addr(), b.db)
	if query != "" {
		dsn += "&" + query
	}
	return dsn
}

// Log returns what PgBouncer wrote to its standard output and error so far.
func (b *Bouncer) Log() string {
	data, err := os.ReadFile(filepath.Join(b.dir, "out.log"))
	if err != nil {
		return fmt.Sprintf("(no PgBouncer log: %v)", err)
	}
	return string(data)
}
