package outbox_test

import (
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"

	"github.com/watermill-outbox/outbox"
)

// tenantSchema declares a tenant column; scope, when true, makes it the idempotency scope.
func tenantSchema(scope bool) func(*outbox.SchemaConfig) {
	return func(c *outbox.SchemaConfig) {
		c.ExtraColumns = []outbox.Column{{Name: "tenant", Type: "TEXT NULL"}}
		if scope {
			c.IdempotencyScope = []string{"tenant"}
		}
	}
}

func enqueue(t *testing.T, p *outbox.Publisher, tenant, key string) outbox.Event {
	t.Helper()
	in := outbox.EventInput{Topic: "invoices", Payload: map[string]string{"tenant": tenant}, IdempotencyKey: key}
	if tenant != "" {
		in.ExtraColumns = map[string]any{"tenant": tenant}
	}
	ev, err := p.Enqueue(ctx, in)
	if err != nil {
		t.Fatalf("enqueue %s/%s: %v", tenant, key, err)
	}
	return ev
}

// TestIdempotencyScope: two tenants reusing a key get two events and each its own on repeat;
// a key without its scope value is refused before SQL; concurrent same-tenant writers converge.
func TestIdempotencyScope(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		schema := b.table(t, tenantSchema(true))
		pub := b.publisher(t, outbox.PublisherConfig{Schema: schema})
		acme := enqueue(t, pub, "acme", "invoice-42")
		globex := enqueue(t, pub, "globex", "invoice-42")
		if acme.Duplicate || globex.Duplicate || acme.ID == globex.ID {
			t.Fatalf("first writes: acme %+v globex %+v", acme, globex)
		}
		for range 2 {
			if again := enqueue(t, pub, "acme", "invoice-42"); !again.Duplicate || again.ID != acme.ID || again.Sequence != acme.Sequence {
				t.Fatalf("acme repeat got %+v, want its own %s", again, acme.ID)
			}
			if again := enqueue(t, pub, "globex", "invoice-42"); !again.Duplicate || again.ID != globex.ID {
				t.Fatalf("globex repeat got %+v, want its own %s", again, globex.ID)
			}
		}
		// Through Publish with message metadata, several rows in one call: the same key for
		// two tenants, one of them twice in the call.
		var msgs []*message.Message
		for _, tn := range []string{"acme", "initech", "initech"} {
			m := outbox.NewMessage([]byte(`{}`))
			outbox.SetIdempotencyKey(m, "invoice-42")
			outbox.SetExtraColumns(m, map[string]any{"tenant": tn})
			msgs = append(msgs, m)
		}
		evs, err := pub.PublishEvents(ctx, "invoices", msgs...)
		if err != nil {
			t.Fatal(err)
		}
		if !evs[0].Duplicate || evs[0].ID != acme.ID {
			t.Fatalf("acme in a batch: %+v", evs[0])
		}
		if evs[1].Duplicate || evs[1].ID.String() != msgs[1].UUID || !evs[2].Duplicate || evs[2].ID != evs[1].ID {
			t.Fatalf("initech twice in one call: %+v / %+v", evs[1], evs[2])
		}
		if n := b.count(t, `SELECT count(*) FROM `+schema.Table+` WHERE idempotency_key = 'invoice-42'`); n != 3 {
			t.Fatalf("%d stored events of invoice-42, want 3 (acme, globex, initech)", n)
		}

		// A key without its tenant, or a NULL tenant, is refused before SQL.
		var ve *outbox.ValidationError
		for _, extra := range []map[string]any{nil, {"tenant": nil}} {
			_, err := pub.Enqueue(ctx, outbox.EventInput{Topic: "invoices", Payload: 1, IdempotencyKey: "k", ExtraColumns: extra})
			if !errors.As(err, &ve) || ve.Field != "idempotency_scope" || ve.Index != 0 {
				t.Fatalf("key without tenant %v: %v", extra, err)
			}
		}
		// No key: no scope needed.
		if _, err := pub.Enqueue(ctx, outbox.EventInput{Topic: "invoices", Payload: 1}); err != nil {
			t.Fatal(err)
		}

		// Concurrent writers of one tenant and key, each in its own transaction, converge on
		// one event; another tenant's writers on theirs.
		const writers = 6
		ids := make([]uuid.UUID, writers)
		var wg sync.WaitGroup
		errs := make(chan error, writers)
		for w := range writers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				tx, err := b.raw.BeginTx(ctx, nil)
				if err != nil {
					errs <- err
					return
				}
				defer tx.Rollback() //nolint:errcheck // after Commit a no-op
				p, err := outbox.NewPublisher(tx, outbox.PublisherConfig{Schema: schema}, nil)
				if err != nil {
					errs <- err
					return
				}
				ev, err := p.Enqueue(ctx, outbox.EventInput{Topic: "invoices", Payload: w, IdempotencyKey: "race", ExtraColumns: map[string]any{"tenant": []string{"acme", "globex"}[w%2]}})
				if err != nil {
					errs <- err
					return
				}
				ids[w] = ev.ID
				errs <- tx.Commit()
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		for w := 2; w < writers; w++ {
			if ids[w] != ids[w%2] {
				t.Fatalf("writer %d got %s, writer %d got %s: same tenant, two events", w, ids[w], w%2, ids[w%2])
			}
		}
		if ids[0] == ids[1] {
			t.Fatal("acme and globex writers share one event")
		}
		if n := b.count(t, `SELECT count(*) FROM `+schema.Table+` WHERE idempotency_key = 'race'`); n != 2 {
			t.Fatalf("%d stored events of key race, want 2", n)
		}
	})
}

