package wal

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/forwarder"
)

// outboxMode is the state of a Source that streams the outbox table's own inserts.
type outboxMode struct {
	table  string // quoted outbox table
	prefix string // "wal:<slot>:": leases of this slot's sources
	token  string // prefix + this Source's nonce + "#"
	lease  time.Duration
	batch  atomic.Uint64
	seen   atomic.Uint64 // highest sequence of a handled batch (delivered, marked or left)
	mu     sync.Mutex
	rels   map[uint32]*outboxRel
}

// outboxRel is the outbox table's RelationMessage: the position of each column the source
// reads (-1 when missing) and whether the payload is bytea.
type outboxRel struct {
	seq, id, topic, payload, headers, key, attempts, published, dead int
	bytea                                                            bool
}

// outboxRow is what an inserted outbox row adds to its change: the columns the Subscriber's
// message carries besides id, topic, key and payload. bad is set when a value could not be
// read: the row is left to the polling relay (which fails or dead-letters it as usual).
type outboxRow struct {
	seq      int64
	headers  map[string]string
	attempts int
	done     bool // inserted already published or dead-lettered: nothing to deliver
	bad      error
}

func newOutboxMode(table, slot string, lease time.Duration) *outboxMode {
	var nonce [6]byte
	_, _ = rand.Read(nonce[:])
	prefix := "wal:" + slot + ":"
	return &outboxMode{table: table, prefix: prefix, token: prefix + hex.EncodeToString(nonce[:]) + "#", lease: lease, rels: map[uint32]*outboxRel{}}
}

// relation records the columns of the outbox table's RelationMessage.
func (o *outboxMode) relation(m *pglogrepl.RelationMessage) error {
	r := &outboxRel{}
	pos := map[string]*int{"sequence": &r.seq, "id": &r.id, "topic": &r.topic, "payload": &r.payload, "headers": &r.headers,
		"ordering_key": &r.key, "attempts": &r.attempts, "published_at": &r.published, "dead_lettered_at": &r.dead}
	for _, p := range pos {
		*p = -1
	}
	for i, c := range m.Columns {
		if p := pos[c.Name]; p != nil {
			*p = i
		}
		if c.Name == "payload" && c.DataType == 17 { // bytea
			r.bytea = true
		}
	}
	for name, p := range pos {
		if *p < 0 {
			return &outbox.ConfigError{Field: "wal.OutboxConfig.Schema", Reason: fmt.Sprintf("table %s.%s of publication has no column %q: not an outbox table", m.Namespace, m.RelationName, name)}
		}
	}
	o.mu.Lock()
	o.rels[m.RelationID] = r
	o.mu.Unlock()
	return nil
}

// addRow appends an inserted outbox row to the open transaction.
func (r *reader) addRow(m *pglogrepl.InsertMessage) error {
	o := r.s.ob
	o.mu.Lock()
	rel := o.rels[m.RelationID]
	o.mu.Unlock()
	if rel == nil {
		return fmt.Errorf("wal: insert of unknown relation %d", m.RelationID)
	}
	if r.cur == nil {
		return fmt.Errorf("wal: change outside a transaction")
	}
	t := tupleOf(m.Tuple)
	val := func(i int) []byte { return t.vals[i] }
	row := &outboxRow{}
	c := &change{commit: r.cur.commit, row: row}
	seq, err := strconv.ParseInt(string(val(rel.seq)), 10, 64)
	if err != nil {
		return fmt.Errorf("wal: outbox row sequence %q: %w", val(rel.seq), err)
	}
	row.seq = seq
	row.done = val(rel.published) != nil || val(rel.dead) != nil
	if c.id, err = uuid.ParseBytes(val(rel.id)); err != nil {
		row.bad = fmt.Errorf("id %q: %w", val(rel.id), err)
	}
	c.topic = string(val(rel.topic))
	c.key = string(val(rel.key))
	row.attempts, _ = strconv.Atoi(string(val(rel.attempts)))
	// The tuple's bytes belong to the connection's receive buffer: copy what is kept.
	p := append([]byte(nil), val(rel.payload)...)
	if rel.bytea {
		b, err := hex.DecodeString(strings.TrimPrefix(string(p), `\x`))
		if err != nil {
			row.bad = fmt.Errorf("payload: %w", err)
		}
		p = b
	}
	c.payload = p
	if h := val(rel.headers); len(h) > 0 {
		if err := json.Unmarshal(h, &row.headers); err != nil {
			row.headers = map[string]string{"outbox-headers-error": err.Error()} // as the Subscriber does
		}
	}
	r.cur.changes = append(r.cur.changes, c)
	return nil
}

