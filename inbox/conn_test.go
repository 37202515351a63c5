package inbox_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/inbox"
	"github.com/watermill-outbox/outbox/internal/pgtest"
)

// TestConnMessagesTakeTurns: messages of an Inbox over one *pgx.Conn (a Watermill router runs
// several handlers at once) take turns on it: message B, arriving while message A's handler
// runs, waits. Before, B's BEGIN on the same connection was a no-op warning, B's INSERT joined
// A's transaction and B's COMMIT committed A's inbox row and half-done write; A's handler then
// failed (the router nacks A), and A's redelivery was skipped as a duplicate: A was never
// processed.
func TestConnMessagesTakeTurns(t *testing.T) {
	pool := pgtest.Require(t)
	e := pgEnv(t, "pgx", pool)
	c, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Release()
	in, err := inbox.New(inbox.FromPgx(c.Conn(), pgx.TxOptions{}), e.config("billing"), nil)
	if err != nil {
		t.Fatal(err)
	}
	insert := fmt.Sprintf(`INSERT INTO %s (id) VALUES ($1)`, e.biz)
	mA := outbox.NewMessage([]byte(`"a"`))
	mB := outbox.NewMessage([]byte(`"b"`))
	inA, releaseA := make(chan struct{}), make(chan struct{})
	errA := make(chan error, 1)
	go func() {
		_, err := in.Process(mA, func(msg *message.Message, tx pgx.Tx) ([]*message.Message, error) {
			if _, err := tx.Exec(ctx, insert, "a-step-1"); err != nil {
				return nil, err
			}
			close(inA)
			<-releaseA
			return nil, errors.New("A fails after its first write")
		})
		errA <- err
	}()
	<-inA
	errB := make(chan error, 1)
	go func() {
		_, err := in.Process(mB, func(msg *message.Message, tx pgx.Tx) ([]*message.Message, error) {
			_, err := tx.Exec(ctx, insert, "b")
			return nil, err
		})
		errB <- err
	}()
	select { // B finishes while A's handler runs, or (fixed) waits for A's transaction
	case err := <-errB:
		errB <- err
	case <-time.After(300 * time.Millisecond):
	}
	close(releaseA)
	if err := <-errB; err != nil {
		t.Fatalf("B: %v", err)
	}
	if err := <-errA; err == nil {
		t.Fatal("A's handler failed but Process returned nil")
	} else {
		t.Logf("A: %v (the router nacks A)", err)
	}
	// A was nacked: its redelivery must run the handler.
	res, err := in.Process(mA.Copy(), func(msg *message.Message, tx pgx.Tx) ([]*message.Message, error) {
		_, err := tx.Exec(ctx, insert, "a-complete")
		return nil, err
	})
	t.Logf("A's redelivery: result %v (1 processed, 2 duplicate), err %v", res, err)
	if n := e.count(t, fmt.Sprintf(`SELECT count(*) FROM %s WHERE id = 'a-step-1'`, e.biz)); n != 0 {
		t.Errorf("the failed handler's write of A is committed (%d row)", n)
	}
	if res != inbox.ResultProcessed {
		t.Errorf("A's redelivery was not processed (result %v): A's inbox row was committed by B's transaction although A's handler failed", res)
	}
}