// TestIdempotencyConflictUnscoped: without a scope the key stays global, and a repeat whose
// extra columns differ from the stored event's is an *IdempotencyConflictError, never the
// other tenant's event; the caller's transaction stays usable after EnqueueMany.
func TestIdempotencyConflictUnscoped(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		schema := b.table(t, tenantSchema(false))
		pub := b.publisher(t, outbox.PublisherConfig{Schema: schema})
		acme := enqueue(t, pub, "acme", "invoice-42")
		if again := enqueue(t, pub, "acme", "invoice-42"); !again.Duplicate || again.ID != acme.ID {
			t.Fatalf("acme repeat: %+v", again)
		}
		_, err := pub.Enqueue(ctx, outbox.EventInput{Topic: "invoices", Payload: 1, IdempotencyKey: "invoice-42", ExtraColumns: map[string]any{"tenant": "globex"}})
		var ce *outbox.IdempotencyConflictError
		if !errors.As(err, &ce) || !errors.Is(err, outbox.ErrIdempotencyConflict) || ce.Key != "invoice-42" || ce.Index != 0 || strings.Contains(err.Error(), acme.ID.String()) {
			t.Fatalf("globex reusing acme's key: %v", err)
		}
		// Through Publish, the second message of the call.
		m1, m2 := outbox.NewMessage([]byte(`1`)), outbox.NewMessage([]byte(`2`))
		outbox.SetIdempotencyKey(m1, "fresh")
		outbox.SetExtraColumns(m1, map[string]any{"tenant": "globex"})
		outbox.SetIdempotencyKey(m2, "invoice-42")
		outbox.SetExtraColumns(m2, map[string]any{"tenant": "globex"})
		tx, err := b.raw.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback() //nolint:errcheck // after Commit a no-op
		txPub := mustPublisher(t, tx, outbox.PublisherConfig{Schema: schema})
		if _, err := txPub.EnqueueMany(ctx, []outbox.EventInput{
			{Topic: "invoices", Payload: 1, IdempotencyKey: "fresh", ExtraColumns: map[string]any{"tenant": "globex"}},
			{Topic: "invoices", Payload: 2, IdempotencyKey: "invoice-42", ExtraColumns: map[string]any{"tenant": "globex"}},
		}); !errors.As(err, &ce) || ce.Index != 1 {
			t.Fatalf("EnqueueMany with a cross-tenant key: %v", err)
		}
		// The savepoint was rolled back: the transaction is usable and "fresh" is not stored.
		if _, err := txPub.Enqueue(ctx, outbox.EventInput{Topic: "invoices", Payload: 3, IdempotencyKey: "other", ExtraColumns: map[string]any{"tenant": "globex"}}); err != nil {
			t.Fatalf("transaction unusable after the conflict: %v", err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		if n := b.count(t, `SELECT count(*) FROM `+schema.Table+` WHERE idempotency_key IN ('fresh', 'other')`); n != 1 {
			t.Fatalf("%d events of fresh/other, want 1 (other)", n)
		}
		if _, err := pub.PublishEvents(ctx, "invoices", m1, m2); !errors.As(err, &ce) || ce.Index != 1 {
			t.Fatalf("Publish with a cross-tenant key: %v", err)
		}
	})
}