// message is the Watermill message of an outbox row, as the Subscriber emits it: the stored
// headers, then the event id, topic, ordering key, sequence and attempt (the row's failed
// attempts plus this one).
func (row *outboxRow) message(ctx context.Context, c *change, attempt int) *message.Message {
	msg := message.NewMessage(c.id.String(), message.Payload(c.payload))
	for k, v := range row.headers {
		msg.Metadata[k] = v
	}
	msg.Metadata[outbox.MetadataEventID] = msg.UUID
	msg.Metadata[outbox.MetadataTopic] = c.topic
	if c.key != "" {
		msg.Metadata[outbox.MetadataOrderingKey] = c.key
	}
	msg.Metadata[outbox.MetadataSequence] = strconv.FormatInt(row.seq, 10)
	msg.Metadata[outbox.MetadataAttempt] = strconv.Itoa(row.attempts + attempt)
	msg.SetContext(ctx)
	return msg
}

// outcome collects a batch's results for its mark statement.
type outcome struct {
	mu       sync.Mutex
	acked    []int64
	failed   []int64
	errs     []string
	released []int64
}

func (o *outcome) ack(cs ...*change) {
	o.mu.Lock()
	for _, c := range cs {
		o.acked = append(o.acked, c.row.seq)
	}
	o.mu.Unlock()
}

func (o *outcome) fail(c *change, err error) {
	o.mu.Lock()
	o.failed = append(o.failed, c.row.seq)
	o.errs = append(o.errs, err.Error())
	o.mu.Unlock()
}

func (o *outcome) release(cs ...*change) {
	o.mu.Lock()
	for _, c := range cs {
		o.released = append(o.released, c.row.seq)
	}
	o.mu.Unlock()
}

