package wal

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/capture"
)

// Source streams the changes of the captured tables from a logical replication slot to
// Config.Destination. Create it with New and run it with Run; one Source per slot (the
// server refuses a second reader of an active slot). Stats is safe for concurrent use.
type Source struct {
	cfg    Config
	names  []*capture.Names
	pool   *pgxpool.Pool
	park   *outbox.Publisher
	outbox string // quoted outbox table

	confirmed atomic.Uint64 // delivered or parked up to here (end of a transaction)
	inflight  atomic.Int64  // transactions handed to delivery and not yet confirmed
	overBound atomic.Bool
	connected atomic.Bool

	delivered, parked, retries atomic.Uint64

	ob        *outboxMode // outbox-table mode (NewOutboxRelay); nil for captured tables
	fallbacks atomic.Uint64
	fromTable atomic.Bool

	mu       sync.Mutex
	pending  []time.Time // commit times of the transactions in flight, oldest first
	parkKeys map[string]struct{}
	slot     SlotStatus
}

// New returns a Source reading with a replication connection built from pool's
// configuration (replication=database) and using pool for the catalog, the slot's statistics
// and parking. Errors: a *outbox.ConfigError for an invalid Config or a nil Destination.
func New(pool *pgxpool.Pool, cfg Config) (*Source, error) {
	names, err := cfg.names()
	if err != nil {
		return nil, err
	}
	if cfg.Destination == nil {
		return nil, &outbox.ConfigError{Field: "wal.Config.Destination", Reason: "required"}
	}
	if pool == nil {
		return nil, &outbox.ConfigError{Field: "pool", Reason: "nil"}
	}
	cfg = cfg.withDefaults()
	park, err := outbox.NewPublisher(pool, outbox.PublisherConfig{Schema: cfg.Schema}, cfg.Logger)
	if err != nil {
		return nil, err
	}
	return &Source{cfg: cfg, names: names, pool: pool, park: park, outbox: outboxTable(cfg.Schema)}, nil
}

func outboxTable(s outbox.SchemaConfig) string {
	name := s.Table
	if name == "" {
		name = outbox.DefaultTable
	}
	return pgx.Identifier(strings.Split(name, ".")).Sanitize()
}

// Run streams changes until ctx is cancelled (then it returns nil) or the slot is lost or
// missing (a *SlotError) or the configuration does not match the catalog (a
// *outbox.ConfigError). Other errors (a restarted server, a dropped connection) end the
// replication session and Run starts another after a backoff, from the slot's confirmed
// position: changes delivered but not yet confirmed are delivered again (the same event ids).
func (s *Source) Run(ctx context.Context) error {
	wait := s.cfg.RetryBackoff
	for {
		err := s.session(ctx)
		s.connected.Store(false)
		if ctx.Err() != nil {
			return nil
		}
		var se *SlotError
		var ce *outbox.ConfigError
		if errors.As(err, &se) || errors.As(err, &ce) {
			return err
		}
		s.cfg.Logger.Error("wal: replication session ended; reconnecting", err, watermill.LogFields{"slot": s.cfg.Slot, "backoff": wait})
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
		wait = min(wait*2, s.cfg.MaxBackoff)
	}
}

// txn is one committed transaction of the stream.
type txn struct {
	final   uint64 // the commit's LSN (BeginMessage.FinalLSN)
	end     uint64
	commit  time.Time
	changes []*change
}

