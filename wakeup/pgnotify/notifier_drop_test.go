package pgnotify_test

import (
	"context"
	"testing"
	"time"

	"github.com/watermill-outbox/outbox/internal/pgtest"
	"github.com/watermill-outbox/outbox/wakeup/internal/wakeuptest"
	"github.com/watermill-outbox/outbox/wakeup/pgnotify"
)

// TestSignalAfterNotifierConnectionDropped: the after-commit notifier's idle connection is
// closed by the server (pg_terminate_backend; the same as idle_session_timeout, a failover, a
// firewall's idle cut). The server is up: the next commit's signal still reaches the relays (the
// send is tried once more on a new connection); it was lost until their next poll
// (PollInterval, 5 s by default).
func TestSignalAfterNotifierConnectionDropped(t *testing.T) {
	name := wakeuptest.UniqueName(t, "wknot")
	w, err := pgnotify.New(context.Background(), connConfig(t), pgnotify.Config{
		Channel: name, ListenerApplicationName: name + "_l", NotifierApplicationName: name + "_n",
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch := w.Listen(ctx, nil)
	<-ch // subscribed
	pool := pgtest.Require(t)
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1`, name+"_n").Scan(&n); err != nil || n != 1 {
		t.Fatalf("terminate notifier: %d %v", n, err)
	}
	pgtest.Eventually(t, 5*time.Second, "the notifier's backend gone", func() bool {
		var left int
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, name+"_n").Scan(&left)
		return left == 0
	})
	w.Signal("orders")
	select {
	case <-ch:
	case <-time.After(3 * time.Second):
		t.Fatalf("the signal of a committed transaction was lost: the notifier's dropped connection was noticed only by the send, which was not retried on a new connection")
	}
}