// deliverRows delivers one batch of outbox rows. It leases the rows under the source's token
// (as a relay's claim does, so the polling relay skips them) and reads the head of each key
// (its lowest unpublished sequence) in one statement; it delivers of each key only the leased
// rows that follow the key's head without a gap (rows already published are skipped), and
// unkeyed rows that it leased. A key whose head it did not lease (held by the relay, failed
// earlier, scheduled, dead-lettered) is left to the relay whole. One statement then marks the
// delivered rows published, records one failed attempt for the row of a key whose delivery
// failed MaxAttempts times, and releases the rest of that key's rows; all fenced by the token.
// Only then is the batch confirmed (deliverLoop).
func (s *Source) deliverRows(ctx context.Context, batch []*txn) error {
	o := s.ob
	var all []*change
	var top uint64
	for _, t := range batch {
		for _, c := range t.changes {
			top = max(top, uint64(c.row.seq))
			if !c.row.done {
				all = append(all, c)
			}
		}
	}
	if len(all) == 0 {
		maxStore(&o.seen, top)
		return nil
	}
	token := o.token + strconv.FormatUint(o.batch.Add(1), 10)
	// The lease and the marks run on a context that outlives a stop by stopBudget, so that
	// their answers are read and what is leased is marked or released at once instead of
	// waiting LeaseDuration for the relay.
	dbctx, cancelDB := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelDB()
	defer context.AfterFunc(ctx, func() { time.AfterFunc(stopBudget, cancelDB) })()
	leased, heads, err := s.leaseRows(dbctx, token, all)
	if err != nil {
		return err
	}
	stopRenew := s.renewLeases(dbctx, token, leased)
	defer stopRenew()
	byKey := map[string]*lane{}
	var lanes []*lane
	left := 0
	for _, c := range all {
		_, mine := leased[c.row.seq]
		if c.key == "" {
			if mine {
				lanes = append(lanes, &lane{changes: []*change{c}})
			} else {
				left++
			}
			continue
		}
		l := byKey[c.key]
		if l == nil {
			l = &lane{key: c.key}
			byKey[c.key] = l
			lanes = append(lanes, l)
		}
		l.changes = append(l.changes, c)
	}
	res := &outcome{}
	for _, l := range lanes {
		if l.key == "" {
			continue
		}
		head, ok := heads[l.key]
		// Rows below the head are published already (delivered before a restart).
		i := 0
		for i < len(l.changes) && (!ok || l.changes[i].row.seq < head) {
			i++
		}
		j := i
		for j < len(l.changes) && leased[l.changes[j].row.seq] && (j > i || l.changes[j].row.seq == head) {
			j++
		}
		for _, c := range l.changes[j:] {
			if leased[c.row.seq] {
				res.release(c)
			}
		}
		left += len(l.changes) - j
		l.changes = l.changes[i:j]
	}
	if s.overBound.Load() {
		for _, l := range lanes {
			res.release(l.changes...)
			left += len(l.changes)
			l.changes = nil
		}
	}
	if bp, ok := s.cfg.Destination.(forwarder.BatchPublisher); ok {
		res.ack(s.publishBatch(ctx, bp, lanes, nil)...)
	}
	var failed atomic.Int64
	s.runLanes(ctx, lanes, func(l *lane) {
		for i, c := range l.changes {
			if err := s.publish(ctx, c); err != nil {
				if ctx.Err() != nil {
					return
				}
				res.fail(c, err)
				res.release(l.changes[i+1:]...)
				failed.Add(int64(len(l.changes) - i))
				return
			}
			res.ack(c)
		}
	})
	stopRenew()
	if ctx.Err() != nil {
		// Stopping: record what was delivered and give the other leased rows back at once. The
		// batch stays unconfirmed: the next session streams it again.
		answered := map[int64]bool{}
		for _, l := range [][]int64{res.acked, res.failed, res.released} {
			for _, seq := range l {
				answered[seq] = true
			}
		}
		for seq := range leased {
			if !answered[seq] {
				res.released = append(res.released, seq)
			}
		}
		_ = s.markRows(dbctx, token, res)
		return ctx.Err()
	}
	if err := s.markRows(dbctx, token, res); err != nil {
		return err
	}
	s.parked.Add(uint64(left + int(failed.Load())))
	maxStore(&o.seen, top)
	return nil
}

// renewLeases extends the leases of a batch's rows every third of LeaseDuration while the
// batch is delivered, as the polling relay renews a batch that is out, so that a batch slower
// than LeaseDuration (a large transaction, a slow destination) is not claimed again by the
// relay's sweep windows while it is being delivered: that would deliver its rows twice and,
// for the relay's copy, out of their key's order. The statement is fenced by the batch's
// token. It returns a function that stops the renewal and waits for it (safe to call twice).
func (s *Source) renewLeases(ctx context.Context, token string, leased map[int64]bool) (stop func()) {
	if len(leased) == 0 {
		return func() {}
	}
	seqs := make([]int64, 0, len(leased))
	for seq := range leased {
		seqs = append(seqs, seq)
	}
	q := fmt.Sprintf(`UPDATE %s SET "lease_until" = now() + $3::float8 * interval '1 microsecond'
WHERE "sequence" = ANY($1::bigint[]) AND "leased_by" = $2 AND "published_at" IS NULL`, s.ob.table)
	done, finished := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(finished)
		tick := time.NewTicker(s.ob.lease / 3)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			if _, err := s.pool.Exec(ctx, q, seqs, token, float64(s.ob.lease.Microseconds())); err != nil && ctx.Err() == nil {
				s.cfg.Logger.Error("wal: renewing the leases of a batch failed; retrying at the next renewal", err, watermill.LogFields{"slot": s.cfg.Slot, "token": token})
			}
		}
	}()
	return sync.OnceFunc(func() {
		close(done)
		<-finished
	})
}

