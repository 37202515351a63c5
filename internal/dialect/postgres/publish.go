package postgres

import (
	"context"
	"fmt"
	"strings"
	"sync"

	"github.com/watermill-outbox/outbox/internal/dialect"
)

// insertSQL caches insert statements by shape.
var insertSQL sync.Map // insertShape -> string

type insertShape struct {
	table   string
	keys    bool // any ordering key: take the per-key locks
	idem    bool // any idempotency key: ON CONFLICT + read of stored events
	payload dialect.Payload
	extras  string // comma-joined extra column names, sorted
	seed    int64
	single  bool   // one event: scalar parameters instead of arrays
	notify  string // NOTIFY channel folded into the statement, "" for none
	target  string // ON CONFLICT columns: the idempotency index's
	maxNote int    // longest topic announced by name
	// noReturn: a plain insert (plain()) without RETURNING, run with Exec (the caller needs
	// no stored values: Publish without idempotency keys).
	noReturn bool
}

// plain reports whether the statement is the INSERT alone (no ON CONFLICT read-back, no
// NOTIFY): its RETURNING may then be cut to what the caller cannot know.
func (sh insertShape) plain() bool { return !sh.idem && sh.notify == "" }

func (sh insertShape) build() string {
	// JSON text is cast to json (PostgreSQL's json input checks the syntax and keeps the bytes)
	// or jsonb; headers to json. A column of the other JSON type (a JSONB table created before
	// JSON became the default) takes the value through PostgreSQL's assignment cast.
	payloadType, payloadCast := "text", "::json"
	switch sh.payload {
	case dialect.PayloadBytea:
		payloadType, payloadCast = "bytea", ""
	case dialect.PayloadJSONB:
		payloadCast = "::jsonb"
	}
	var ctes []string
	// The events' columns (id, topic, payload, headers, ordering_key, idempotency_key), the
	// FROM clause that yields them, and the idempotency keys of the read-back.
	var cols [6]string
	var from, order, idemKeys string
	// The writer's transaction gets its id (pg_current_xact_id, read by an always-true test of
	// the row the INSERT reads) before the row draws its identity value: the relays' floors
	// rely on every unfinished event's transaction id being lower than the id of a claim that
	// saw a later sequence (see subscription.floors).
	if sh.single {
		// One event (the common Publish): scalar parameters straight into the INSERT, no
		// array encoding and no input CTE (a quarter of the statement's execution time).
		cols = [6]string{"$1::uuid", "$2::text", "$3::" + payloadType + payloadCast, "$4::text::json", "$5::text", "$6::text"}
		idemKeys = "$6::text"
		lock := ""
		okey := fmt.Sprintf("hashtextextended($5::text, %d)", sh.seed)
		ikey := fmt.Sprintf("hashtextextended($6::text, %d)", idemSeed(sh.seed))
		switch {
		case sh.keys && sh.idem:
			// Both locks in hash order, as the batch statement takes them: another order
			// deadlocks against a batch holding the same two keys.
			lock = fmt.Sprintf(", pg_advisory_xact_lock(LEAST(%[1]s, %[2]s)) AS n, pg_advisory_xact_lock(GREATEST(%[1]s, %[2]s)) AS m", okey, ikey)
		case sh.keys:
			// See below: one key, one lock, in the one-row materialized CTE the INSERT reads.
			lock = ", pg_advisory_xact_lock(" + okey + ") AS n"
		case sh.idem:
			lock = ", pg_advisory_xact_lock(" + ikey + ") AS m"
		}
		ctes = append(ctes, "tx AS MATERIALIZED (SELECT pg_current_xact_id() AS xid"+lock+")")
		from = " FROM tx WHERE tx.xid IS NOT NULL"
	} else {
		ctes = append(ctes, fmt.Sprintf("input AS MATERIALIZED (SELECT t.*, pg_current_xact_id() AS xid FROM unnest($1::uuid[], $2::text[], $3::%s[], $4::text[], $5::text[], $6::text[]%s) WITH ORDINALITY AS t(id, topic, payload, headers, ordering_key, idempotency_key%s, ord))",
			payloadType, map[bool]string{true: ", $7::jsonb[]"}[sh.extras != ""], map[bool]string{true: ", extra"}[sh.extras != ""]))
		cols = [6]string{"i.id", "i.topic", "i.payload" + payloadCast, "i.headers::json", "i.ordering_key", "i.idempotency_key"}
		from, order = " FROM input i", " WHERE i.xid IS NOT NULL ORDER BY i.ord"
		idemKeys = "SELECT idempotency_key FROM input WHERE idempotency_key IS NOT NULL"
		if sh.keys || sh.idem {
			// The per-ordering-key lock sits in a materialized CTE that the INSERT
			// reads and that yields exactly one row, so every lock is held before the INSERT
			// draws its first identity value; keys are locked in hash order. Idempotency keys
			// are locked in the same sorted pass: two statements inserting the same keys in
			// different orders would otherwise deadlock in the unique index.
			var srcs []string
			if sh.keys {
				srcs = append(srcs, fmt.Sprintf("SELECT hashtextextended(ordering_key, %d) AS h FROM input WHERE ordering_key IS NOT NULL", sh.seed))
			}
			if sh.idem {
				srcs = append(srcs, fmt.Sprintf("SELECT hashtextextended(idempotency_key, %d) AS h FROM input WHERE idempotency_key IS NOT NULL", idemSeed(sh.seed)))
			}
			ctes = append(ctes, "locks AS MATERIALIZED (SELECT count(pg_advisory_xact_lock(h)) AS n FROM (SELECT DISTINCT h FROM ("+strings.Join(srcs, " UNION ALL ")+") u ORDER BY 1) k)")
			from = " FROM input i CROSS JOIN locks"
		}
	}
	var extras []string
	if sh.extras != "" {
		extras = strings.Split(sh.extras, ",")
	}
	var ins strings.Builder
	fmt.Fprintf(&ins, `INSERT INTO %s ("id", "topic", "payload", "headers", "ordering_key", "idempotency_key"`, sh.table)
	for _, c := range extras {
		ins.WriteString(", " + dialect.DoubleQuote(c))
	}
	ins.WriteString(") SELECT " + strings.Join(cols[:], ", "))
	for _, c := range extras {
		fmt.Fprintf(&ins, ", (jsonb_populate_record(NULL::%s, i.extra)).%s", sh.table, dialect.DoubleQuote(c))
	}
	ins.WriteString(from + order)
	returning := `"sequence", "id"::text, "topic", "ordering_key", "idempotency_key", "created_at"`
	var b strings.Builder
	if sh.plain() {
		if len(ctes) > 0 {
			b.WriteString("WITH " + strings.Join(ctes, ", ") + " ")
		}
		b.WriteString(ins.String())
		switch {
		case sh.noReturn:
			// Nothing to send back: the statement's result is its command tag, as
			// watermill-sql's insert.
		case sh.single:
			// The writer has the event's id, topic and keys: only what the database chose.
			b.WriteString(` RETURNING "sequence", "created_at"`)
		default:
			b.WriteString(" RETURNING false, " + returning)
		}
		return b.String()
	}
	if sh.idem {
		ins.WriteString(` ON CONFLICT (` + sh.target + `) WHERE "idempotency_key" IS NOT NULL DO NOTHING`)
	}
	ctes = append(ctes, "ins AS ("+ins.String()+` RETURNING `+returning+`)`)
	final := ` SELECT false, ` + returning + ` FROM ins`
	if sh.notify != "" {
		// One NOTIFY per distinct topic of the inserted events, inside the writer's
		// transaction: PostgreSQL delivers it at COMMIT and drops it on ROLLBACK. The final
		// SELECT reads this CTE, or PostgreSQL would never run it.
		ctes = append(ctes, fmt.Sprintf(`notified AS MATERIALIZED (SELECT count(pg_notify(%s, CASE WHEN octet_length(t.topic) <= %d THEN t.topic ELSE '' END)) AS n FROM (SELECT DISTINCT "topic" FROM ins) t)`,
			dialect.QuoteLiteral(sh.notify), sh.maxNote))
		final += ` CROSS JOIN notified`
	}
	b.WriteString("WITH " + strings.Join(ctes, ", ") + final)
	if !sh.idem {
		return b.String()
	}
	// Events stored before this statement; rows this statement inserted are not visible here,
	// so nothing is returned twice.
	fmt.Fprintf(&b, ` UNION ALL SELECT true, o."sequence", o."id"::text, o."topic", o."ordering_key", o."idempotency_key", o."created_at" FROM %s o WHERE o."idempotency_key" IN (%s)`, sh.table, idemKeys)
	return b.String()
}

