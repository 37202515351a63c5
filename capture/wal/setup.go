package wal

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/capture"
)

// ErrSlotLost is the sentinel of a *SlotError (errors.Is).
var ErrSlotLost = errors.New("wal: replication slot lost")

// SlotError reports a slot the source cannot read: missing (dropped, or never created on this
// server: a promoted standby has no copy of a primary's slot before PostgreSQL 17's failover
// slots), or invalidated because it retained more than max_slot_wal_keep_size (wal_status
// "lost"). The changes between the slot's last confirmed position and now are not in any slot:
// see the package doc, "Recovery".
type SlotError struct {
	Slot   string
	Reason string
	Err    error // the server's error, when there is one
}

func (e *SlotError) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("wal: slot %q: %s: %v", e.Slot, e.Reason, e.Err)
	}
	return fmt.Sprintf("wal: slot %q: %s", e.Slot, e.Reason)
}

// Is reports ErrSlotLost.
func (e *SlotError) Is(target error) bool { return target == ErrSlotLost }

// Unwrap returns the server's error.
func (e *SlotError) Unwrap() error { return e.Err }

// slotErr turns the server's refusals to stream a slot into a *SlotError: 42704 (the slot
// does not exist) and 55000 (it can no longer get changes: invalidated).
func slotErr(slot string, err error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch pe.Code {
		case "42704":
			return &SlotError{Slot: slot, Reason: "missing", Err: err}
		case "55000":
			return &SlotError{Slot: slot, Reason: "invalidated", Err: err}
		}
	}
	return err
}

// SlotStatus is a slot's row of pg_replication_slots with the server's current position.
type SlotStatus struct {
	Slot   string
	Exists bool
	// Active: a connection streams the slot now.
	Active bool
	// WALStatus is pg_replication_slots.wal_status: "reserved", "extended", "unreserved" or
	// "lost".
	WALStatus string
	// RestartLSN and ConfirmedFlushLSN are the slot's positions; CurrentLSN is
	// pg_current_wal_lsn().
	RestartLSN, ConfirmedFlushLSN, CurrentLSN uint64
	// LagBytes is CurrentLSN - ConfirmedFlushLSN: the log not yet delivered or parked.
	LagBytes int64
	// RetainedBytes is CurrentLSN - RestartLSN: the WAL the slot keeps on the server's disk.
	RetainedBytes int64
	// SafeWALSize is pg_replication_slots.safe_wal_size: the bytes that can still be written
	// before the slot is invalidated by max_slot_wal_keep_size; -1 when unbounded.
	SafeWALSize int64
}

func (st SlotStatus) usable() error {
	switch {
	case !st.Exists:
		return &SlotError{Slot: st.Slot, Reason: "missing (run wal.Setup or \"outbox capture wal setup\")"}
	case st.WALStatus == "lost":
		return &SlotError{Slot: st.Slot, Reason: "invalidated (wal_status lost: it retained more than max_slot_wal_keep_size)"}
	}
	return nil
}

