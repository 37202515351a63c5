package sqlite

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/watermill-outbox/outbox/internal/dialect"
)

// maxRowsPerInsert keeps one INSERT below SQLite's default limit of 32766 parameters.
const maxRowsPerInsert = 500

// Insert implements dialect.Dialect: multi-row INSERT … ON CONFLICT DO NOTHING RETURNING
// statements (in one transaction when the handle is not one), then the read-back of events
// whose idempotency key already existed (dialect.OnePerRow): one Stored per row. SQLite's
// single writer gives per-key commit order without locks.
func (d Dialect) Insert(ctx context.Context, ex dialect.Executor, p *dialect.InsertParams) ([]dialect.Stored, error) {
	out, err := d.insert(ctx, ex, p)
	if err != nil {
		return nil, err
	}
	return dialect.OnePerRow(ctx, d, ex, p, out)
}

// insert runs the INSERT statements and returns the events they inserted.
func (Dialect) insert(ctx context.Context, ex dialect.Executor, p *dialect.InsertParams) ([]dialect.Stored, error) {
	t := p.Table
	now := micros(time.Now())
	var out []dialect.Stored
	run := func(ex dialect.Executor) error {
		for start := 0; start < len(p.Rows); start += maxRowsPerInsert {
			chunk := p.Rows[start:min(start+maxRowsPerInsert, len(p.Rows))]
			var b strings.Builder
			fmt.Fprintf(&b, `INSERT INTO %s ("id", "topic", "payload", "headers", "ordering_key", "idempotency_key", "created_at"`, quote(t))
			for _, c := range p.ExtraNames {
				b.WriteString(", " + dialect.DoubleQuote(c))
			}
			b.WriteString(") VALUES ")
			args := make([]any, 0, len(chunk)*(7+len(p.ExtraNames)))
			for i, r := range chunk {
				if i > 0 {
					b.WriteString(", ")
				}
				var payload any = r.Payload
				if t.Payload.IsJSON() {
					payload = string(r.Payload) // TEXT: json_valid reads a BLOB as JSONB
				}
				b.WriteString("(" + param(&args, r.ID) + ", " + param(&args, r.Topic) + ", " + param(&args, payload) + ", " +
					param(&args, r.Headers) + ", " + param(&args, r.OrderingKey) + ", " + param(&args, r.IdempotencyKey) + ", " + param(&args, now))
				if len(p.ExtraNames) > 0 {
					// The same JSON encoding as PostgreSQL's jsonb_populate_record reads: each
					// column takes its value's SQL form (objects and arrays as JSON text).
					var extra any
					if r.Extra != nil {
						extra = *r.Extra
					}
					ph := param(&args, extra)
					for _, c := range p.ExtraNames {
						fmt.Fprintf(&b, `, %s ->> '$."%s"'`, ph, c)
					}
				}
				b.WriteString(")")
			}
			b.WriteString(` ON CONFLICT (` + dialect.IdempotencyColumns(t) + `) WHERE "idempotency_key" IS NOT NULL DO NOTHING RETURNING "sequence", "id", "topic", "ordering_key", "idempotency_key", "created_at"`)
			rs, err := ex.Query(ctx, b.String(), args...)
			if err != nil {
				return err
			}
			st, err := dialect.ScanStoredRows(rs)
			if err != nil {
				return err
			}
			out = append(out, st...)
		}
		return nil
	}
	// (out is read after run returns: Go leaves the order of `return out, run(ex)`'s operands
	// unspecified.)
	switch {
	case !ex.InTx():
		// The Publisher's own write (not the caller's transaction): in the process's turn.
		err := inTurn(ctx, ex, func() error {
			if len(p.Rows) <= maxRowsPerInsert {
				return run(ex)
			}
			return dialect.WithTx(ctx, ex, nil, run)
		})
		return out, err
	case len(p.Rows) <= maxRowsPerInsert:
		err := run(ex)
		return out, err
	}
	// Several statements in the caller's transaction: a failed one does not abort a SQLite
	// transaction, so the chunks before it are undone here, or a caller committing after the
	// error would commit part of the events.
	if _, err := ex.Exec(ctx, "SAVEPOINT outbox_insert"); err != nil {
		return nil, err
	}
	if err := run(ex); err != nil {
		if _, rbErr := ex.Exec(context.WithoutCancel(ctx), "ROLLBACK TO SAVEPOINT outbox_insert"); rbErr != nil {
			return nil, errors.Join(err, fmt.Errorf("rollback to savepoint: %w", rbErr))
		}
		_, _ = ex.Exec(context.WithoutCancel(ctx), "RELEASE SAVEPOINT outbox_insert")
		return nil, err
	}
	_, err := ex.Exec(ctx, "RELEASE SAVEPOINT outbox_insert")
	return out, err
}

// ReadStored implements dialect.Dialect.
func (Dialect) ReadStored(ctx context.Context, ex dialect.Executor, t *dialect.Table, keys []string) ([]dialect.Stored, error) {
	rs, err := ex.Query(ctx, `SELECT "sequence", "id", "topic", "ordering_key", "idempotency_key", "created_at" FROM `+quote(t)+` WHERE "idempotency_key" IN (SELECT value FROM json_each($1))`, dialect.JSONList(keys))
	if err != nil {
		return nil, err
	}
	return dialect.ScanStoredRows(rs)
}

// ResolveScoped implements dialect.Dialect (see the PostgreSQL dialect's): the probes are a
// JSON array read with json_each; an extra column agrees when the probe does not set it or
// holds the same value (IS).
func (Dialect) ResolveScoped(ctx context.Context, ex dialect.Executor, t *dialect.Table, probes []dialect.Probe) ([]dialect.Resolved, error) {
	val := func(c string) string { return fmt.Sprintf(`(j.value ->> '$.e."%s"')`, c) }
	match, same := dialect.ResolveConds(t, func(c string) string { return dialect.DoubleQuote(c) }, val, func(col dialect.Column) string {
		return fmt.Sprintf(`(json_type(j.value, '$.e."%s"') IS NULL OR o.%s IS %s)`, col.Name, dialect.DoubleQuote(col.Name), val(col.Name))
	}, "1")
	rs, err := ex.Query(ctx, fmt.Sprintf(`SELECT j.value ->> '$.o', o."sequence", o."id", o."topic", o."ordering_key", o."idempotency_key", o."created_at", %s FROM json_each($1) j JOIN %s o ON o."idempotency_key" = (j.value ->> '$.k')%s`,
		same, quote(t), match), dialect.JSONList(probes))
	if err != nil {
		return nil, err
	}
	return dialect.ScanResolved(rs)
}