// Insert implements dialect.Dialect: one statement (per-key advisory locks, INSERT, ON CONFLICT
// DO NOTHING, NOTIFY and the read of stored events by idempotency key), then the read-back of
// what it did not return (dialect.OnePerRow): one Stored per row.
func (Dialect) Insert(ctx context.Context, ex dialect.Executor, p *dialect.InsertParams) ([]dialect.Stored, error) {
	t := p.Table
	sh := insertShape{table: dialect.DoubleQuote(t.Parts...), payload: t.Payload, seed: t.LockSeed, notify: p.Notify,
		target: dialect.IdempotencyColumns(t), maxNote: p.MaxNotifyTopicBytes, extras: strings.Join(p.ExtraNames, ",")}
	n := len(p.Rows)
	ids, topics, headers := make([]string, n), make([]string, n), make([]string, n)
	okeys, ikeys, extras := make([]*string, n), make([]*string, n), make([]*string, n)
	// Every parameter has the Go type of its SQL type, so that each pgx.QueryExecMode encodes
	// it alike: JSON payloads are strings (text), BYTEA payloads []byte. A []byte sent for a
	// text parameter is bytea text ("\x7b…") in the exec and simple protocol modes, which
	// send parameters untyped.
	var bytea [][]byte
	var text []string
	if t.Payload == dialect.PayloadBytea {
		bytea = make([][]byte, n)
	} else {
		text = make([]string, n)
	}
	for i, r := range p.Rows {
		ids[i], topics[i], headers[i], okeys[i], ikeys[i], extras[i] = r.ID, r.Topic, r.Headers, r.OrderingKey, r.IdempotencyKey, r.Extra
		if bytea != nil {
			bytea[i] = r.Payload
		} else {
			text[i] = string(r.Payload)
		}
		sh.keys = sh.keys || r.OrderingKey != nil
		sh.idem = sh.idem || r.IdempotencyKey != nil
	}
	var args []any
	switch {
	case n == 1 && sh.extras == "":
		sh.single = true
		var payload any
		if bytea != nil {
			payload = bytea[0]
		} else {
			payload = text[0]
		}
		args = []any{ids[0], topics[0], payload, headers[0], okeys[0], ikeys[0]}
	case bytea != nil:
		args = []any{ids, topics, bytea, headers, okeys, ikeys}
	default:
		args = []any{ids, topics, text, headers, okeys, ikeys}
	}
	if sh.extras != "" {
		args = append(args, extras)
	}
	sh.noReturn = p.NoReturn && sh.plain()
	q, ok := insertSQL.Load(sh)
	if !ok {
		q, _ = insertSQL.LoadOrStore(sh, sh.build())
	}
	if sh.noReturn {
		_, err := ex.Exec(ctx, q.(string), args...)
		return nil, err
	}
	rs, err := ex.Query(ctx, q.(string), args...)
	if err != nil {
		return nil, err
	}
	defer rs.Close()
	var out []dialect.Stored
	for rs.Next() {
		var st dialect.Stored
		if sh.single && sh.plain() {
			r := p.Rows[0]
			st = dialect.Stored{ID: r.ID, Topic: r.Topic, OrderingKey: r.OrderingKey, IdempotencyKey: r.IdempotencyKey}
			err = rs.Scan(&st.Sequence, &st.CreatedAt)
		} else {
			err = rs.Scan(&st.Duplicate, &st.Sequence, &st.ID, &st.Topic, &st.OrderingKey, &st.IdempotencyKey, &st.CreatedAt)
		}
		if err != nil {
			return nil, fmt.Errorf("scan: %w", err)
		}
		out = append(out, st)
	}
	if err := rs.Err(); err != nil {
		return nil, err
	}
	rs.Close()
	return dialect.OnePerRow(ctx, Dialect{}, ex, p, out)
}

