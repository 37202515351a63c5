package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// binary is the outbox command built once by TestMain; the tests run it.
var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "outbox-cli-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "outbox")
	build := exec.Command("go", "build", "-o", binary, ".")
	build.Stdout, build.Stderr = os.Stdout, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building the outbox command:", err)
		_ = os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// result is one finished run of the binary.
type result struct {
	stdout, stderr string
	code           int
}

// cli runs the binary with args and extra environment variables (NAME=value) and waits for it
// (at most two minutes).
func cli(t *testing.T, env []string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, args...)
	cmd.Env = cleanEnv(env)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	r := result{stdout: out.String(), stderr: errb.String()}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	default:
		t.Fatalf("running outbox %v: %v", args, err)
	}
	return r
}

// cleanEnv is the test's environment without OUTBOX_* variables, plus env.
func cleanEnv(env []string) []string {
	var out []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, envPrefix) {
			out = append(out, kv)
		}
	}
	return append(out, env...)
}

// mustRun runs the binary and fails the test unless it exits 0.
func mustRun(t *testing.T, env []string, args ...string) string {
	t.Helper()
	r := cli(t, env, args...)
	if r.code != 0 {
		t.Fatalf("outbox %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), r.code, r.stdout, r.stderr)
	}
	return r.stdout
}

// wantFailure checks that r failed with exit status code and a one-line message on stderr
// that contains every one of parts.
func wantFailure(t *testing.T, r result, code int, parts ...string) {
	t.Helper()
	if r.code != code {
		t.Fatalf("exit status %d, want %d; stderr: %s", r.code, code, r.stderr)
	}
	msg := strings.TrimSuffix(r.stderr, "\n")
	if msg == "" || strings.Contains(msg, "\n") {
		t.Fatalf("stderr is not one line: %q", r.stderr)
	}
	if !strings.HasPrefix(msg, "outbox: ") {
		t.Fatalf("stderr does not start with \"outbox: \": %q", msg)
	}
	for _, p := range parts {
		if !strings.Contains(msg, p) {
			t.Fatalf("stderr %q does not contain %q", msg, p)
		}
	}
}

// status runs `outbox status --json`.
func status(t *testing.T, db, table string) statusJSON {
	t.Helper()
	out := mustRun(t, nil, "status", "--db", db, "--table", table, "--json")
	var s statusJSON
	if err := json.Unmarshal([]byte(out), &s); err != nil {
		t.Fatalf("status --json: %v: %s", err, out)
	}
	return s
}

// topicCounts maps each topic of s to its pending and dead-lettered counts.
func topicCounts(s statusJSON) map[string][2]int64 {
	m := map[string][2]int64{}
	for _, tp := range s.Topics {
		m[tp.Topic] = [2]int64{tp.Pending, tp.DeadLettered}
	}
	return m
}

// waitFor polls cond until it holds or timeout passes, then fails with what.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %s: %s", timeout, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// process is a running outbox command (the relay).
type process struct {
	cmd    *exec.Cmd
	out    syncBuffer
	errb   syncBuffer
	done   chan struct{}
	waitEr error
}

// start runs the binary in the background; the test's cleanup kills it if still running. When
// the test failed, the cleanup prints the process's stdout and stderr (the relay's log), so that
// every failure of a test with a relay process shows what the relay did.
func start(t testing.TB, env []string, args ...string) *process {
	t.Helper()
	p := &process{cmd: exec.Command(binary, args...), done: make(chan struct{})}
	p.cmd.Env = cleanEnv(env)
	p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.errb
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.waitEr = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() { // runs after the kill below
		if t.Failed() {
			t.Logf("outbox %s\n--- its stdout:\n%s\n--- its stderr:\n%s", strings.Join(args, " "), p.out.String(), p.errb.String())
		}
	})
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// running reports whether the process has not exited yet.
func (p *process) running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// runUntil waits up to 30 s for cond while the relay p keeps running (failing with what when
// cond does not come to hold), then stops it with SIGTERM and requires exit status 0.
func (p *process) runUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	waitFor(t, 30*time.Second, what, func() bool {
		if !p.running() {
			t.Fatalf("relay exited: %s", p.errb.String())
		}
		return cond()
	})
	if code := p.stop(t); code != 0 {
		t.Fatalf("relay exit status %d after SIGTERM; stderr: %s", code, p.errb.String())
	}
}

// stop sends SIGTERM and returns the exit status (failing the test when it does not exit
// within 30 s).
func (p *process) stop(t testing.TB) int {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		t.Fatal(err)
	}
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("process did not stop within 30s of SIGTERM; stderr: %s", p.errb.String())
	}
	return p.cmd.ProcessState.ExitCode()
}
