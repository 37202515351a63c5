package capture

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

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
	if schema.Dialect == outbox.DialectSQLite {
		return &outbox.ConfigError{Field: "SchemaConfig.Dialect", Reason: "SQLite has no transaction-local settings: use WithExtension", Err: ErrInvalid}
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
	if schema.Dialect == outbox.DialectPostgreSQL {
		if err := setExtension(ctx, tx, string(b)); err != nil {
			return err
		}
		fnErr := fn()
		if err := setExtension(context.WithoutCancel(ctx), tx, ""); err != nil && fnErr == nil {
			return err
		}
		return fnErr
	}
	var sets []string
	if len(ext.Headers) > 0 {
		h, _ := json.Marshal(ext.Headers)
		sets = append(sets, fmt.Sprintf(`"headers" = json_patch("headers", %s)`, quoteLiteral(string(h))))
	}
	if len(ext.Payload) > 0 {
		if tg.cfg.PayloadType == outbox.PayloadBytea {
			return &outbox.ConfigError{Field: "Extension.Payload", Reason: "a BYTEA outbox payload cannot take envelope keys on SQLite", Err: ErrInvalid}
		}
		expr := `"payload"`
		for _, k := range sortedKeys(ext.Payload) {
			v, err := json.Marshal(ext.Payload[k])
			if err != nil {
				return &outbox.ConfigError{Field: "Extension.Payload", Reason: err.Error(), Err: ErrInvalid}
			}
			path, _ := json.Marshal(k)
			expr = fmt.Sprintf("json_insert(%s, %s, json(%s))", expr, quoteLiteral("$."+string(path)), quoteLiteral(string(v)))
		}
		sets = append(sets, `"payload" = `+expr)
	}
	for _, k := range sortedKeys(ext.Columns) {
		v, err := json.Marshal(ext.Columns[k])
		if err != nil {
			return &outbox.ConfigError{Field: "Extension.Columns", Reason: err.Error(), Err: ErrInvalid}
		}
		sets = append(sets, fmt.Sprintf("%s = json_extract(%s, '$')", quoteIdent(k), quoteLiteral(string(v))))
	}
	if len(sets) == 0 {
		return fn()
	}
	name := quoteIdent("outbox_capture_extension_" + tg.parts[len(tg.parts)-1])
	return inTxOnly(ctx, tx, func(c conn) error {
		if err := c.exec(ctx, "DROP TRIGGER IF EXISTS temp."+name); err != nil {
			return fmt.Errorf("capture: set extension: %w", err)
		}
		ddl := fmt.Sprintf(`CREATE TEMP TRIGGER %s AFTER INSERT ON main.%s FOR EACH ROW BEGIN UPDATE %s SET %s WHERE "sequence" = NEW."sequence"; END`,
			name, tg.table, tg.table, strings.Join(sets, ", "))
		if err := c.exec(ctx, ddl); err != nil {
			return fmt.Errorf("capture: set extension: %w", err)
		}
		fnErr := fn()
		if err := c.exec(context.WithoutCancel(ctx), "DROP TRIGGER IF EXISTS temp."+name); err != nil && fnErr == nil {
			return fmt.Errorf("capture: clear extension: %w", err)
		}
		return fnErr
	})
}

// inTxOnly runs fn on the caller's transaction; any other handle is a *outbox.ConfigError
// (an extension outside a transaction would leak to whoever uses the connection next).
func inTxOnly(ctx context.Context, tx any, fn func(conn) error) error {
	if !isTx(tx) {
		return &outbox.ConfigError{Field: "tx", Reason: fmt.Sprintf("%T: want a pgx.Tx or *sql.Tx", tx), Err: outbox.ErrUnsupportedDB}
	}
	return inTx(ctx, tx, fn)
}
