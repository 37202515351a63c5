package mysql

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strings"

	"github.com/go-sql-driver/mysql"

	"github.com/watermill-outbox/outbox/internal/dialect"
)

// maxInsertRows caps the rows of one INSERT statement (and of one key-lock statement); a
// statement has at most 65,535 parameters.
const maxInsertRows = 1000

// storedCols are the columns of a dialect.Stored, in scanStored's order.
const storedCols = "o.`sequence`, o.`id`, o.`topic`, o.`ordering_key`, o.`idempotency_key`, CAST(o.`created_at` AS CHAR)"

// Insert writes p.Rows in the caller's transaction (or in one of its own, READ COMMITTED, when
// ex is a *sql.DB or *sql.Conn) and returns one Stored per row, in input order: the inserted
// event, or, for a row whose idempotency key is already stored (in its scope), that event
// with Duplicate set.
//
// Per-key commit order: before the event INSERT, one statement
// INSERT INTO <table>_keys … ON DUPLICATE KEY UPDATE takes an exclusive lock on the row of
// each distinct ordering key's stripe (see lockStripes), in sorted key order (InnoDB X-locks the row it finds a duplicate of,
// and the row it inserts), held until the transaction ends. A second transaction writing one
// of those keys waits in that statement, before its event INSERT draws a sequence value, so
// one key's events commit in sequence order (TestPerKeyCommitOrder: 0 reorders). Writers that
// take several keys in separate calls of one transaction should take them in one order: two
// transactions taking two keys in opposite orders deadlock, and InnoDB then rolls back one
// whole transaction (error 1213).
//
// Idempotency keys: the key's stripe of the key-lock table is locked first (see lockKeys), then
// stored events are read (a plain read: a retried write draws no sequence value); the rest is
// inserted with
// ON DUPLICATE KEY UPDATE `id` = IF(<same idempotency key and scope>, `id`, <invalid id>),
// so a key stored concurrently meanwhile is a no-op on that row, while a conflict on the event
// id alone fails the id's CHECK constraint (ErrDuplicateEventID) instead of being absorbed
// the way INSERT IGNORE would absorb it (and every other error of the row with it). Rows that
// hit a concurrent key are read again with FOR UPDATE (the latest committed version, visible
// also in a REPEATABLE READ snapshot; the lock is held already).
//
// Errors: an error of one statement (a duplicate event id, a CHECK or a too-long value, a
// lock wait timeout) rolls back that statement only and leaves the caller's transaction
// usable; with more than maxInsertRows rows the statements run in a savepoint, rolled back on
// error. A deadlock (1213) rolls back the caller's whole transaction (InnoDB).
func (d *Dialect) Insert(ctx context.Context, ex dialect.Executor, p *dialect.InsertParams) ([]dialect.Stored, error) {
	if len(p.Rows) == 0 {
		return nil, nil
	}
	if p.Notify != "" {
		return nil, ErrNoNotify
	}
	var out []dialect.Stored
	err := inTx(ctx, ex, sql.LevelReadCommitted, func(q querier) error {
		var err error
		out, err = insert(ctx, q, p, !d.noKeyLocks)
		return err
	})
	return out, err
}

