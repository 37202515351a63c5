package outbox

import (
	"errors"
	"fmt"
	"github.com/watermill-outbox/outbox/internal/dialect"
	"slices"
)

// This file holds the multi-tenant side of the idempotency key (SchemaConfig.IdempotencyScope):
// the scoped unique index, the check that Migrate never swaps it silently, and the read-back of
// stored events by (scope, key) that never hands one tenant another tenant's event.

// compileScope checks SchemaConfig.IdempotencyScope against the declared extra columns.
func (s *schema) compileScope() error {
	for i, name := range s.cfg.IdempotencyScope {
		field := fmt.Sprintf("SchemaConfig.IdempotencyScope[%d]", i)
		if !s.extra[name] {
			return &ConfigError{Field: field, Reason: fmt.Sprintf("column %q is not declared in SchemaConfig.ExtraColumns", name)}
		}
		if slices.Index(s.cfg.IdempotencyScope, name) != i {
			return &ConfigError{Field: field, Reason: fmt.Sprintf("column %q named twice", name)}
		}
	}
	return nil
}

// scoped reports whether idempotency keys are unique per scope rather than per table.
func (s *schema) scoped() bool { return len(s.cfg.IdempotencyScope) > 0 }

// migrateError maps a dialect's scope mismatch to ErrIdempotencyScopeMismatch.
func migrateError(err error) error {
	var sm *dialect.ScopeMismatch
	if errors.As(err, &sm) {
		return fmt.Errorf("%w: %s", ErrIdempotencyScopeMismatch, sm.Reason)
	}
	return err
}

// IdempotencyScopeMigrationSQL returns the statements that move an existing outbox table to
// the idempotency index cfg describes (SchemaConfig.IdempotencyScope set, changed or removed),
// one per element, for an operator to run one by one, in order, outside a transaction:
//
//  1. build the new unique index (on PostgreSQL CONCURRENTLY, which does not block writers;
//     with a scope under a temporary name). It fails if stored events already break the new
//     uniqueness (two tenants' events sharing a key, going back to a global key); on
//     PostgreSQL drop the INVALID index it leaves before trying again;
//  2. drop the old idempotency index (on PostgreSQL CONCURRENTLY);
//  3. with a scope, give the new index its final name (SQLite: build it again and drop the
//     temporary one).
//
// Deploy Publishers with the new config after step 1: while both indexes exist Publishers of
// either config work (each ON CONFLICT names its own index's columns). Migrate refuses a
// config whose index does not match the table's (ErrIdempotencyScopeMismatch) until the last
// step is done. Errors: a *ConfigError for an invalid config. It runs no SQL.
func IdempotencyScopeMigrationSQL(cfg SchemaConfig) ([]string, error) {
	s, err := cfg.compile()
	if err != nil {
		return nil, err
	}
	return s.d.ScopeMigration(s.t)
}

// checkScope refuses, before any SQL, an event with an idempotency key whose scope columns
// are missing or NULL (the unique index would not hold it: NULLs never conflict).
func (s *schema) checkScope(i int, ikey *string, extra map[string]any) error {
	if ikey == nil {
		return nil
	}
	for _, c := range s.cfg.IdempotencyScope {
		if v, ok := extra[c]; !ok || encodesNull(v) {
			return &ValidationError{Index: i, Field: "idempotency_scope", Reason: fmt.Sprintf("idempotency key %q set without a value for scope column %q (SchemaConfig.IdempotencyScope): set it in ExtraColumns", *ikey, c)}
		}
	}
	return nil
}

// encodesNull reports whether v is stored as NULL: nil, a nil pointer, map or slice, a JSON
// null, anything EncodePayload writes as null.
func encodesNull(v any) bool {
	if v == nil {
		return true
	}
	b, err := EncodePayload(v)
	return err == nil && string(b) == "null"
}
