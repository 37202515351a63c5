package wal_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/capture/wal"
	"github.com/watermill-outbox/outbox/internal/privatepg"
)

var ctx = context.Background()

// logicalPG starts a private PostgreSQL with wal_level = logical and returns it with a pool
// on it and the outbox table migrated.
func logicalPG(t testing.TB) (*privatepg.Server, *pgxpool.Pool) {
	t.Helper()
	srv := privatepg.Start(t)
	pool := connect(t, srv)
	if _, err := pool.Exec(ctx, `ALTER SYSTEM SET wal_level = logical`); err != nil {
		t.Fatal(err)
	}
	pool.Close()
	srv.Stop(t)
	srv.Restart(t)
	pool = connect(t, srv)
	if err := outbox.Migrate(ctx, pool, outbox.SchemaConfig{}); err != nil {
		t.Fatal(err)
	}
	return srv, pool
}

func connect(t testing.TB, srv *privatepg.Server) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(ctx, srv.DSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func exec(t testing.TB, pool *pgxpool.Pool, stmts ...string) {
	t.Helper()
	for _, q := range stmts {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
}

// received is one message a recorder got.
type received struct {
	topic, key, id string
	payload        json.RawMessage
	epoch          int // the recorder's epoch when it was delivered (see recorder.restart)
}

// recorder is a destination that records what it is given; fail, when set, decides which
// messages fail.
type recorder struct {
	mu    sync.Mutex
	got   []received
	fail  func(msg *message.Message) bool
	epoch int
}

// restart starts a new epoch: a restart of the source happens now.
func (r *recorder) restart() {
	r.mu.Lock()
	r.epoch++
	r.mu.Unlock()
}

func (r *recorder) Publish(topic string, msgs ...*message.Message) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, m := range msgs {
		if r.fail != nil && r.fail(m) {
			return errors.New("destination refuses")
		}
		r.got = append(r.got, received{topic: topic, key: m.Metadata.Get(outbox.MetadataOrderingKey), id: m.UUID, payload: json.RawMessage(m.Payload), epoch: r.epoch})
	}
	return nil
}

func (r *recorder) Close() error { return nil }

func (r *recorder) setFail(f func(*message.Message) bool) {
	r.mu.Lock()
	r.fail = f
	r.mu.Unlock()
}

func (r *recorder) snapshot() []received {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]received(nil), r.got...)
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// run starts src in the background and returns a stop function that cancels it and returns
// Run's error.
func run(t testing.TB, src *wal.Source) func() error {
	t.Helper()
	c, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- src.Run(c) }()
	var once sync.Once
	var err error
	stop := func() error {
		once.Do(func() { cancel(); err = <-done })
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

// envelope decodes a payload into a map without occurred_at, for comparisons.
func envelope(t testing.TB, p []byte) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(p, &m); err != nil {
		t.Fatalf("%s: %v", p, err)
	}
	delete(m, "occurred_at")
	return m
}

func sameJSON(a, b map[string]any) bool { return reflect.DeepEqual(a, b) }

func fmtEnv(m map[string]any) string { b, _ := json.Marshal(m); return fmt.Sprintf("%s", b) }