// Status reads slot's status. A missing slot is a SlotStatus with Exists false, not an error.
func Status(ctx context.Context, pool *pgxpool.Pool, slot string) (SlotStatus, error) {
	st := SlotStatus{Slot: slot}
	var restart, confirmed, current pglsn
	err := pool.QueryRow(ctx, `SELECT true, active, coalesce(wal_status, ''), restart_lsn::text, confirmed_flush_lsn::text, pg_current_wal_lsn()::text,
  coalesce(pg_current_wal_lsn() - confirmed_flush_lsn, 0)::int8, coalesce(pg_current_wal_lsn() - restart_lsn, 0)::int8, coalesce(safe_wal_size, -1)::int8
FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&st.Exists, &st.Active, &st.WALStatus, &restart, &confirmed, &current, &st.LagBytes, &st.RetainedBytes, &st.SafeWALSize)
	if errors.Is(err, pgx.ErrNoRows) {
		return st, nil
	}
	if err != nil {
		return st, fmt.Errorf("wal: read slot %q: %w", slot, err)
	}
	st.RestartLSN, st.ConfirmedFlushLSN, st.CurrentLSN = uint64(restart), uint64(confirmed), uint64(current)
	return st, nil
}

// pglsn scans an LSN's text (NULL as 0).
type pglsn uint64

func (l *pglsn) Scan(src any) error {
	switch v := src.(type) {
	case nil:
		*l = 0
		return nil
	case string:
		var hi, lo uint64
		if _, err := fmt.Sscanf(v, "%X/%X", &hi, &lo); err != nil {
			return fmt.Errorf("wal: LSN %q: %w", v, err)
		}
		*l = pglsn(hi<<32 | lo)
		return nil
	}
	return fmt.Errorf("wal: LSN of type %T", src)
}

// resolveTables reads each declared table's schema, name and key columns.
func resolveTables(ctx context.Context, pool *pgxpool.Pool, tables []capture.Table, names []*capture.Names) (map[string]*declared, error) {
	out := map[string]*declared{}
	for i, t := range tables {
		d := &declared{table: t, names: names[i]}
		var pk []string
		err := pool.QueryRow(ctx, `SELECT n.nspname::text, c.relname::text,
  coalesce((SELECT array_agg(a.attname::text ORDER BY k.ord) FROM pg_index x CROSS JOIN LATERAL unnest(x.indkey) WITH ORDINALITY k(attnum, ord)
    JOIN pg_attribute a ON a.attrelid = x.indrelid AND a.attnum = k.attnum WHERE x.indrelid = c.oid AND x.indisprimary), '{}')
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass($1) AND c.relkind IN ('r', 'p')`,
			pgx.Identifier(strings.Split(t.Name, ".")).Sanitize()).Scan(&d.schema, &d.name, &pk)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil, &outbox.ConfigError{Field: fmt.Sprintf("wal.Config.Tables[%d].Name", i), Reason: fmt.Sprintf("no table %q", t.Name), Err: capture.ErrUnknownTable}
		}
		if err != nil {
			return nil, fmt.Errorf("wal: read catalog of %s: %w", t.Name, err)
		}
		d.key = t.Key
		if len(d.key) == 0 {
			d.key = pk
		}
		if len(d.key) == 0 && names[i].Keyed() {
			return nil, &outbox.ConfigError{Field: fmt.Sprintf("wal.Config.Tables[%d].Key", i), Reason: fmt.Sprintf("%s.%s has no primary key: set Key or Unordered", d.schema, d.name), Err: capture.ErrNoPrimaryKey}
		}
		out[d.schema+"."+d.name] = d
	}
	return out, nil
}

// SetupSQL returns the statements Setup runs, for a migration tool: REPLICA IDENTITY FULL on
// each table (UPDATE and DELETE then log the whole old row, so "changed", "before" and
// unchanged TOAST values are known), the publication (publish_via_partition_root, so a
// partition's changes carry the partitioned table's name) and the slot. Run the slot's
// statement outside a transaction that has written anything.
func SetupSQL(cfg Config) (string, error) {
	if _, err := cfg.names(); err != nil {
		return "", err
	}
	cfg = cfg.withDefaults()
	var b strings.Builder
	var list []string
	for _, t := range cfg.Tables {
		q := pgx.Identifier(strings.Split(t.Name, ".")).Sanitize()
		list = append(list, q)
		fmt.Fprintf(&b, "ALTER TABLE %s REPLICA IDENTITY FULL;\n", q)
	}
	fmt.Fprintf(&b, "CREATE PUBLICATION %s FOR TABLE %s WITH (publish_via_partition_root = true);\n", pgx.Identifier{cfg.Publication}.Sanitize(), strings.Join(list, ", "))
	fmt.Fprintf(&b, "SELECT pg_create_logical_replication_slot('%s', 'pgoutput');\n", cfg.Slot)
	return b.String(), nil
}

// Setup creates or updates what the source needs, idempotently: REPLICA IDENTITY FULL on the
// captured tables, the publication with exactly cfg's tables, and the slot when missing. It
// refuses a server without wal_level = logical. The role needs the REPLICATION attribute (or
// rds_replication on Amazon RDS, cloudsqlsuperuser on Cloud SQL, azure_pg_admin on Azure)
// and ownership of the tables. A slot created now starts at the current position: changes
// committed before it are not streamed.
func Setup(ctx context.Context, pool *pgxpool.Pool, cfg Config) error {
	names, err := cfg.names()
	if err != nil {
		return err
	}
	cfg = cfg.withDefaults()
	if err := checkLevel(ctx, pool); err != nil {
		return err
	}
	decls, err := resolveTables(ctx, pool, cfg.Tables, names)
	if err != nil {
		return err
	}
	var list []string
	for _, d := range decls {
		q := pgx.Identifier{d.schema, d.name}.Sanitize()
		list = append(list, q)
		if _, err := pool.Exec(ctx, "ALTER TABLE "+q+" REPLICA IDENTITY FULL"); err != nil {
			return fmt.Errorf("wal: replica identity of %s: %w", q, err)
		}
	}
	pub := pgx.Identifier{cfg.Publication}.Sanitize()
	var exists bool
	if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_publication WHERE pubname = $1)`, cfg.Publication).Scan(&exists); err != nil {
		return fmt.Errorf("wal: read publication: %w", err)
	}
	stmts := []string{fmt.Sprintf("CREATE PUBLICATION %s FOR TABLE %s WITH (publish_via_partition_root = true)", pub, strings.Join(list, ", "))}
	if exists {
		stmts = []string{fmt.Sprintf("ALTER PUBLICATION %s SET TABLE %s", pub, strings.Join(list, ", ")),
			fmt.Sprintf("ALTER PUBLICATION %s SET (publish_via_partition_root = true)", pub)}
	}
	for _, q := range stmts {
		if _, err := pool.Exec(ctx, q); err != nil {
			return fmt.Errorf("wal: %s: %w", q, err)
		}
	}
	return ensureSlot(ctx, pool, cfg.Slot)
}

// Drop removes the slot (which releases its retained WAL) and the publication. A slot in use
// by a running source is refused by the server (55006). The tables keep REPLICA IDENTITY FULL.
func Drop(ctx context.Context, pool *pgxpool.Pool, cfg Config) error {
	cfg = cfg.withDefaults()
	return dropSlot(ctx, pool, cfg.Slot, cfg.Publication)
}