// stopBudget is how long the lease and mark statements of a batch may run after a stop.
const stopBudget = 5 * time.Second

// leaseRows leases the rows of cs that are pending, due and not leased by a live relay (a
// lease of an earlier source of this slot counts as expired: the server lets one connection
// stream a slot, so that source is gone) and reads the head of each of their keys. It retries
// until it succeeds or ctx ends.
func (s *Source) leaseRows(ctx context.Context, token string, cs []*change) (map[int64]bool, map[string]int64, error) {
	var seqs []int64
	keySet := map[string]struct{}{}
	var keys []string
	for _, c := range cs {
		if c.row.bad != nil {
			continue
		}
		seqs = append(seqs, c.row.seq)
		if _, ok := keySet[c.key]; !ok && c.key != "" {
			keySet[c.key] = struct{}{}
			keys = append(keys, c.key)
		}
	}
	for _, c := range cs {
		if c.row.bad != nil && c.key != "" {
			if _, ok := keySet[c.key]; !ok {
				keySet[c.key] = struct{}{}
				keys = append(keys, c.key)
			}
		}
	}
	q := fmt.Sprintf(`WITH l AS (
	UPDATE %[1]s SET "lease_until" = now() + $3::float8 * interval '1 microsecond', "leased_by" = $2
	WHERE "sequence" = ANY($1::bigint[]) AND "published_at" IS NULL AND "dead_lettered_at" IS NULL
		AND ("next_attempt_at" IS NULL OR "next_attempt_at" <= now())
		AND ("lease_until" IS NULL OR "lease_until" < now() OR starts_with("leased_by", $4))
	RETURNING "sequence", "attempts")
SELECT 'l', "sequence", "attempts", NULL::text FROM l
UNION ALL
SELECT 'h', min("sequence"), 0, "ordering_key" FROM %[1]s WHERE "published_at" IS NULL AND "ordering_key" = ANY($5::text[]) GROUP BY "ordering_key"
UNION ALL
SELECT 'v', "sequence", 0, NULL FROM %[1]s WHERE "sequence" = ANY($1::bigint[])`, s.ob.table)
	wait := s.cfg.RetryBackoff
	// A transaction can reach the stream an instant before a new snapshot sees it committed
	// (its commit record is flushed, and decoded, before the writer leaves the proc array): the
	// statement then neither leases its rows nor counts them as heads. Such rows are read again
	// after a short wait, for up to invisibleWait; a row still not visible then was deleted
	// (cleanup of a published row, before a replay) and is skipped.
	nap, started := time.Millisecond, time.Now()
	for {
		leased, heads, invisible, err := func() (map[int64]bool, map[string]int64, int, error) {
			rows, err := s.pool.Query(ctx, q, seqs, token, float64(s.ob.lease.Microseconds()), s.ob.prefix, keys)
			if err != nil {
				return nil, nil, 0, err
			}
			defer rows.Close()
			leased, heads, visible := map[int64]bool{}, map[string]int64{}, map[int64]bool{}
			attempts := map[int64]int{}
			for rows.Next() {
				var kind string
				var seq int64
				var att int
				var key *string
				if err := rows.Scan(&kind, &seq, &att, &key); err != nil {
					return nil, nil, 0, err
				}
				switch kind {
				case "l":
					leased[seq] = true
					attempts[seq] = att
				case "h":
					heads[*key] = seq
				case "v":
					visible[seq] = true
				}
			}
			for _, c := range cs {
				if a, ok := attempts[c.row.seq]; ok {
					c.row.attempts = a
				}
			}
			return leased, heads, len(seqs) - len(visible), rows.Err()
		}()
		if err == nil && invisible > 0 && time.Since(started) < invisibleWait {
			select {
			case <-ctx.Done():
				return nil, nil, ctx.Err()
			case <-time.After(nap):
			}
			nap = min(nap*2, 50*time.Millisecond)
			continue
		}
		if err == nil {
			return leased, heads, nil
		}
		if ctx.Err() != nil {
			return nil, nil, ctx.Err()
		}
		s.cfg.Logger.Error("wal: leasing outbox rows failed; retrying", err, watermill.LogFields{"slot": s.cfg.Slot, "backoff": wait})
		select {
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		case <-time.After(wait):
		}
		wait = min(wait*2, s.cfg.MaxBackoff)
	}
}

