package capture

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/watermill-outbox/outbox"
)

// Extension is a set of values attached to every event captured in a scope of a transaction
// (see WithExtension and SetExtension): headers (the author of a change, a request id), top-
// level envelope keys, and values of the outbox's extra columns (SchemaConfig.ExtraColumns).
// Table.Extend's SQL expressions win over an Extension's payload keys; the envelope's own keys
// cannot be set.
type Extension struct {
	// Headers are added to every event's headers (they win over Table.Extend.Headers of the
	// same name on PostgreSQL, are merged last on SQLite).
	Headers map[string]string
	// Payload adds top-level envelope keys, each value encoded with encoding/json; an
	// envelope key ("table", "pk", …) is a *outbox.ConfigError.
	Payload map[string]any
	// Columns fills extra columns by name. On PostgreSQL, when Columns is set, every extra
	// column that Table.Extend does not fill is written from it (NULL when missing).
	Columns map[string]any
}

// prepare checks e against schema and returns the outbox table and e as the JSON the
// PostgreSQL triggers read.
func (e Extension) prepare(schema outbox.SchemaConfig) (*target, []byte, error) {
	tg, err := newTarget(schema)
	if err != nil {
		return nil, nil, err
	}
	b, err := e.encode(tg)
	return tg, b, err
}

func (e Extension) encode(tg *target) ([]byte, error) {
	for k := range e.Payload {
		if slices.Contains(envelopeKeys, k) || k == "" {
			return nil, &outbox.ConfigError{Field: "Extension.Payload", Reason: fmt.Sprintf("key %q is an envelope key", k), Err: ErrInvalid}
		}
	}
	for k := range e.Columns {
		if !slices.Contains(tg.extras, k) {
			return nil, &outbox.ConfigError{Field: "Extension.Columns", Reason: fmt.Sprintf("%q is not one of SchemaConfig.ExtraColumns", k), Err: ErrInvalid}
		}
	}
	m := map[string]any{}
	if len(e.Headers) > 0 {
		m["headers"] = e.Headers
	}
	if len(e.Payload) > 0 {
		m["payload"] = e.Payload
	}
	if len(e.Columns) > 0 {
		m["columns"] = e.Columns
	}
	return json.Marshal(m)
}

// SetExtension attaches ext to every event captured later in the transaction tx (a pgx.Tx or
// *sql.Tx of PostgreSQL) until it commits or rolls back: it sets the transaction-local setting
// outbox.capture_extension (set_config(…, true)) that the triggers read. A later call replaces
// the earlier one. SQLite has no transaction-local settings: use WithExtension there.
func SetExtension(ctx context.Context, tx any, schema outbox.SchemaConfig, ext Extension) error {
	if be, ok := backends[schema.Dialect]; ok && !be.txSettings() {
		return &outbox.ConfigError{Field: "SchemaConfig.Dialect", Reason: be.title() + " has no transaction-local settings: use WithExtension", Err: ErrInvalid}
	}
	_, b, err := ext.prepare(schema)
	if err != nil {
		return err
	}
	return setExtension(ctx, tx, string(b))
}

func setExtension(ctx context.Context, tx any, val string) error {
	return inTxOnly(ctx, tx, func(c conn) error {
		if _, err := queryStrings(ctx, c, `SELECT set_config('`+pgExtSetting+`', $1, true)`, val); err != nil {
			return fmt.Errorf("capture: set extension: %w", err)
		}
		return nil
	})
}

// WithExtension runs fn with ext attached to every event written to the outbox in tx while fn
// runs (captured ones, and on SQLite also the Publisher's), then detaches it, also when fn
// fails. tx is a pgx.Tx or *sql.Tx; fn must use tx. On SQLite it installs a temporary
// trigger on the outbox table for the duration of fn (temporary objects are private to the
// connection and roll back with the transaction).
func WithExtension(ctx context.Context, tx any, schema outbox.SchemaConfig, ext Extension, fn func() error) error {
	tg, b, err := ext.prepare(schema)
	if err != nil {
		return err
	}
	return tg.be.withExtension(ctx, tx, tg, ext, b, fn)
}

// inTxOnly runs fn on the caller's transaction; any other handle is a *outbox.ConfigError
// (an extension outside a transaction would leak to whoever uses the connection next).
func inTxOnly(ctx context.Context, tx any, fn func(conn) error) error {
	if !isTx(tx) {
		return &outbox.ConfigError{Field: "tx", Reason: fmt.Sprintf("%T: want a pgx.Tx or *sql.Tx", tx), Err: outbox.ErrUnsupportedDB}
	}
	return inTx(ctx, tx, fn)
}
