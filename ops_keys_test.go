package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/internal/pgtest"
)

// TestKeyHeadActions: BlockedKeys lists a key behind a failed head and one behind a
// dead-lettered head; RetryKeyHead, SkipKeyHead and PurgeKeyHead act only on the head they
// name while it is still the key's failed head, and answer ErrHeadMoved otherwise.
func TestKeyHeadActions(t *testing.T) {
	pool := pgtest.Require(t)
	schema := outbox.SchemaConfig{Table: pgtest.Table(t)}
	if err := outbox.Migrate(ctx, pool, schema); err != nil {
		t.Fatal(err)
	}
	q := `"` + schema.Table + `"`
	t.Cleanup(func() { pool.Exec(context.Background(), `DROP TABLE IF EXISTS `+q) })
	pub, err := outbox.NewPublisher(pool, outbox.PublisherConfig{Schema: schema}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"a", "a", "a", "b", "b", "c", "c"} {
		m := outbox.NewMessage([]byte(`{}`))
		outbox.SetOrderingKey(m, k)
		if err := pub.Publish("t."+k, m); err != nil {
			t.Fatal(err)
		}
	}
	exec := func(s string) {
		t.Helper()
		if _, err := pool.Exec(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	// a: head failed once; b: head dead-lettered; c: head failed but leased (in flight).
	exec(`UPDATE ` + q + ` SET "attempts" = 1, "last_error" = 'e-a', "next_attempt_at" = now() + interval '1 hour' WHERE "sequence" = 1`)
	exec(`UPDATE ` + q + ` SET "attempts" = 5, "last_error" = 'e-b', "dead_lettered_at" = now() WHERE "sequence" = 4`)
	exec(`UPDATE ` + q + ` SET "attempts" = 1, "last_error" = 'e-c', "next_attempt_at" = now(), "lease_until" = now() + interval '1 minute', "leased_by" = 'r#000000000000#1' WHERE "sequence" = 6`)
	sub, err := outbox.NewSubscriber(pool, outbox.SubscriberConfig{Schema: schema}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	ks, err := sub.BlockedKeys(ctx, 10)
	if err != nil {
		t.Fatal(err)
	}
	type row struct {
		key  string
		seq  int64
		held int64
		dead bool
		err  string
	}
	var got []row
	for _, k := range ks {
		got = append(got, row{k.Key, k.Head.Sequence, k.Held, k.Dead(), k.Head.LastError})
	}
	want := []row{{"a", 1, 2, false, "e-a"}, {"b", 4, 1, true, "e-b"}, {"c", 6, 1, false, "e-c"}}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
		t.Fatalf("BlockedKeys = %+v, want %+v", got, want)
	}
	if err := sub.SkipKeyHead(ctx, outbox.KeyHead{Key: "a", Sequence: 2}); !errors.Is(err, outbox.ErrHeadMoved) {
		t.Errorf("skip of a non-head: %v, want ErrHeadMoved", err)
	}
	if err := sub.PurgeKeyHead(ctx, outbox.KeyHead{Key: "c", Sequence: 6}); !errors.Is(err, outbox.ErrHeadMoved) {
		t.Errorf("purge of a head in flight: %v, want ErrHeadMoved", err)
	}
	if err := sub.RetryKeyHead(ctx, outbox.KeyHead{Key: "b", Sequence: 4}); err != nil {
		t.Fatal(err)
	}
	if err := sub.RetryKeyHead(ctx, outbox.KeyHead{Key: "b", Sequence: 4}); !errors.Is(err, outbox.ErrHeadMoved) {
		t.Errorf("second retry of a retried head: %v, want ErrHeadMoved", err)
	}
	if err := sub.PurgeKeyHead(ctx, outbox.KeyHead{Key: "a", Sequence: 1}); err != nil {
		t.Fatal(err)
	}
	var state string
	if err := pool.QueryRow(ctx, `SELECT string_agg("sequence" || ':' || "attempts" || ':' || (dead_lettered_at IS NOT NULL) || ':' || (next_attempt_at IS NOT NULL AND next_attempt_at <= now()), ' ' ORDER BY "sequence") FROM `+q+` WHERE "sequence" <= 5`).Scan(&state); err != nil {
		t.Fatal(err)
	}
	// 1 purged; 2 (a's next) due now; 4 retried: fresh attempts, due now.
	if want := "2:0:false:true 3:0:false:false 4:0:false:true 5:0:false:false"; state != want {
		t.Errorf("after retry b and purge a: %q, want %q", state, want)
	}
	if err := sub.RetryKeyHead(ctx, outbox.KeyHead{}); !errors.Is(err, outbox.ErrConfig) {
		t.Errorf("empty key: %v, want a ConfigError", err)
	}
	if _, err := sub.BlockedKeys(ctx, 0); !errors.Is(err, outbox.ErrConfig) {
		t.Errorf("limit 0: %v, want a ConfigError", err)
	}
	if _, err := sub.CountDeadLettered(ctx, outbox.DeadLetterFilter{Topics: []string{"*"}, DeadAfter: time.Now(), DeadBefore: time.Now().Add(-time.Hour)}); !errors.Is(err, outbox.ErrConfig) {
		t.Errorf("DeadBefore before DeadAfter: %v, want a ConfigError", err)
	}
}

// TestOperatorNotSupported: on SQLite the operator's operations and the narrowing dead-letter
// filters answer a *NotSupportedError before any SQL.
func TestOperatorNotSupported(t *testing.T) {
	db, err := sql.Open("sqlite", outbox.SQLiteDSN(filepath.Join(t.TempDir(), "o.db")))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	schema := outbox.SchemaConfig{Dialect: outbox.DialectSQLite}
	if err := outbox.Migrate(ctx, db, schema); err != nil {
		t.Fatal(err)
	}
	sub, err := outbox.NewSubscriber(db, outbox.SubscriberConfig{Schema: schema}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	var nse *outbox.NotSupportedError
	_, err = sub.BlockedKeys(ctx, 10)
	if !errors.As(err, &nse) || nse.Database != "SQLite" || !errors.Is(err, outbox.ErrNotSupported) {
		t.Errorf("BlockedKeys on SQLite: %v", err)
	}
	if err := sub.SkipKeyHead(ctx, outbox.KeyHead{Key: "k", Sequence: 1}); !errors.As(err, &nse) {
		t.Errorf("SkipKeyHead on SQLite: %v", err)
	}
	if _, err := sub.CountDeadLettered(ctx, outbox.DeadLetterFilter{Topics: []string{"*"}, ErrorContains: "x"}); !errors.As(err, &nse) {
		t.Errorf("ErrorContains on SQLite: %v", err)
	}
	if n, err := sub.CountDeadLettered(ctx, outbox.DeadLetterFilter{Topics: []string{"*"}}); err != nil || n != 0 {
		t.Errorf("plain filter on SQLite: %d, %v", n, err)
	}
}