// session is one replication connection: it reads the stream in this goroutine and delivers
// in another.
func (s *Source) session(ctx context.Context) error {
	var decls map[string]*declared
	if s.ob == nil {
		var err error
		if decls, err = resolveTables(ctx, s.pool, s.cfg.Tables, s.names); err != nil {
			return err
		}
	}
	st, err := Status(ctx, s.pool, s.cfg.Slot)
	if err != nil {
		return err
	}
	if err := st.usable(); err != nil {
		return err
	}
	if s.ob == nil {
		if err := s.loadParked(ctx); err != nil {
			return err
		}
	}
	s.confirmed.Store(st.ConfirmedFlushLSN)
	pc := s.pool.Config().ConnConfig.Config.Copy()
	pc.RuntimeParams = maps.Clone(pc.RuntimeParams)
	if pc.RuntimeParams == nil {
		pc.RuntimeParams = map[string]string{}
	}
	for k, v := range map[string]string{"replication": "database", "DateStyle": "ISO", "TimeZone": "UTC", "bytea_output": "hex", "extra_float_digits": "3", "application_name": "outbox-wal:" + s.cfg.Slot} {
		pc.RuntimeParams[k] = v
	}
	conn, err := pgconn.ConnectConfig(ctx, pc)
	if err != nil {
		return fmt.Errorf("wal: replication connection: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	err = pglogrepl.StartReplication(ctx, conn, s.cfg.Slot, 0, pglogrepl.StartReplicationOptions{PluginArgs: []string{
		"proto_version '1'", "publication_names '" + s.cfg.Publication + "'", "messages 'true'"}})
	if err != nil {
		return slotErr(s.cfg.Slot, fmt.Errorf("wal: start replication: %w", err))
	}
	s.connected.Store(true)
	s.cfg.Logger.Info("wal: replication started", watermill.LogFields{"slot": s.cfg.Slot, "from": pglogrepl.LSN(st.ConfirmedFlushLSN).String()})

	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	queue := make(chan *txn, 256)
	var wg sync.WaitGroup
	var delivErr error
	wg.Go(func() {
		if delivErr = s.deliverLoop(sctx, queue); delivErr != nil {
			cancel()
		}
	})
	wg.Go(func() { s.watch(sctx) })
	r := &reader{s: s, conn: conn, decls: decls, rels: map[uint32]*relation{}, rules: &typeRules{pool: s.pool, cache: map[uint32]*typeRule{}}, queue: queue}
	err = r.run(sctx)
	cancel()
	wg.Wait()
	// Tell the server what is confirmed before leaving (best effort: the connection may be
	// gone).
	fctx, fcancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	_ = pglogrepl.SendStandbyStatusUpdate(fctx, conn, pglogrepl.StandbyStatusUpdate{WALWritePosition: pglogrepl.LSN(s.confirmed.Load())})
	fcancel()
	if err == nil || errors.Is(err, context.Canceled) {
		err = delivErr
	}
	return err
}

// reader decodes the stream.
type reader struct {
	s     *Source
	conn  *pgconn.PgConn
	decls map[string]*declared
	rels  map[uint32]*relation
	rules *typeRules
	queue chan<- *txn
	cur   *txn // the open transaction, nil between transactions
	seq   int
	sent  uint64 // last position sent in a status update
	next  time.Time
}

func (r *reader) run(ctx context.Context) error {
	r.next = time.Now()
	for {
		if err := r.status(ctx, false); err != nil {
			return err
		}
		rctx, cancel := context.WithDeadline(ctx, r.next)
		raw, err := r.conn.ReceiveMessage(rctx)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if pgconn.Timeout(err) {
				continue
			}
			return fmt.Errorf("wal: receive: %w", err)
		}
		switch m := raw.(type) {
		case *pgproto3.ErrorResponse:
			return slotErr(r.s.cfg.Slot, pgconn.ErrorResponseToPgError(m))
		case *pgproto3.CopyData:
			if err := r.copyData(ctx, m.Data); err != nil {
				return err
			}
		}
	}
}

// status sends a standby status update when due (or now when force).
func (r *reader) status(ctx context.Context, force bool) error {
	if !force && time.Now().Before(r.next) {
		return nil
	}
	pos := r.s.confirmed.Load()
	r.next = time.Now().Add(r.s.cfg.StatusInterval)
	if err := pglogrepl.SendStandbyStatusUpdate(ctx, r.conn, pglogrepl.StandbyStatusUpdate{WALWritePosition: pglogrepl.LSN(pos)}); err != nil {
		return fmt.Errorf("wal: status update: %w", err)
	}
	r.sent = pos
	return nil
}

// idleAdvance confirms pos when nothing is open or in flight: the log up to pos holds no
// change to deliver.
func (r *reader) idleAdvance(pos uint64) {
	if r.cur == nil && r.s.inflight.Load() == 0 {
		maxStore(&r.s.confirmed, pos)
	}
}

func maxStore(v *atomic.Uint64, x uint64) {
	for {
		old := v.Load()
		if x <= old || v.CompareAndSwap(old, x) {
			return
		}
	}
}