// invisibleWait bounds the wait for streamed rows that a new snapshot does not see yet.
const invisibleWait = time.Second

// markRows writes a batch's outcome in one statement fenced by its token: acked → published,
// failed → one attempt counted with its error (the relay retries and dead-letters it), released
// → lease cleared. It retries until it succeeds or ctx ends: the batch is not confirmed
// without it.
func (s *Source) markRows(ctx context.Context, token string, res *outcome) error {
	if len(res.acked)+len(res.failed)+len(res.released) == 0 {
		return nil
	}
	q := fmt.Sprintf(`WITH a AS (
	UPDATE %[1]s SET "published_at" = now(), "lease_until" = NULL, "leased_by" = NULL, "delivery_starts" = 0
	WHERE "sequence" = ANY($1::bigint[]) AND "leased_by" = $5 AND "published_at" IS NULL RETURNING 1
), f AS (
	UPDATE %[1]s o SET "attempts" = o."attempts" + 1, "last_error" = ($3::text[])[array_position($2::bigint[], o."sequence")],
		"last_error_class" = 'failure', "lease_until" = NULL, "leased_by" = NULL, "delivery_starts" = 0
	WHERE o."sequence" = ANY($2::bigint[]) AND o."leased_by" = $5 AND o."published_at" IS NULL RETURNING 1
), r AS (
	UPDATE %[1]s SET "lease_until" = NULL, "leased_by" = NULL
	WHERE "sequence" = ANY($4::bigint[]) AND "leased_by" = $5 AND "published_at" IS NULL RETURNING 1
)
SELECT (SELECT count(*) FROM a) + (SELECT count(*) FROM f) + (SELECT count(*) FROM r)`, s.ob.table)
	wait := s.cfg.RetryBackoff
	for {
		var n int64
		err := s.pool.QueryRow(ctx, q, res.acked, res.failed, res.errs, res.released, token).Scan(&n)
		if err == nil {
			if lost := len(res.acked) + len(res.failed) + len(res.released) - int(n); lost > 0 {
				s.cfg.Logger.Info("wal: lease of outbox rows passed to another relay before their marks", watermill.LogFields{"slot": s.cfg.Slot, "events": lost})
			}
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		s.cfg.Logger.Error("wal: marking outbox rows failed; retrying", err, watermill.LogFields{"slot": s.cfg.Slot, "backoff": wait})
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
		wait = min(wait*2, s.cfg.MaxBackoff)
	}
}

// releaseLeases clears the leases of the rows still held by sources of this slot: called when
// the slot is lost and no source streams it, so the polling relay need not wait LeaseDuration
// for them (a source that crashed mid-batch left them).
func (o *outboxMode) releaseLeases(ctx context.Context, pool interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
}) (int64, error) {
	tag, err := pool.Exec(ctx, fmt.Sprintf(`UPDATE %s SET "lease_until" = NULL, "leased_by" = NULL WHERE "published_at" IS NULL AND "dead_lettered_at" IS NULL AND starts_with("leased_by", $1)`, o.table), o.prefix)
	return tag.RowsAffected(), err
}
