package outbox_test

import (
	"fmt"
	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/internal/mariadbtest"
	"testing"
)

// TestBacklogUnavailableReadsTheClass: Backlog.Unavailable counts by last_error_class, which
// the relay writes, never by last_error's text: failed deliveries whose handler error reads
// "unavailable: …" or "Unavailable: …" (errText stores the error verbatim) are failures, not
// an outage, on every database (SQLite's LIKE is ASCII case-insensitive and once counted one).
func TestBacklogUnavailableReadsTheClass(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		schema := b.table(t)
		b.seed(t, schema, "t", 2, []string{"", "k"})
		b.exec(t, fmt.Sprintf(`UPDATE %q SET attempts = 1, last_error = 'Unavailable: payment gateway said 503', last_error_class = 'failure' WHERE ordering_key IS NULL`, schema.Table))
		b.exec(t, fmt.Sprintf(`UPDATE %q SET attempts = 1, last_error = 'unavailable: payment gateway said 503', last_error_class = 'failure' WHERE ordering_key IS NOT NULL`, schema.Table))
		sub := b.newSub(t, fastCfg(schema))
		bl, err := sub.Backlog(ctx)
		if err != nil {
			t.Fatal(err)
		}
		tb, err := sub.BacklogByTopic(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if bl.Unavailable != 0 || len(tb) != 1 || tb[0].Unavailable != 0 {
			t.Fatalf("Backlog.Unavailable = %d, BacklogByTopic %+v: two failed events counted as unavailable, want 0", bl.Unavailable, tb)
		}
	})
}

// TestMariaDBRepeatableReadIdempotency: a caller's REPEATABLE READ transaction (MariaDB's
// default) whose snapshot predates a concurrent commit of the same idempotency key gets the
// stored event back (Duplicate), and the key is stored once.
func TestMariaDBRepeatableReadIdempotency(t *testing.T) {
	db := mariadbtest.Require(t)
	cfg := mariaDBTable(t, db)
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback() //nolint:errcheck
	var n int
	if err := tx.QueryRow(fmt.Sprintf("SELECT count(*) FROM `%s`", cfg.Table)).Scan(&n); err != nil { // snapshot
		t.Fatal(err)
	}
	first, err := mustPublisher(t, db, outbox.PublisherConfig{Schema: cfg}).Enqueue(ctx, outbox.EventInput{Topic: "t", Payload: 1, IdempotencyKey: "K"})
	if err != nil {
		t.Fatal(err)
	}
	second, err := mustPublisher(t, tx, outbox.PublisherConfig{Schema: cfg}).Enqueue(ctx, outbox.EventInput{Topic: "t", Payload: 2, IdempotencyKey: "K"})
	if err != nil {
		t.Fatalf("second enqueue in an older snapshot: %v", err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := db.QueryRow(fmt.Sprintf("SELECT count(*) FROM `%s`", cfg.Table)).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 1 || !second.Duplicate || second.Sequence != first.Sequence {
		t.Fatalf("rows %d, first %+v, second %+v", n, first, second)
	}
}

// TestBigintScopeKeepsTenantsApart: with IdempotencyScope on a BIGINT tenant column
// (snowflake-style ids above 2^53), two tenants publishing the same idempotency key store two
// events (README: the key is unique per scope). On MariaDB the read-back compares the column
// with a string (as doubles): tenant …568 was answered with tenant …567's event (Duplicate) and
// its own event was never stored.
func TestBigintScopeKeepsTenantsApart(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		schema := b.table(t, func(c *outbox.SchemaConfig) {
			c.ExtraColumns = []outbox.Column{{Name: "tenant", Type: "BIGINT NULL"}}
			c.IdempotencyScope = []string{"tenant"}
		})
		pub := b.publisher(t, outbox.PublisherConfig{Schema: schema})
		var evs []outbox.Event
		for _, tenant := range []int64{12345678901234567, 12345678901234568} {
			ev, err := pub.Enqueue(ctx, outbox.EventInput{Topic: "invoices", Payload: 1, IdempotencyKey: "invoice-1", ExtraColumns: map[string]any{"tenant": tenant}})
			if err != nil {
				t.Fatal(err)
			}
			evs = append(evs, ev)
		}
		n := b.count(t, fmt.Sprintf(`SELECT count(*) FROM %q`, schema.Table))
		if n != 2 || evs[1].Duplicate || evs[1].Sequence == evs[0].Sequence {
			t.Fatalf("%d events stored; tenant 12345678901234568's enqueue returned %+v (tenant 12345678901234567's was seq %d): another tenant's event, its own lost",
				n, evs[1], evs[0].Sequence)
		}
	})
}