func insert(ctx context.Context, q querier, p *dialect.InsertParams, keyLocks bool) ([]dialect.Stored, error) {
	t, n := p.Table, namesOf(p.Table)
	if keyLocks {
		if err := lockKeys(ctx, q, n, p.Rows); err != nil {
			return nil, fmt.Errorf("lock ordering keys: %w", err)
		}
	}
	out := make([]dialect.Stored, len(p.Rows))
	done := make([]bool, len(p.Rows))
	// Stored events of the rows' idempotency keys.
	var probes []dialect.Probe
	for i, r := range p.Rows {
		if r.IdempotencyKey != nil {
			pr, err := probeOf(i, r, t)
			if err != nil {
				return nil, err
			}
			probes = append(probes, pr)
		}
	}
	if len(probes) > 0 {
		found, err := resolve(ctx, q, t, probes, false)
		if err != nil {
			return nil, fmt.Errorf("read stored events: %w", err)
		}
		if err := conflict(found, probes); err != nil {
			return nil, err
		}
		for _, f := range found {
			out[f.Index], done[f.Index] = f.Stored, true
		}
	}
	var todo []int
	for i := range p.Rows {
		if !done[i] {
			todo = append(todo, i)
		}
	}
	if len(todo) == 0 {
		return out, nil
	}
	chunks := (len(todo) + maxInsertRows - 1) / maxInsertRows
	if chunks > 1 {
		// A failed statement rolls back only itself: the chunks before it would otherwise stay.
		if _, err := q.exec(ctx, "SAVEPOINT outbox_insert"); err != nil {
			return nil, err
		}
	}
	for c := 0; c < chunks; c++ {
		part := todo[c*maxInsertRows : min((c+1)*maxInsertRows, len(todo))]
		if err := insertRows(ctx, q, p, part, out, done); err != nil {
			if chunks > 1 {
				if _, rbErr := q.exec(context.WithoutCancel(ctx), "ROLLBACK TO SAVEPOINT outbox_insert"); rbErr != nil {
					return nil, errors.Join(err, fmt.Errorf("rollback to savepoint: %w", rbErr))
				}
			}
			return nil, err
		}
	}
	if chunks > 1 {
		if _, err := q.exec(ctx, "RELEASE SAVEPOINT outbox_insert"); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// lockStripes is how many key-lock rows the companion table holds per namespace: an ordering
// key or an idempotency key locks the row of its stripe (FNV-1a of the key, modulo
// lockStripes), so the table stays bounded whatever the number of keys, one key always locks
// the same row, and two writers of different keys wait for each other only when their keys
// share a stripe (1 in 4,096 per pair of concurrent transactions). Migrate creates every row
// (2 × 4,096): a row created by a writer whose transaction then rolled back, while two others
// waited on it, made one of those fail with a deadlock (InnoDB: the waiters' shared locks on
// the vanished row both turn exclusive; found by the MariaDB writers chaos cell); on existing
// rows the writers wait for an exclusive lock and take it in turn.
const lockStripes = 1 << 12

// lockNamespaces are the stripe namespaces: ordering keys and idempotency keys.
var lockNamespaces = []string{"i", "o"}

// stripe returns the key-lock row of key in namespace ns ("o" ordering, "i" idempotency).
func stripe(ns, key string) string {
	h := fnv.New32a()
	h.Write([]byte(key))
	return fmt.Sprintf("%s:%05d", ns, h.Sum32()%lockStripes)
}

// lockKeys X-locks the key-lock rows of the rows' ordering keys and idempotency keys, in
// sorted order, in one statement, until the transaction ends.
//
// Ordering keys: per-key commit order (see Insert). Idempotency keys: two transactions
// inserting one idempotency key would otherwise meet in the unique index, where InnoDB's
// waiting inserters deadlock each other (1213, which rolls back a caller's whole
// transaction: 6 concurrent writers of one key hit it within a few runs); serialised here,
// the second finds the first one's committed event instead.
func lockKeys(ctx context.Context, q querier, n names, rows []dialect.InsertRow) error {
	var keys []string
	for _, r := range rows {
		if r.OrderingKey != nil {
			keys = append(keys, stripe("o", *r.OrderingKey))
		}
		if r.IdempotencyKey != nil {
			keys = append(keys, stripe("i", *r.IdempotencyKey))
		}
	}
	if len(keys) == 0 {
		return nil
	}
	slices.Sort(keys) // one order for every writer
	keys = slices.Compact(keys)
	for start := 0; start < len(keys); start += maxInsertRows {
		part := keys[start:min(start+maxInsertRows, len(keys))]
		args := make([]any, len(part))
		for i, k := range part {
			args[i] = k
		}
		stmt := "INSERT INTO " + n.keys + " (`ordering_key`) VALUES " + strings.TrimSuffix(strings.Repeat("(?), ", len(part)), ", ") +
			" ON DUPLICATE KEY UPDATE `ordering_key` = `ordering_key`"
		if _, err := q.exec(ctx, stmt, args...); err != nil {
			return err
		}
	}
	return nil
}

// insertRows inserts the rows idx of p in one statement and fills out and done for them.
func insertRows(ctx context.Context, q querier, p *dialect.InsertParams, idx []int, out []dialect.Stored, done []bool) error {
	t, n := p.Table, namesOf(p.Table)
	var b strings.Builder
	b.WriteString("INSERT INTO " + n.table + " (`id`, `topic`, `payload`, `headers`, `ordering_key`, `idempotency_key`")
	for _, c := range p.ExtraNames {
		b.WriteString(", " + ident(c))
	}
	b.WriteString(") VALUES ")
	row := "(" + placeholders(6+len(p.ExtraNames)) + ")"
	args := make([]any, 0, len(idx)*(6+len(p.ExtraNames)))
	idem := false
	for j, i := range idx {
		r := p.Rows[i]
		if j > 0 {
			b.WriteString(", ")
		}
		b.WriteString(row)
		var payload any = r.Payload
		if t.Payload.IsJSON() {
			payload = string(r.Payload)
		} else if r.Payload == nil {
			payload = []byte{}
		}
		args = append(args, r.ID, r.Topic, payload, r.Headers, r.OrderingKey, r.IdempotencyKey)
		if len(p.ExtraNames) > 0 {
			vals, err := extraValues(r.Extra)
			if err != nil {
				return fmt.Errorf("row %d: extra columns: %w", i, err)
			}
			for _, c := range p.ExtraNames {
				args = append(args, vals[c])
			}
		}
		idem = idem || r.IdempotencyKey != nil
	}
	if idem {
		// Only a row with an idempotency key may be absorbed: a keyless row that collides on
		// its id with a keyless stored event has NULL <=> NULL, which would otherwise let it be
		// read back as the stored event.
		same := "VALUES(`idempotency_key`) IS NOT NULL AND VALUES(`idempotency_key`) <=> `idempotency_key`"
		for _, c := range t.Scope {
			same += " AND VALUES(" + ident(c) + ") <=> " + ident(c)
		}
		// 'duplicate event id' fails the id's CHECK constraint (<IndexBase>_id_chk).
		b.WriteString(" ON DUPLICATE KEY UPDATE `id` = IF(" + same + ", `id`, 'duplicate event id')")
	}
	if _, err := q.exec(ctx, b.String(), args...); err != nil {
		if isDuplicateID(err, t) {
			return fmt.Errorf("%w: %w", ErrDuplicateEventID, err)
		}
		return err
	}
	// Read the inserted events back by id (this transaction's own rows).
	ids := make([]string, len(idx))
	for j, i := range idx {
		ids[j] = p.Rows[i].ID
	}
	var rargs []any
	rs, err := q.query(ctx, "SELECT "+storedCols+" FROM "+n.table+" o WHERE "+listSQL("o.`id`", ids, &rargs), rargs...)
	if err != nil {
		return fmt.Errorf("read inserted events: %w", err)
	}
	byID := make(map[string]dialect.Stored, len(idx))
	err = scanEach(rs, func(rs dialect.Rows) error {
		s, err := scanStored(rs)
		byID[s.ID] = s
		return err
	})
	if err != nil {
		return fmt.Errorf("read inserted events: %w", err)
	}
	var raced []dialect.Probe
	for _, i := range idx {
		r := p.Rows[i]
		if s, ok := byID[r.ID]; ok {
			out[i], done[i] = s, true
			continue
		}
		if r.IdempotencyKey == nil {
			return fmt.Errorf("event %s not found after its insert", r.ID)
		}
		pr, err := probeOf(i, r, t)
		if err != nil {
			return err
		}
		raced = append(raced, pr)
	}
	if len(raced) == 0 {
		return nil
	}
	// Keys stored by a concurrent transaction that committed while this INSERT waited for it
	// (or by an earlier row of this call): read the latest committed version.
	found, err := resolve(ctx, q, t, raced, true)
	if err != nil {
		return fmt.Errorf("read stored events: %w", err)
	}
	if err := conflict(found, raced); err != nil {
		return err
	}
	for _, f := range found {
		out[f.Index], done[f.Index] = f.Stored, true
	}
	for _, pr := range raced {
		if !done[pr.Index] {
			return fmt.Errorf("idempotency key %q neither inserted nor found", pr.Key)
		}
	}
	return nil
}

// conflict returns a *dialect.IdempotencyConflict for the first (lowest index) answer whose
// stored event's extra columns differ from its row's (an unscoped table).
func conflict(found []dialect.Resolved, probes []dialect.Probe) error {
	first := -1
	for _, f := range found {
		if !f.Same && (first < 0 || f.Index < first) {
			first = f.Index
		}
	}
	if first < 0 {
		return nil
	}
	for _, pr := range probes {
		if pr.Index == first {
			return &dialect.IdempotencyConflict{Index: first, Key: pr.Key}
		}
	}
	return &dialect.IdempotencyConflict{Index: first}
}

// isDuplicateID reports whether err is the insert's conflict on the event id: the CHECK the
// ON DUPLICATE KEY clause trips (MariaDB 4025, MySQL 3819) or a plain duplicate entry (1062)
// of the id's unique key.
func isDuplicateID(err error, t *dialect.Table) bool {
	var me *mysql.MySQLError
	if !errors.As(err, &me) {
		return false
	}
	switch me.Number {
	case 4025, 3819:
		return strings.Contains(me.Message, t.IndexBase+"_id_chk")
	case 1062:
		return strings.Contains(me.Message, t.IndexBase+"_id_key")
	}
	return false
}

// probeOf returns the probe of row i: its idempotency key and extra column values.
func probeOf(i int, r dialect.InsertRow, t *dialect.Table) (dialect.Probe, error) {
	pr := dialect.Probe{Index: i, Key: *r.IdempotencyKey}
	if r.Extra != nil && len(t.Extra) > 0 {
		// UseNumber: the probe compares in the column's type with the exact digits that
		// extraValues inserted (a float64 turned 12345678901234567 into 1.2345678901234568e+16).
		dec := json.NewDecoder(strings.NewReader(*r.Extra))
		dec.UseNumber()
		if err := dec.Decode(&pr.Extra); err != nil {
			return pr, fmt.Errorf("row %d: extra columns: %w", i, err)
		}
	}
	return pr, nil
}

// extraValues decodes a row's extra columns (a JSON object) into statement arguments:
// strings and numbers as text (the server converts them to the column's type; numbers keep
// their exact digits), booleans as 1/0, null as NULL, objects and arrays as JSON text.
func extraValues(extra *string) (map[string]any, error) {
	if extra == nil {
		return nil, nil
	}
	dec := json.NewDecoder(strings.NewReader(*extra))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		return nil, err
	}
	out := make(map[string]any, len(m))
	for k, v := range m {
		a, err := sqlValue(v)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", k, err)
		}
		out[k] = a
	}
	return out, nil
}

