package chaos

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
)

// mariaServer is a private MariaDB server (mariadbd) in a temp dir, listening on 127.0.0.1 on
// a free port, restartable; never the shared server on :3306.
type mariaServer struct {
	bin, dir, data string
	port           int

	child
}

// lookProgram finds the first of names on PATH or in /usr/sbin and /usr/bin.
func lookProgram(names ...string) (string, error) {
	for _, n := range names {
		if p, err := exec.LookPath(n); err == nil {
			return p, nil
		}
		for _, d := range []string{"/usr/sbin", "/usr/bin"} {
			if p := filepath.Join(d, n); isFile(p) {
				return p, nil
			}
		}
	}
	return "", fmt.Errorf("none of %v on PATH, /usr/sbin or /usr/bin", names)
}

func isFile(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir()
}

// startMariaDB initialises a data directory (mariadb-install-db, root without password),
// starts mariadbd on it, creates database test, and kills the server when tb ends. A missing
// mariadbd or mariadb-install-db skips tb (fails it when CI=true).
func startMariaDB(tb testing.TB) *mariaServer {
	tb.Helper()
	bin, err := lookProgram("mariadbd", "mysqld")
	if err != nil {
		missing(tb, "mariadbd", err)
	}
	install, err := lookProgram("mariadb-install-db", "mysql_install_db")
	if err != nil {
		missing(tb, "mariadb-install-db", err)
	}
	// A short path: the server's Unix socket lives in it (sun_path holds 108 bytes).
	dir, err := os.MkdirTemp("", "chaosmy-")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = os.RemoveAll(dir) })
	m := &mariaServer{bin: bin, dir: dir, data: filepath.Join(dir, "data"), port: freePort(tb)}
	args := []string{"--no-defaults", "--datadir=" + m.data, "--auth-root-authentication-method=normal", "--skip-test-db", "--skip-name-resolve"}
	if os.Geteuid() == 0 {
		args = append(args, "--user=root")
	}
	cmd := exec.Command(install, args...)
	cmd.Env = childEnv()
	if out, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("%s: %v\n%s", install, err, tail(string(out), 20))
	}
	if _, err := m.start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		m.signal(syscall.SIGKILL)
		m.waitExit(30 * time.Second)
	})
	cfg := m.config()
	cfg.DBName = ""
	conn, err := mysql.NewConnector(cfg)
	if err == nil {
		var c interface{ Close() error }
		if c, err = conn.Connect(context.Background()); err == nil {
			_ = c.Close()
		}
	}
	if err != nil {
		tb.Fatal(err)
	}
	out, err := exec.Command(m.clientBin(), "--no-defaults", "-h127.0.0.1", "-P"+strconv.Itoa(m.port), "-uroot", "-e", "CREATE DATABASE test").CombinedOutput()
	if err != nil {
		tb.Fatalf("CREATE DATABASE test: %v\n%s", err, out)
	}
	return m
}

// clientBin is the mariadb command-line client.
func (m *mariaServer) clientBin() string {
	p, err := lookProgram("mariadb", "mysql")
	if err != nil {
		return "mariadb"
	}
	return p
}

// Addr is host:port of the server.
func (m *mariaServer) Addr() string { return fmt.Sprintf("127.0.0.1:%d", m.port) }

func (m *mariaServer) config() *mysql.Config {
	cfg := mysql.NewConfig()
	cfg.User, cfg.Net, cfg.Addr, cfg.DBName = "root", "tcp", m.Addr(), "test"
	cfg.Timeout = time.Second
	return cfg
}

func (m *mariaServer) logFile() string { return filepath.Join(m.dir, "server.log") }

// start starts mariadbd and returns the moment it first accepted a connection (tried every
// 10 ms, for up to 60 s). innodb_flush_log_at_trx_commit=2: the suite kills processes, never
// the machine, so the log written at each COMMIT survives in the page cache.
func (m *mariaServer) start() (time.Time, error) {
	args := []string{"--no-defaults", "--datadir=" + m.data, "--port=" + strconv.Itoa(m.port), "--bind-address=127.0.0.1",
		"--socket=" + filepath.Join(m.dir, "sock"), "--pid-file=" + filepath.Join(m.dir, "pid"), "--log-error=" + m.logFile(),
		"--skip-name-resolve", "--innodb-buffer-pool-size=128M", "--innodb-flush-log-at-trx-commit=2", "--max-connections=200"}
	if os.Geteuid() == 0 {
		args = append(args, "--user=root")
	}
	cmd := exec.Command(m.bin, args...)
	cmd.Env = childEnv()
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return time.Time{}, fmt.Errorf("mariadbd: %w", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	m.mu.Lock()
	m.cmd, m.done = cmd, done
	m.mu.Unlock()
	cfg := m.config()
	cfg.DBName = ""
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		return time.Time{}, err
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		c, err := conn.Connect(ctx)
		cancel()
		if err == nil {
			up := time.Now()
			_ = c.Close()
			return up, nil
		}
		select {
		case <-done:
			b, _ := os.ReadFile(m.logFile())
			return time.Time{}, fmt.Errorf("mariadbd exited while starting:\n%s", tail(string(b), 20))
		default:
		}
		if time.Now().After(deadline) {
			return time.Time{}, fmt.Errorf("mariadbd on %s not accepting connections after 60 s: %w", m.Addr(), err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// restart stops the server (mode term: SIGTERM, a clean shutdown; kill: SIGKILL, InnoDB crash
// recovery at the next start), starts it again on the same port and data directory, and
// returns the moment it first accepted a connection again.
func (m *mariaServer) restart(mode string) (time.Time, error) {
	sig := map[string]syscall.Signal{"term": syscall.SIGTERM, "kill": syscall.SIGKILL}[mode]
	if sig == 0 {
		return time.Time{}, fmt.Errorf("restart mode %q: want term or kill", mode)
	}
	m.signal(sig)
	if !m.waitExit(60 * time.Second) {
		return time.Time{}, errors.New("mariadbd still running 60 s after " + sig.String())
	}
	return m.start()
}