// ReadStored implements dialect.Dialect.
func (Dialect) ReadStored(ctx context.Context, ex dialect.Executor, t *dialect.Table, keys []string) ([]dialect.Stored, error) {
	rs, err := ex.Query(ctx, `SELECT "sequence", "id"::text, "topic", "ordering_key", "idempotency_key", "created_at" FROM `+dialect.DoubleQuote(t.Parts...)+` WHERE "idempotency_key" = ANY($1::text[])`, keys)
	if err != nil {
		return nil, err
	}
	return dialect.ScanStoredRows(rs)
}

// ResolveScoped implements dialect.Dialect: one statement joining the probes (a JSON array) with
// the table by (scope columns, key); for an unscoped table it also compares every extra column
// the probe sets (as text in the column's type).
func (Dialect) ResolveScoped(ctx context.Context, ex dialect.Executor, t *dialect.Table, probes []dialect.Probe) ([]dialect.Resolved, error) {
	q := dialect.DoubleQuote(t.Parts...)
	val := func(c string) string {
		return fmt.Sprintf(`(jsonb_populate_record(NULL::%s, i.e)).%s`, q, dialect.DoubleQuote(c))
	}
	match, same := dialect.ResolveConds(t, func(c string) string { return dialect.DoubleQuote(c) }, val, func(col dialect.Column) string {
		return fmt.Sprintf(`(NOT (i.e ? %s) OR o.%s::text IS NOT DISTINCT FROM %s::text)`, dialect.QuoteLiteral(col.Name), dialect.DoubleQuote(col.Name), val(col.Name))
	}, "true")
	rs, err := ex.Query(ctx, fmt.Sprintf(`SELECT i.o, o."sequence", o."id"::text, o."topic", o."ordering_key", o."idempotency_key", o."created_at", %s FROM jsonb_to_recordset($1::jsonb) AS i(o int, k text, e jsonb) JOIN %s o ON o."idempotency_key" = i.k%s`,
		same, q, match), dialect.JSONList(probes))
	if err != nil {
		return nil, err
	}
	return dialect.ScanResolved(rs)
}

// idemSeed is the seed of the idempotency-key locks: another lock space than the ordering
// keys' (seed).
func idemSeed(seed int64) int64 { return seed ^ 0x49646d4b }
