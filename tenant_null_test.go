package outbox_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"testing"

	"github.com/watermill-outbox/outbox"
)

// TestScopeNullValueRefused: a scope value that is stored as NULL (a nil pointer, a JSON null)
// with an idempotency key is a *ValidationError (idempotency_scope) before any SQL, like an
// untyped nil (README, multi-tenant outboxes): NULLs never conflict, and the key was stored
// twice.
func TestScopeNullValueRefused(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		schema := b.table(t, tenantSchema(true))
		pub := b.publisher(t, outbox.PublisherConfig{Schema: schema})
		var nilTenant *string
		for i, v := range []any{nilTenant, json.RawMessage("null")} {
			key := fmt.Sprintf("invoice-null-%d", i)
			var errs []error
			for range 2 {
				_, err := pub.Enqueue(ctx, outbox.EventInput{Topic: "invoices", Payload: 1, IdempotencyKey: key, ExtraColumns: map[string]any{"tenant": v}})
				errs = append(errs, err)
			}
			n := b.count(t, `SELECT count(*) FROM `+schema.Table+` WHERE idempotency_key = '`+key+`'`)
			var ve *outbox.ValidationError
			if !errors.As(errs[0], &ve) || ve.Field != "idempotency_scope" || n != 0 {
				t.Errorf("tenant %#v: errors %v, %d events stored under key %q; want a ValidationError (idempotency_scope) and none", v, errs, n, key)
			}
		}
	})
}
