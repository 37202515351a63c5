package outbox_test

import (
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/internal/mariadbtest"
)

// mariaDBTable migrates a fresh MariaDB outbox table (dropped when t ends) with mods applied.
func mariaDBTable(t *testing.T, db *sql.DB, mods ...func(*outbox.SchemaConfig)) outbox.SchemaConfig {
	t.Helper()
	cfg := outbox.SchemaConfig{Table: mariadbtest.Table(t), Dialect: outbox.DialectMySQL}
	for _, m := range mods {
		m(&cfg)
	}
	if err := outbox.Migrate(ctx, db, cfg); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// TestMariaDBBadInputKeepsTransaction: on MariaDB every validation case of
// TestValidationBeforeSQL is a *ValidationError and the caller's transaction still commits its
// business row; so does a write the server itself refuses (an event id already stored: a
// duplicate-key error aborts only the statement in InnoDB), after which the same transaction
// publishes and commits a good event.
func TestMariaDBBadInputKeepsTransaction(t *testing.T) {
	db := mariadbtest.Require(t)
	cfg := mariaDBTable(t, db, func(c *outbox.SchemaConfig) {
		c.ExtraColumns = []outbox.Column{{Name: "tenant", Type: "VARCHAR(64) NULL"}}
	})
	biz := cfg.Table + "_biz"
	if _, err := db.Exec(fmt.Sprintf("CREATE TABLE `%s` (id INT)", biz)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Exec(fmt.Sprintf("DROP TABLE IF EXISTS `%s`", biz)) })
	bizRows := func(id int) int {
		var n int
		if err := db.QueryRow(fmt.Sprintf("SELECT count(*) FROM `%s` WHERE id = ?", biz), id).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	for i, c := range validationCases() {
		t.Run(c.name, func(t *testing.T) {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback() //nolint:errcheck // after Commit a no-op
			if _, err := tx.Exec(fmt.Sprintf("INSERT INTO `%s` VALUES (?)", biz), i); err != nil {
				t.Fatal(err)
			}
			err = c.publish(mustPublisher(t, tx, outbox.PublisherConfig{Schema: cfg}))
			var ve *outbox.ValidationError
			if !errors.Is(err, outbox.ErrValidation) || !errors.As(err, &ve) || ve.Field != c.field {
				t.Fatalf("err = %v, want *ValidationError on %q", err, c.field)
			}
			if err := tx.Commit(); err != nil {
				t.Fatalf("caller's tx no longer commits: %v", err)
			}
			if n := bizRows(i); n != 1 {
				t.Fatalf("business row count = %d", n)
			}
		})
	}
	// JSON nested deeper than MariaDB's JSON_VALID accepts: refused before SQL.
	deep := strings.Repeat("[", 32) + strings.Repeat("]", 32)
	if err := mustPublisher(t, db, outbox.PublisherConfig{Schema: cfg}).Publish("t", outbox.NewMessage([]byte(deep))); !errors.Is(err, outbox.ErrValidation) {
		t.Fatalf("32 levels of nesting: %v, want a ValidationError", err)
	}
	var outboxRows int
	db.QueryRow(fmt.Sprintf("SELECT count(*) FROM `%s`", cfg.Table)).Scan(&outboxRows)
	if outboxRows != 0 {
		t.Fatalf("outbox rows = %d, want 0", outboxRows)
	}

	// A write the server refuses: the id of a stored event.
	stored := outbox.NewMessage([]byte(`{"n":1}`))
	if err := mustPublisher(t, db, outbox.PublisherConfig{Schema: cfg}).Publish("t", stored); err != nil {
		t.Fatal(err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback() //nolint:errcheck // after Commit a no-op
	if _, err := tx.Exec(fmt.Sprintf("INSERT INTO `%s` VALUES (1000)", biz)); err != nil {
		t.Fatal(err)
	}
	pub := mustPublisher(t, tx, outbox.PublisherConfig{Schema: cfg})
	again := message.NewMessage(stored.UUID, []byte(`{"n":2}`))
	if err := pub.Publish("t", again); err == nil || !strings.Contains(err.Error(), "event id already stored") {
		t.Fatalf("a stored event id: %v, want the server's refusal", err)
	}
	good := outbox.NewMessage([]byte(`{"n":3}`))
	if err := pub.Publish("t", good); err != nil {
		t.Fatalf("publish after the refused statement: %v", err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatalf("caller's tx no longer commits after the server refused a statement: %v", err)
	}
	var ids []string
	rs, err := db.Query(fmt.Sprintf("SELECT id FROM `%s` ORDER BY sequence", cfg.Table))
	if err != nil {
		t.Fatal(err)
	}
	for rs.Next() {
		var id string
		rs.Scan(&id)
		ids = append(ids, id)
	}
	rs.Close()
	if fmt.Sprint(ids) != fmt.Sprint([]string{stored.UUID, good.UUID}) || bizRows(1000) != 1 {
		t.Fatalf("events %v (want %s, %s), business row %d", ids, stored.UUID, good.UUID, bizRows(1000))
	}
}

// TestMariaDBOrderingKeyCommitOrder: 8 writers publish 1–2 events per transaction on 4 shared
// ordering keys through the Publisher on MariaDB (at least 2,000 events); each transaction
// also bumps its key's counter, which records the order in which the key's transactions
// committed. In that order every key's sequences must increase: the per-key locks make
// transactions of one key draw sequences and commit one after the other.
func TestMariaDBOrderingKeyCommitOrder(t *testing.T) {
	db := mariadbtest.Require(t)
	cfg := mariaDBTable(t, db)
	side := cfg.Table + "_commits"
	for _, st := range []string{
		fmt.Sprintf("CREATE TABLE `%s` (k VARCHAR(8) PRIMARY KEY, n INT NOT NULL DEFAULT 0)", side),
		fmt.Sprintf("CREATE TABLE `%s_log` (k VARCHAR(8), n INT, first_seq BIGINT, last_seq BIGINT)", side),
	} {
		if _, err := db.Exec(st); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { db.Exec(fmt.Sprintf("DROP TABLE IF EXISTS `%s`, `%s_log`", side, side)) })
	keys := []string{"a", "b", "c", "d"}
	for _, k := range keys {
		if _, err := db.Exec(fmt.Sprintf("INSERT INTO `%s` (k) VALUES (?)", side), k); err != nil {
			t.Fatal(err)
		}
	}
	const writers, txPerWriter = 8, 170
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for range txPerWriter {
				k := keys[rng.IntN(len(keys))]
				if err := func() error {
					tx, err := db.BeginTx(ctx, nil)
					if err != nil {
						return err
					}
					defer tx.Rollback() //nolint:errcheck // after Commit a no-op
					n := 1 + rng.IntN(2)
					msgs := make([]*message.Message, n)
					for i := range msgs {
						msgs[i] = outbox.NewMessage([]byte(`{}`))
						outbox.SetOrderingKey(msgs[i], k)
					}
					evs, err := mustPublisher(t, tx, outbox.PublisherConfig{Schema: cfg}).PublishEvents(ctx, "t", msgs...)
					if err != nil {
						return err
					}
					if _, err := tx.Exec(fmt.Sprintf("UPDATE `%s` SET n = n + 1 WHERE k = ?", side), k); err != nil {
						return err
					}
					if _, err := tx.Exec(fmt.Sprintf("INSERT INTO `%s_log` SELECT k, n, ?, ? FROM `%s` WHERE k = ?", side, side), evs[0].Sequence, evs[n-1].Sequence, k); err != nil {
						return err
					}
					time.Sleep(time.Duration(rng.IntN(3000)) * time.Microsecond)
					return tx.Commit()
				}(); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	var events, violations int
	db.QueryRow(fmt.Sprintf("SELECT count(*) FROM `%s`", cfg.Table)).Scan(&events)
	if events < 2000 {
		t.Fatalf("only %d events", events)
	}
	if err := db.QueryRow(fmt.Sprintf("SELECT count(*) FROM (SELECT first_seq, lag(last_seq) OVER (PARTITION BY k ORDER BY n) AS prev FROM `%s_log`) s WHERE first_seq < prev", side)).Scan(&violations); err != nil {
		t.Fatal(err)
	}
	if violations != 0 {
		t.Fatalf("%d per-key commit-order violations in %d events", violations, events)
	}
	t.Logf("%d events, %d transactions, 0 violations", events, writers*txPerWriter)
}
