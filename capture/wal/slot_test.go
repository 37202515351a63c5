package wal_test

import (
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/watermill-outbox/outbox/capture/wal"
)

func currentLSN(t testing.TB, pool *pgxpool.Pool) wal.SlotStatus {
	t.Helper()
	st, err := wal.Status(ctx, pool, wal.DefaultSlot)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// TestIdleSlotFollows: with the captured table idle and another table written, the running
// source confirms the slot's position up to the log's end (keepalives and heartbeats), so the
// slot retains no more WAL than a few status periods' writes.
func TestIdleSlotFollows(t *testing.T) {
	_, pool := logicalPG(t)
	tables := itemTable(t, pool, 10)
	exec(t, pool, `CREATE TABLE noise (id bigserial PRIMARY KEY, pad text)`)
	rec := &recorder{}
	src, err := wal.New(pool, wal.Config{Tables: tables, Destination: rec, StatusInterval: 50 * time.Millisecond, Heartbeat: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, src)
	waitFor(t, 30*time.Second, "the inserts", func() bool { return len(rec.snapshot()) == 10 })
	for range 20 {
		exec(t, pool, `INSERT INTO noise (pad) SELECT repeat('x', 200) FROM generate_series(1, 2000)`)
	}
	end := currentLSN(t, pool).CurrentLSN
	waitFor(t, 30*time.Second, "the slot to pass the other table's writes", func() bool {
		return currentLSN(t, pool).ConfirmedFlushLSN >= end
	})
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

// TestSlotLost: a dropped slot and a slot invalidated by max_slot_wal_keep_size make Run
// return a *SlotError (errors.Is ErrSlotLost) instead of retrying forever.
func TestSlotLost(t *testing.T) {
	_, pool := logicalPG(t)
	tables := itemTable(t, pool, 10)
	cfg := wal.Config{Tables: tables, Destination: &recorder{}, StatusInterval: 50 * time.Millisecond}
	if _, err := pool.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, wal.DefaultSlot); err != nil {
		t.Fatal(err)
	}
	src, err := wal.New(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	var se *wal.SlotError
	if err := src.Run(ctx); !errors.Is(err, wal.ErrSlotLost) || !errors.As(err, &se) || se.Reason[:7] != "missing" {
		t.Fatalf("dropped slot: Run returned %v, want a *SlotError (missing)", err)
	}

	// Invalidated: the slot retains more than max_slot_wal_keep_size while no source runs.
	if err := wal.Setup(ctx, pool, cfg); err != nil {
		t.Fatal(err)
	}
	exec(t, pool, `ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'`, `SELECT pg_reload_conf()`, `CREATE TABLE noise (id bigserial PRIMARY KEY, pad text)`)
	waitFor(t, 60*time.Second, "the slot to be invalidated", func() bool {
		exec(t, pool, `INSERT INTO noise (pad) SELECT repeat('x', 500) FROM generate_series(1, 5000)`, `SELECT pg_switch_wal()`, `CHECKPOINT`)
		return currentLSN(t, pool).WALStatus == "lost"
	})
	if err := src.Run(ctx); !errors.As(err, &se) || se.Reason[:11] != "invalidated" {
		t.Fatalf("invalidated slot: Run returned %v, want a *SlotError (invalidated)", err)
	}
}

// TestRetainedBound: with the destination failing for good, the retained WAL crosses
// MaxRetainedWAL; the source then parks the stuck change and every later one, and the slot
// follows the log again.
func TestRetainedBound(t *testing.T) {
	_, pool := logicalPG(t)
	tables := itemTable(t, pool, 10)
	exec(t, pool, `CREATE TABLE noise (id bigserial PRIMARY KEY, pad text)`)
	rec := &recorder{}
	rec.setFail(func(*message.Message) bool { return true })
	const bound = 4 << 20
	src, err := wal.New(pool, wal.Config{Tables: tables, Destination: rec, MaxAttempts: 1 << 30, RetryBackoff: 20 * time.Millisecond, MaxBackoff: 20 * time.Millisecond,
		StatusInterval: 50 * time.Millisecond, MaxRetainedWAL: bound})
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, src)
	waitFor(t, 30*time.Second, "retries", func() bool { return src.Stats().Retries > 3 })
	for range 10 {
		exec(t, pool, `INSERT INTO noise (pad) SELECT repeat('x', 500) FROM generate_series(1, 2000)`)
	}
	end := currentLSN(t, pool).CurrentLSN
	waitFor(t, 30*time.Second, "the bound to act", func() bool { return src.Stats().Parked == 10 })
	waitFor(t, 60*time.Second, "the slot to follow the log and release WAL", func() bool {
		exec(t, pool, `CHECKPOINT`)
		st := currentLSN(t, pool)
		return st.ConfirmedFlushLSN >= end && st.RetainedBytes < bound
	})
	if len(rec.snapshot()) != 0 {
		t.Fatalf("%d delivered by a failing destination", len(rec.snapshot()))
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}