// sqlValue converts one decoded JSON value to a statement argument (see extraValues).
func sqlValue(v any) (any, error) {
	switch x := v.(type) {
	case nil:
		return nil, nil
	case string:
		return x, nil
	case json.Number:
		return x.String(), nil
	case float64, int, int64:
		return fmt.Sprint(x), nil
	case bool:
		if x {
			return int64(1), nil
		}
		return int64(0), nil
	default:
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(x); err != nil {
			return nil, err
		}
		return strings.TrimSuffix(buf.String(), "\n"), nil
	}
}

// scanStored reads one row of storedCols.
func scanStored(rs dialect.Rows) (dialect.Stored, error) {
	var s dialect.Stored
	err := rs.Scan(&s.Sequence, &s.ID, &s.Topic, &s.OrderingKey, &s.IdempotencyKey, (*dbTime)(&s.CreatedAt))
	return s, err
}

// scanEach calls fn for every row of rs and closes it.
func scanEach(rs dialect.Rows, fn func(rs dialect.Rows) error) error {
	defer rs.Close()
	for rs.Next() {
		if err := fn(rs); err != nil {
			return err
		}
	}
	return rs.Err()
}

// ReadStored reads the stored events of idempotency keys (an unscoped table), with a plain
// read: in a REPEATABLE READ transaction it sees the transaction's snapshot. Insert does not
// call it (it answers every row itself).
func (*Dialect) ReadStored(ctx context.Context, ex dialect.Executor, t *dialect.Table, keys []string) ([]dialect.Stored, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	var args []any
	rs, err := ex.Query(ctx, "SELECT "+storedCols+" FROM "+namesOf(t).table+" o WHERE "+listSQL("o.`idempotency_key`", keys, &args), args...)
	if err != nil {
		return nil, err
	}
	var out []dialect.Stored
	err = scanEach(rs, func(rs dialect.Rows) error {
		s, err := scanStored(rs)
		s.Duplicate = true
		out = append(out, s)
		return err
	})
	return out, err
}