// TestTxRefusesStatementsAfterEnd: the handler's pgx.Tx refuses statements after it ended
// (pgx.ErrTxClosed), as pgx's own does. The pipelined transaction ran them on the connection it
// had released to the pool: in autocommit, or inside another message's transaction there.
func TestTxRefusesStatementsAfterEnd(t *testing.T) {
	eachPgxTx(t, pgx.TxOptions{}, func(t *testing.T, e *env, in *inbox.Inbox[pgx.Tx]) {
		var kept pgx.Tx
		if _, err := in.Process(outbox.NewMessage(nil), func(msg *message.Message, tx pgx.Tx) ([]*message.Message, error) {
			kept = tx // e.g. handed to a goroutine that finishes later
			return nil, nil
		}); err != nil {
			t.Fatal(err)
		}
		_, err := kept.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (id) VALUES ('after-commit')`, e.biz))
		if !errors.Is(err, pgx.ErrTxClosed) {
			t.Errorf("Exec after the inbox committed: err %v, want pgx.ErrTxClosed; rows written outside any transaction: %d",
				err, e.count(t, fmt.Sprintf(`SELECT count(*) FROM %s WHERE id = 'after-commit'`, e.biz)))
		}
	})
}

// eachPgxTx runs f with an Inbox (consumer "billing", transactions begun with opts) over the
// pipelined transaction of a *pgxpool.Pool and over pgx's own transaction (another
// PgxBeginner), each on a fresh environment.
func eachPgxTx(t *testing.T, opts pgx.TxOptions, f func(t *testing.T, e *env, in *inbox.Inbox[pgx.Tx])) {
	pool := pgtest.Require(t)
	for _, tc := range []struct {
		name string
		db   inbox.PgxBeginner
	}{{"pgx-own-tx", otherBeginner{pool}}, {"pipelined-pool-tx", pool}} {
		t.Run(tc.name, func(t *testing.T) {
			e := pgEnv(t, "pgx", pool)
			in, err := inbox.New(inbox.FromPgx(tc.db, opts), e.config("billing"), nil)
			if err != nil {
				t.Fatal(err)
			}
			f(t, e, in)
		})
	}
}

// TestCommitQueryHonoured: pgx.TxOptions.CommitQuery is sent by the pipelined transaction of a
// *pgxpool.Pool as by pgx's own (any other PgxBeginner); it always sent "commit". CommitQuery
// "rollback" makes the difference visible.
func TestCommitQueryHonoured(t *testing.T) {
	eachPgxTx(t, pgx.TxOptions{CommitQuery: "rollback"}, func(t *testing.T, e *env, in *inbox.Inbox[pgx.Tx]) {
		_, err := in.Process(outbox.NewMessage(nil), func(*message.Message, pgx.Tx) ([]*message.Message, error) { return nil, nil })
		if n := e.count(t, "SELECT count(*) FROM "+quote(e.inbox.Table, "")); n != 0 || !errors.Is(err, pgx.ErrTxCommitRollback) {
			t.Errorf("CommitQuery ignored: Process err %v, inbox rows %d (want the CommitQuery's outcome: ErrTxCommitRollback, 0 rows)", err, n)
		}
	})
}

// TestConfigRefusesUnstorableText: a Consumer or PublishTopic PostgreSQL cannot store as text
// (a NUL, invalid UTF-8) is a configuration error at New, and such a message key is ErrNoKey.
// New accepted them, and every message then failed at the database (nacked forever).
func TestConfigRefusesUnstorableText(t *testing.T) {
	for _, tc := range []struct {
		name string
		mod  func(*inbox.Config)
	}{
		{"consumer with NUL", func(c *inbox.Config) { c.Consumer = "bill\x00ing" }},
		{"consumer invalid UTF-8", func(c *inbox.Config) { c.Consumer = "bill\xffing" }},
		{"publish topic invalid UTF-8", func(c *inbox.Config) { c.PublishTopic = "t\xff" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := inbox.Config{Consumer: "billing"}
			tc.mod(&c)
			if err := c.Validate(); err == nil {
				t.Errorf("Validate accepted %+q / %+q", c.Consumer, c.PublishTopic)
			}
		})
	}
	pool := pgtest.Require(t)
	e := pgEnv(t, "pgx", pool)
	var ce *outbox.ConfigError
	if _, err := inbox.New(inbox.FromPgx(pool, pgx.TxOptions{}), e.config("bill\x00ing"), nil); !errors.As(err, &ce) || ce.Field != "inbox.Config.Consumer" {
		t.Fatalf("New with a NUL in Consumer: %v, want a *outbox.ConfigError for inbox.Config.Consumer (every message failed at the database instead)", err)
	}
	in, err := inbox.New(inbox.FromPgx(pool, pgx.TxOptions{}), e.config("billing"), nil)
	if err != nil {
		t.Fatal(err)
	}
	m := outbox.NewMessage(nil)
	m.UUID = "id\xff"
	if _, err := in.Process(m, func(*message.Message, pgx.Tx) ([]*message.Message, error) { return nil, nil }); !errors.Is(err, inbox.ErrNoKey) {
		t.Fatalf("a key that is not valid UTF-8: %v, want ErrNoKey", err)
	}
}

// TestHandlerEndingTxIsReported: a handler that commits the inbox transaction itself and then
// fails gets an error that says so besides its own: its message is recorded, and the redelivery
// is skipped. Its own error alone was returned, as if nothing had been committed.
func TestHandlerEndingTxIsReported(t *testing.T) {
	_, in := poolInbox(t)
	m := outbox.NewMessage(nil)
	_, err := in.Process(m, func(msg *message.Message, tx pgx.Tx) ([]*message.Message, error) {
		if err := tx.Commit(ctx); err != nil { // e.g. a helper library that "owns" the tx
			return nil, err
		}
		return nil, errors.New("later step failed")
	})
	if err == nil || !strings.Contains(err.Error(), "later step failed") || !strings.Contains(err.Error(), "the handler ended the inbox transaction itself") {
		t.Fatalf("Process: %v, want the handler's error and that it ended the transaction itself", err)
	}
	if res, err := in.Process(m.Copy(), func(*message.Message, pgx.Tx) ([]*message.Message, error) { return nil, nil }); res != inbox.ResultDuplicate || err != nil {
		t.Fatalf("redelivery: %v, %v; want ResultDuplicate (the handler's commit recorded the message)", res, err)
	}
}

// TestPanicRestoresContext: after a handler panic (rolled back), the message's context no longer
// carries the ended transaction, as after every other return; a Recoverer or PoisonQueue
// middleware outside the inbox saw it.
func TestPanicRestoresContext(t *testing.T) {
	e, in := poolInbox(t)
	m := outbox.NewMessage(nil)
	func() {
		defer func() { _ = recover() }()
		_, _ = in.Process(m, func(*message.Message, pgx.Tx) ([]*message.Message, error) { panic("boom") })
	}()
	if got := e.counts(t); got != [3]int{0, 0, 0} {
		t.Fatalf("after the panic: %v", got)
	}
	if _, ok := inbox.TxFromContext[pgx.Tx](m.Context()); ok {
		t.Error("after the panic the message's context still carries the ended transaction (a Recoverer/PoisonQueue middleware outside sees it)")
	}
}

// poolInbox returns a fresh environment and an Inbox (consumer "billing") over its pool.
func poolInbox(t *testing.T) (*env, *inbox.Inbox[pgx.Tx]) {
	pool := pgtest.Require(t)
	e := pgEnv(t, "pgx", pool)
	in, err := inbox.New(inbox.FromPgx(pool, pgx.TxOptions{}), e.config("billing"), nil)
	if err != nil {
		t.Fatal(err)
	}
	return e, in
}
