package inbox_test

import (
	"context"
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

var ctx = context.Background()

// TestProcess runs the same behaviour through pgx, database/sql on PostgreSQL, and SQLite.
func TestProcess(t *testing.T) {
	t.Run("pgx", func(t *testing.T) {
		pool := pgtest.Require(t)
		e := pgEnv(t, "pgx", pool)
		testProcess(t, e, inbox.FromPgx(pool, pgx.TxOptions{}))
	})
	t.Run("pgx-conn", func(t *testing.T) {
		pool := pgtest.Require(t)
		c, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Release()
		e := pgEnv(t, "pgx", pool)
		testProcess(t, e, inbox.FromPgx(c.Conn(), pgx.TxOptions{}))
	})
	t.Run("pgx-other-beginner", func(t *testing.T) {
		pool := pgtest.Require(t)
		e := pgEnv(t, "pgx", pool)
		testProcess(t, e, inbox.FromPgx(otherBeginner{pool}, pgx.TxOptions{}))
	})
	t.Run("database-sql", func(t *testing.T) {
		db := pgtest.StdDB(t)
		e := pgEnv(t, "database/sql", db)
		testProcess(t, e, inbox.FromSQL(db, nil))
	})
	t.Run("sqlite", func(t *testing.T) {
		e, db := sqliteEnv(t)
		testProcess(t, e, inbox.FromSQL(db, nil))
	})
}

func testProcess[T any](t *testing.T, e *env, db inbox.DB[T]) {
	in, err := inbox.New(db, e.config("billing"), nil)
	if err != nil {
		t.Fatal(err)
	}
	var sawTx bool
	handler := func(msg *message.Message, tx T) ([]*message.Message, error) {
		ctxTx, ok := inbox.TxFromContext[T](msg.Context())
		sawTx = ok && any(ctxTx) == any(tx)
		if err := execTx(msg.Context(), tx, fmt.Sprintf(`INSERT INTO %s (id) VALUES ($1)`, e.biz), msg.UUID); err != nil {
			return nil, err
		}
		if string(msg.Payload) == `"fail"` {
			return nil, errors.New("handler says no")
		}
		return []*message.Message{outbox.NewMessage([]byte(`{"done":"` + msg.UUID + `"}`))}, nil
	}

	// A new message: business row, follow-up event and inbox row commit together.
	m1 := outbox.NewMessage([]byte(`"ok"`))
	res, err := in.Process(m1, handler)
	if err != nil || res != inbox.ResultProcessed {
		t.Fatalf("first delivery: %v, %v", res, err)
	}
	if !sawTx {
		t.Fatal("the handler's message context did not carry its transaction")
	}
	if _, ok := inbox.TxFromContext[T](m1.Context()); ok {
		t.Fatal("the message context still carries the finished transaction")
	}
	if got := e.counts(t); got != [3]int{1, 1, 1} {
		t.Fatalf("after one message: business, outbox, inbox rows = %v, want [1 1 1]", got)
	}
	payload := `"payload"::text`
	if e.name == "sqlite" {
		payload = `"payload"`
	}
	if n := e.count(t, fmt.Sprintf(`SELECT count(*) FROM %s WHERE "topic" = 'followups' AND %s LIKE $1`, quote(e.outbox.Table, outbox.DefaultTable), payload), "%"+m1.UUID+"%"); n != 1 {
		t.Fatalf("follow-up event of %s: %d rows", m1.UUID, n)
	}

	// Redelivered: skipped, nothing written, no error (the router acks).
	res, err = in.Process(m1.Copy(), handler)
	if err != nil || res != inbox.ResultDuplicate {
		t.Fatalf("redelivery: %v, %v", res, err)
	}
	if got := e.counts(t); got != [3]int{1, 1, 1} {
		t.Fatalf("after a redelivery: %v, want [1 1 1]", got)
	}

	// A handler error rolls back the business row, the event and the inbox row.
	m2 := outbox.NewMessage([]byte(`"fail"`))
	if _, err := in.Process(m2, handler); err == nil || err.Error() != "handler says no" {
		t.Fatalf("failing handler: %v", err)
	}
	if got := e.counts(t); got != [3]int{1, 1, 1} {
		t.Fatalf("after a rollback: %v, want [1 1 1]", got)
	}
	// … and the message is processed when it comes again.
	m2.Payload = []byte(`"ok"`)
	if res, err := in.Process(m2, handler); err != nil || res != inbox.ResultProcessed {
		t.Fatalf("after the rollback, redelivery: %v, %v", res, err)
	}

	// Another consumer processes the same message once more, for itself.
	other, err := inbox.New(db, e.config("shipping"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if res, err := other.Process(m1.Copy(), func(*message.Message, T) ([]*message.Message, error) { return nil, nil }); err != nil || res != inbox.ResultProcessed {
		t.Fatalf("second consumer: %v, %v", res, err)
	}

	// A returned message the outbox refuses rolls back the whole transaction.
	m3 := outbox.NewMessage([]byte(`"ok"`))
	bad := func(msg *message.Message, tx T) ([]*message.Message, error) {
		if _, err := handler(msg, tx); err != nil {
			return nil, err
		}
		return []*message.Message{message.NewMessage("not-a-uuid", []byte(`1`))}, nil
	}
	var ve *outbox.ValidationError
	if _, err := in.Process(m3, bad); !errors.As(err, &ve) {
		t.Fatalf("invalid follow-up: %v, want *outbox.ValidationError", err)
	}
	// No topic for returned messages: ErrNoTopic, rolled back.
	cfg := e.config("billing")
	cfg.PublishTopic = ""
	noTopic, err := inbox.New(db, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := noTopic.Process(m3, handler); !errors.Is(err, inbox.ErrNoTopic) {
		t.Fatalf("no topic: %v, want ErrNoTopic", err)
	}
	if got := e.counts(t); got != [3]int{2, 2, 3} {
		t.Fatalf("after refused follow-ups: %v, want [2 2 3]", got)
	}
	// An empty key is refused before any SQL.
	if _, err := in.Process(message.NewMessage("", []byte(`1`)), handler); !errors.Is(err, inbox.ErrNoKey) {
		t.Fatalf("empty key: %v, want ErrNoKey", err)
	}

	// Middleware: an ordinary Watermill handler inside the transaction; its messages go to the
	// outbox, none to the router.
	mw := in.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		tx, ok := inbox.TxFromContext[T](msg.Context())
		if !ok {
			return nil, errors.New("no transaction in the context")
		}
		return handler(msg, tx)
	})
	m4 := outbox.NewMessage([]byte(`"ok"`))
	for range 2 {
		if out, err := mw(m4.Copy()); err != nil || out != nil {
			t.Fatalf("middleware: %v, %v", out, err)
		}
	}
	if got := e.counts(t); got != [3]int{3, 3, 4} {
		t.Fatalf("after the middleware: %v, want [3 3 4]", got)
	}
	if s := in.Stats(); s != (inbox.Stats{Processed: 3, Duplicates: 2, Failed: 3}) {
		t.Fatalf("stats %+v", s)
	}

	// Operations: count, status, cleanup by age and consumer.
	if n, err := inbox.Count(ctx, e.handle, e.inbox, ""); err != nil || n != 4 {
		t.Fatalf("count: %d, %v", n, err)
	}
	if n, err := inbox.Count(ctx, e.handle, e.inbox, "shipping"); err != nil || n != 1 {
		t.Fatalf("count shipping: %d, %v", n, err)
	}
	st, err := inbox.Status(ctx, e.handle, e.inbox)
	if err != nil || len(st) != 2 || st[0].Consumer != "billing" || st[0].Messages != 3 || st[1].Consumer != "shipping" || st[1].Messages != 1 {
		t.Fatalf("status: %+v, %v", st, err)
	}
	if age := time.Since(st[0].Oldest); age < 0 || age > time.Minute || st[0].Newest.Before(st[0].Oldest) {
		t.Fatalf("status times: %+v", st[0])
	}
	if n, err := inbox.Cleanup(ctx, e.handle, e.inbox, "", time.Hour); err != nil || n != 0 {
		t.Fatalf("cleanup of rows older than 1h: %d, %v", n, err)
	}
	if n, err := inbox.Cleanup(ctx, e.handle, e.inbox, "shipping", 0); err != nil || n != 1 {
		t.Fatalf("cleanup shipping: %d, %v", n, err)
	}
	if n, err := inbox.Cleanup(ctx, e.handle, e.inbox, "", 0); err != nil || n != 3 {
		t.Fatalf("cleanup all: %d, %v", n, err)
	}
	if _, err := inbox.Cleanup(ctx, e.handle, e.inbox, "", -time.Second); !errors.Is(err, outbox.ErrConfig) {
		t.Fatalf("negative age: %v", err)
	}
	// A cleaned-up message is processed again when redelivered: the retention is the window.
	if res, err := in.Process(m1.Copy(), func(*message.Message, T) ([]*message.Message, error) { return nil, nil }); err != nil || res != inbox.ResultProcessed {
		t.Fatalf("after cleanup: %v, %v", res, err)
	}
}

// TestSchemaSQL: the DDL text per dialect, and that the PostgreSQL text creates the table.
func TestSchemaSQL(t *testing.T) {
	pg, err := inbox.SchemaSQL(inbox.SchemaConfig{Table: "app.inbox"})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`CREATE TABLE IF NOT EXISTS "app"."inbox"`, `PRIMARY KEY ("consumer", "message_id")`, `"processed_at" TIMESTAMPTZ NOT NULL DEFAULT now()`, `CREATE INDEX IF NOT EXISTS "inbox_processed_idx" ON "app"."inbox" ("processed_at");`} {
		if !strings.Contains(pg, want) {
			t.Errorf("PostgreSQL DDL lacks %q:\n%s", want, pg)
		}
	}
	lite, err := inbox.SchemaSQL(inbox.SchemaConfig{Dialect: outbox.DialectSQLite})
	if err != nil || !strings.Contains(lite, `"processed_at" INTEGER NOT NULL`) {
		t.Fatalf("SQLite DDL: %v\n%s", err, lite)
	}
	pool := pgtest.Require(t)
	table := pgtest.Table(t)
	script, err := inbox.SchemaSQL(inbox.SchemaConfig{Table: table})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := pool.Exec(ctx, script, pgx.QueryExecModeSimpleProtocol); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := inbox.Count(ctx, pool, inbox.SchemaConfig{Table: table}, ""); err != nil || n != 0 {
		t.Fatalf("count on the script's table: %d, %v", n, err)
	}
}

// otherBeginner is a PgxBeginner that is neither a pool nor a connection: FromPgx then uses
// pgx's own transactions.
type otherBeginner struct{ inbox.PgxBeginner }

// TestPgxNested: the pipelined pgx transaction's Begin makes savepoints: a nested rollback
// undoes only its own writes; a failed statement inside a savepoint leaves the transaction
// usable after the nested rollback; the outer commit keeps the rest.
func TestPgxNested(t *testing.T) {
	pool := pgtest.Require(t)
	e := pgEnv(t, "pgx", pool)
	in, err := inbox.New(inbox.FromPgx(pool, pgx.TxOptions{}), e.config("nested"), nil)
	if err != nil {
		t.Fatal(err)
	}
	insert := fmt.Sprintf(`INSERT INTO %s (id) VALUES ($1)`, e.biz)
	_, err = in.Process(outbox.NewMessage(nil), func(msg *message.Message, tx pgx.Tx) ([]*message.Message, error) {
		if _, err := tx.Exec(ctx, insert, "outer"); err != nil {
			return nil, err
		}
		nested, err := tx.Begin(ctx)
		if err != nil {
			return nil, err
		}
		if _, err := nested.Exec(ctx, insert, "outer"); err == nil { // duplicate key
			return nil, errors.New("duplicate insert succeeded")
		}
		if err := nested.Rollback(ctx); err != nil {
			return nil, err
		}
		if err := nested.Rollback(ctx); !errors.Is(err, pgx.ErrTxClosed) {
			return nil, fmt.Errorf("second rollback: %v", err)
		}
		kept, err := tx.Begin(ctx)
		if err != nil {
			return nil, err
		}
		if _, err := kept.Exec(ctx, insert, "kept"); err != nil {
			return nil, err
		}
		if tx.Conn() == nil {
			return nil, errors.New("no connection")
		}
		lo := tx.LargeObjects()
		oid, err := lo.Create(ctx, 0)
		if err != nil {
			return nil, fmt.Errorf("large object: %w", err)
		}
		if err := lo.Unlink(ctx, oid); err != nil {
			return nil, fmt.Errorf("large object: %w", err)
		}
		return nil, kept.Commit(ctx)
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := e.counts(t); got != [3]int{2, 0, 1} {
		t.Fatalf("business, outbox, inbox rows = %v, want [2 0 1]", got)
	}
	// The pool's connections came back idle: a fresh transaction works on each.
	for range 30 {
		if _, err := in.Process(outbox.NewMessage(nil), func(*message.Message, pgx.Tx) ([]*message.Message, error) { return nil, nil }); err != nil {
			t.Fatal(err)
		}
	}
}