func (r *reader) copyData(ctx context.Context, data []byte) error {
	if len(data) == 0 {
		return nil
	}
	switch data[0] {
	case pglogrepl.PrimaryKeepaliveMessageByteID:
		ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(data[1:])
		if err != nil {
			return fmt.Errorf("wal: keepalive: %w", err)
		}
		r.idleAdvance(uint64(ka.ServerWALEnd))
		return r.status(ctx, ka.ReplyRequested)
	case pglogrepl.XLogDataByteID:
		x, err := pglogrepl.ParseXLogData(data[1:])
		if err != nil {
			return fmt.Errorf("wal: xlogdata: %w", err)
		}
		return r.logical(ctx, x)
	}
	return nil
}

func (r *reader) logical(ctx context.Context, x pglogrepl.XLogData) error {
	msg, err := pglogrepl.Parse(x.WALData)
	if err != nil {
		return fmt.Errorf("wal: parse: %w", err)
	}
	switch m := msg.(type) {
	case *pglogrepl.RelationMessage:
		if r.s.ob != nil {
			return r.s.ob.relation(m)
		}
		rel, err := newRelation(ctx, r.rules, m, r.decls[m.Namespace+"."+m.RelationName])
		if err != nil {
			return err
		}
		r.rels[m.RelationID] = rel
	case *pglogrepl.BeginMessage:
		r.cur, r.seq = &txn{commit: m.CommitTime, final: uint64(m.FinalLSN)}, 0
	case *pglogrepl.InsertMessage:
		if r.s.ob != nil {
			return r.addRow(m)
		}
		return r.add(m.RelationID, capture.Inserted, nil, m.Tuple)
	case *pglogrepl.UpdateMessage:
		if r.s.ob != nil {
			return nil // the outbox publication publishes inserts only
		}
		return r.add(m.RelationID, capture.Updated, m.OldTuple, m.NewTuple)
	case *pglogrepl.DeleteMessage:
		if r.s.ob != nil {
			return nil
		}
		return r.add(m.RelationID, capture.Deleted, m.OldTuple, nil)
	case *pglogrepl.TruncateMessage:
		for _, id := range m.RelationIDs {
			if rel := r.rels[id]; rel != nil && r.cur != nil {
				r.seq++
				if c := rel.truncated(r.cur.commit, r.cur.final, r.seq); c != nil {
					r.cur.changes = append(r.cur.changes, c)
				}
			}
		}
	case *pglogrepl.CommitMessage:
		if r.cur == nil {
			return nil
		}
		t := r.cur
		r.cur = nil
		t.end = uint64(m.TransactionEndLSN)
		if len(t.changes) == 0 {
			r.idleAdvance(t.end)
			return nil
		}
		return r.push(ctx, t)
	case *pglogrepl.LogicalDecodingMessage:
		// A heartbeat (or any non-transactional message): the log up to it is read.
		if !m.Transactional {
			r.idleAdvance(uint64(m.LSN))
		}
	}
	return nil
}

// add appends a row change to the open transaction.
func (r *reader) add(relID uint32, op capture.Operation, oldT, newT *pglogrepl.TupleData) error {
	rel := r.rels[relID]
	if rel == nil {
		return fmt.Errorf("wal: change of unknown relation %d", relID)
	}
	if r.cur == nil {
		return fmt.Errorf("wal: change outside a transaction")
	}
	r.seq++
	c, err := rel.build(op, tupleOf(oldT), tupleOf(newT), r.cur.commit, r.cur.final, r.seq)
	if err != nil {
		// Reconnecting would read the same change again: stop Run instead.
		return &outbox.ConfigError{Field: "wal.Config.Tables", Reason: "a change cannot be turned into an envelope", Err: err}
	}
	if c == nil {
		return nil
	}
	r.cur.changes = append(r.cur.changes, c)
	return nil
}

// push hands a transaction to delivery, sending status updates while the queue is full so
// the server does not time the connection out.
func (r *reader) push(ctx context.Context, t *txn) error {
	r.s.inflight.Add(1)
	r.s.mu.Lock()
	r.s.pending = append(r.s.pending, t.commit)
	r.s.mu.Unlock()
	for {
		select {
		case r.queue <- t:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Until(r.next)):
			if err := r.status(ctx, true); err != nil {
				return err
			}
		}
	}
}