// TestIdempotencyScopeMigrate: Migrate refuses to change the idempotency index of an existing
// table (scope added, changed or removed); IdempotencyScopeMigrationSQL does it explicitly.
func TestIdempotencyScopeMigrate(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		global := b.table(t, tenantSchema(false))
		pub := b.publisher(t, outbox.PublisherConfig{Schema: global})
		acme := enqueue(t, pub, "acme", "invoice-42")
		scoped := global
		scoped.IdempotencyScope = []string{"tenant"}
		mismatch := func(cfg outbox.SchemaConfig, what string) {
			t.Helper()
			err := outbox.Migrate(ctx, b.db, cfg)
			if !errors.Is(err, outbox.ErrIdempotencyScopeMismatch) || !strings.Contains(err.Error(), "IdempotencyScopeMigrationSQL") {
				t.Fatalf("%s: Migrate returned %v, want ErrIdempotencyScopeMismatch naming the fix", what, err)
			}
			t.Logf("%s: %v", what, err)
		}
		mismatch(scoped, "scope added")
		stmts, err := outbox.IdempotencyScopeMigrationSQL(scoped)
		if err != nil {
			t.Fatal(err)
		}
		for _, st := range stmts {
			b.exec(t, st)
		}
		for range 2 {
			if err := outbox.Migrate(ctx, b.db, scoped); err != nil {
				t.Fatalf("Migrate after the explicit migration: %v", err)
			}
		}
		pub = b.publisher(t, outbox.PublisherConfig{Schema: scoped})
		if again := enqueue(t, pub, "acme", "invoice-42"); !again.Duplicate || again.ID != acme.ID {
			t.Fatalf("acme after migration: %+v", again)
		}
		if globex := enqueue(t, pub, "globex", "invoice-42"); globex.Duplicate {
			t.Fatalf("globex after migration: %+v", globex)
		}
		mismatch(global, "scope removed")
		wider := scoped
		wider.ExtraColumns = append(wider.ExtraColumns, outbox.Column{Name: "region", Type: "TEXT NULL"})
		wider.IdempotencyScope = []string{"tenant", "region"}
		mismatch(wider, "scope changed")
		// Back to a global key fails while two tenants share a key (the unique index cannot be
		// built) and changes nothing.
		stmts, err = outbox.IdempotencyScopeMigrationSQL(global)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.raw.ExecContext(ctx, stmts[0]); err == nil {
			t.Fatal("a global index over two tenants' shared key was built")
		}
		if b.dialect == outbox.DialectPostgreSQL {
			// A failed CREATE INDEX CONCURRENTLY leaves an invalid index behind: drop it.
			b.exec(t, `DROP INDEX IF EXISTS `+global.Table+`_idempotency_key_idx`)
		}
		mismatch(global, "scope removed, after the failed migration")
		if err := outbox.Migrate(ctx, b.db, scoped); err != nil {
			t.Fatalf("scoped table after the failed migration: %v", err)
		}
		// Config: a scope column must be an extra column.
		bad := global
		bad.IdempotencyScope = []string{"nope"}
		var cfgErr *outbox.ConfigError
		if err := bad.Validate(); !errors.As(err, &cfgErr) || cfgErr.Field != "SchemaConfig.IdempotencyScope[0]" {
			t.Fatalf("unknown scope column: %v", err)
		}
		sql, err := outbox.SchemaSQL(scoped)
		want := `("tenant", "idempotency_key") WHERE "idempotency_key" IS NOT NULL`
		if b.dialect == outbox.DialectMySQL {
			want = "UNIQUE INDEX `" + scoped.Table + "_idempotency_scope_idx` (`tenant`, `idempotency_key`)"
		}
		if err != nil || !strings.Contains(sql, want) {
			t.Fatalf("SchemaSQL: %v\n%s", err, sql)
		}
	})
}
