package wal_test

import (
	"context"
	"fmt"
	"os"
	oexec "os/exec"
	"os/signal"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/watermill-outbox/outbox/capture"
	"github.com/watermill-outbox/outbox/capture/wal"
)

// sink is a destination writing each message's item version into table sink of the private
// server, so deliveries survive the relay process being killed.
type sink struct {
	pool  *pgxpool.Pool
	epoch int
}

func (s *sink) Publish(_ string, msgs ...*message.Message) error {
	for _, m := range msgs {
		ch, err := capture.Decode(m)
		if err != nil {
			return err
		}
		row, err := capture.Row[struct{ ID, V int }](ch.After)
		if err != nil {
			return err
		}
		if _, err := s.pool.Exec(context.Background(), `INSERT INTO sink (id, v, epoch) VALUES ($1, $2, $3)`, row.ID, row.V, s.epoch); err != nil {
			return err
		}
	}
	return nil
}

func (s *sink) Close() error { return nil }

// TestMain runs the relay process of TestKill when WAL_KILL_DSN is set, the tests otherwise.
func TestMain(m *testing.M) {
	if dsn := os.Getenv("WAL_KILL_DSN"); dsn != "" {
		if err := killChild(dsn); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// killChild is the relay process of TestKill: a Source delivering table item into table sink
// until it is killed (or stopped by SIGTERM).
func killChild(dsn string) error {
	epoch, _ := strconv.Atoi(os.Getenv("WAL_KILL_EPOCH"))
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return err
	}
	defer pool.Close()
	src, err := wal.New(pool, wal.Config{Tables: []capture.Table{{Name: "item", Fields: []string{"id", "v"}}}, Destination: &sink{pool: pool, epoch: epoch},
		BatchSize: 200, StatusInterval: 50 * time.Millisecond, RetryBackoff: 20 * time.Millisecond})
	if err != nil {
		return err
	}
	c, stop := signal.NotifyContext(ctx, syscall.SIGTERM)
	defer stop()
	return src.Run(c)
}

// TestKill: 10 kill -9 of the relay process while writers update 200 keys: 0 versions lost,
// 0 reordered per key, a version delivered twice only by a process started after the one
// that first delivered it.
func TestKill(t *testing.T) {
	srv, pool := logicalPG(t)
	const keys = 200
	itemTable(t, pool, keys)
	exec(t, pool, `CREATE TABLE sink (seq bigserial PRIMARY KEY, id int, v int, epoch int)`)
	count := func() int {
		var n int
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM sink`).Scan(&n)
		return n
	}
	start := func(epoch int) *oexec.Cmd {
		cmd := oexec.Command(os.Args[0])
		cmd.Env = append(os.Environ(), "WAL_KILL_DSN="+srv.DSN(), "WAL_KILL_EPOCH="+strconv.Itoa(epoch))
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd
	}
	wg := writeItems(pool, keys, 6000, 4)
	const kills = 10
	for epoch := range kills {
		cmd := start(epoch)
		seen := count()
		waitFor(t, 60*time.Second, fmt.Sprintf("delivery by relay %d", epoch), func() bool { return count() > seen+200 })
		_ = cmd.Process.Kill() // SIGKILL
		_ = cmd.Wait()
	}
	wg.Wait()
	final := versions(t, pool)
	last := start(kills)
	defer func() { _ = last.Process.Signal(syscall.SIGTERM); _ = last.Wait() }()
	var got []itemChange
	read := func() {
		rows, err := pool.Query(ctx, `SELECT id, v, epoch FROM sink ORDER BY seq`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		got = got[:0]
		for rows.Next() {
			var c itemChange
			if err := rows.Scan(&c.id, &c.v, &c.epoch); err != nil {
				t.Fatal(err)
			}
			got = append(got, c)
		}
	}
	waitFor(t, 120*time.Second, "every version", func() bool {
		read()
		return allDelivered(got, final)
	})
	dups := checkOrder(t, got, final)
	t.Logf("%d kills: %d delivered, %d duplicates", kills, len(got), dups)
}