// TestBigintScopeRetryIsDuplicate: with IdempotencyScope on a BIGINT tenant column, the
// retry of an enqueue (same tenant, same idempotency key) returns the stored event as a
// Duplicate (README, idempotency keys), also for a tenant id above 2^53.
func TestBigintScopeRetryIsDuplicate(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		schema := b.table(t, func(c *outbox.SchemaConfig) {
			c.ExtraColumns = []outbox.Column{{Name: "tenant", Type: "BIGINT NULL"}}
			c.IdempotencyScope = []string{"tenant"}
		})
		pub := b.publisher(t, outbox.PublisherConfig{Schema: schema})
		var evs []outbox.Event
		for range 2 {
			ev, err := pub.Enqueue(ctx, outbox.EventInput{Topic: "invoices", Payload: 1, IdempotencyKey: "invoice-1", ExtraColumns: map[string]any{"tenant": int64(12345678901234567)}})
			if err != nil {
				t.Fatalf("enqueue %d: %v", len(evs)+1, err)
			}
			evs = append(evs, ev)
		}
		n := b.count(t, fmt.Sprintf(`SELECT count(*) FROM %q`, schema.Table))
		if n != 1 || !evs[1].Duplicate || evs[1].Sequence != evs[0].Sequence {
			t.Fatalf("%d events stored, retry returned %+v, first seq %d", n, evs[1], evs[0].Sequence)
		}
	})
}

// TestBigintExtraRetryIsSame: on an unscoped table, retrying an enqueue with the same
// idempotency key and the same BIGINT extra column value returns the stored event (Duplicate),
// not an *IdempotencyConflictError.
func TestBigintExtraRetryIsSame(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		schema := b.table(t, func(c *outbox.SchemaConfig) {
			c.ExtraColumns = []outbox.Column{{Name: "tenant", Type: "BIGINT NULL"}}
		})
		pub := b.publisher(t, outbox.PublisherConfig{Schema: schema})
		for i := range 2 {
			ev, err := pub.Enqueue(ctx, outbox.EventInput{Topic: "invoices", Payload: 1, IdempotencyKey: "invoice-1", ExtraColumns: map[string]any{"tenant": int64(12345678901234567)}})
			if err != nil || ev.Duplicate != (i == 1) {
				t.Fatalf("enqueue %d: %+v, %v", i+1, ev, err)
			}
		}
	})
}

// TestBacklogUnavailableCountsHeldTopics: Backlog.Unavailable and BacklogByTopic count every
// pending event of each topic that has a pending event classed unavailable (the relay holds
// the whole topic while its destination is down), and nothing of a topic whose only
// unavailable event is delivered or dead-lettered, or whose events are classed otherwise;
// the same exact counts on every database.
func TestBacklogUnavailableCountsHeldTopics(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		schema := b.table(t)
		for _, tp := range []string{"a", "b", "c", "d"} {
			b.seed(t, schema, tp, map[string]int{"a": 5, "b": 3, "c": 2, "d": 3}[tp], []string{"k1", "k1", "", "k2", "k3"})
		}
		seq := func(topic string, nth int) int {
			return b.count(t, fmt.Sprintf(`SELECT sequence FROM %q WHERE topic = '%s' ORDER BY sequence LIMIT 1 OFFSET %d`, schema.Table, topic, nth))
		}
		set := func(topic string, nth int, assign string) {
			b.exec(t, fmt.Sprintf(`UPDATE %q SET %s WHERE sequence = %d`, schema.Table, assign, seq(topic, nth)))
		}
		set("a", 0, `last_error = 'unavailable: down', last_error_class = 'unavailable'`)
		set("a", 1, `last_error_class = 'unavailable', `+b.setPublished(b.at(0))) // delivered: not pending
		set("a", 4, `last_error_class = 'permanent', dead_lettered_at = `+b.at(0))
		set("b", 0, `last_error_class = 'unavailable', `+b.setPublished(b.at(0)))
		set("b", 1, `last_error = 'not attempted: eof', last_error_class = 'not_attempted'`)
		set("c", 0, `attempts = 1, last_error = 'unavailable: looks like one', last_error_class = 'failure'`)
		set("d", 1, `last_error_class = 'unavailable'`)
		set("d", 2, `last_error_class = 'unavailable'`)
		sub := b.newSub(t, fastCfg(schema))
		bl, err := sub.Backlog(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if bl.Pending != 10 || bl.Unavailable != 6 {
			t.Fatalf("Backlog pending %d, unavailable %d; want 10 and 6 (a: 3, d: 3)", bl.Pending, bl.Unavailable)
		}
		tb, err := sub.BacklogByTopic(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string][2]int64{}
		for _, r := range tb {
			got[r.Topic] = [2]int64{r.Pending, r.Unavailable}
		}
		want := map[string][2]int64{"a": {3, 3}, "b": {2, 0}, "c": {2, 0}, "d": {3, 3}}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("BacklogByTopic (pending, unavailable) %v, want %v", got, want)
		}
	})
}