// ResolveScoped reads, for each probe, the stored event of its idempotency key in its scope
// (the Scope columns' values in Probe.Extra) and, on an unscoped table, whether every extra
// column the probe sets equals the stored value (NULL-safe, compared in the column's type).
// A probe with no stored event has no answer. A plain read, like ReadStored.
func (*Dialect) ResolveScoped(ctx context.Context, ex dialect.Executor, t *dialect.Table, probes []dialect.Probe) ([]dialect.Resolved, error) {
	return resolve(ctx, exQuerier{ex}, t, probes, false)
}

// resolveChunk caps the probes of one statement (one UNION ALL branch each).
const resolveChunk = 500

// resolve answers probes with one statement per resolveChunk probes, each probe one
// UNION ALL branch that looks its key up in the idempotency index. With lock, each probe is
// read by a statement of its own with FOR UPDATE (the latest committed row version; used
// only for keys a concurrent writer stored while this one's INSERT waited).
func resolve(ctx context.Context, q querier, t *dialect.Table, probes []dialect.Probe, lock bool) ([]dialect.Resolved, error) {
	n := namesOf(t)
	branch := func(pr dialect.Probe, args *[]any) (string, error) {
		*args = append(*args, pr.Index)
		same := "TRUE"
		if len(t.Scope) == 0 && len(t.Extra) > 0 {
			var conds []string
			for _, c := range t.Extra {
				v, ok := pr.Extra[c.Name]
				if !ok {
					continue
				}
				a, err := sqlValue(v)
				if err != nil {
					return "", err
				}
				*args = append(*args, a)
				conds = append(conds, "o."+ident(c.Name)+" <=> ?")
			}
			if len(conds) > 0 {
				same = strings.Join(conds, " AND ")
			}
		}
		*args = append(*args, pr.Key)
		where := "o.`idempotency_key` = ?"
		for _, c := range t.Scope {
			a, err := sqlValue(pr.Extra[c])
			if err != nil {
				return "", err
			}
			*args = append(*args, a)
			where += " AND o." + ident(c) + " = ?"
		}
		return "SELECT ?, " + storedCols + ", " + same + " FROM " + n.table + " o WHERE " + where, nil
	}
	var out []dialect.Resolved
	run := func(stmt string, args []any) error {
		rs, err := q.query(ctx, stmt, args...)
		if err != nil {
			return err
		}
		return scanEach(rs, func(rs dialect.Rows) error {
			var r dialect.Resolved
			if err := rs.Scan(&r.Index, &r.Sequence, &r.ID, &r.Topic, &r.OrderingKey, &r.IdempotencyKey, (*dbTime)(&r.CreatedAt), &r.Same); err != nil {
				return err
			}
			r.Duplicate = true
			out = append(out, r)
			return nil
		})
	}
	if lock {
		for _, pr := range probes {
			var args []any
			br, err := branch(pr, &args)
			if err != nil {
				return nil, err
			}
			if err := run(br+" FOR UPDATE", args); err != nil {
				return nil, err
			}
		}
		return out, nil
	}
	for start := 0; start < len(probes); start += resolveChunk {
		var (
			args  []any
			parts []string
		)
		for _, pr := range probes[start:min(start+resolveChunk, len(probes))] {
			br, err := branch(pr, &args)
			if err != nil {
				return nil, err
			}
			parts = append(parts, br)
		}
		if err := run(strings.Join(parts, "\nUNION ALL\n"), args); err != nil {
			return nil, err
		}
	}
	return out, nil
}
