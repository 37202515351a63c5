package wal

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/forwarder"
)

// Defaults of OutboxConfig's zero fields (the others are Config's).
const (
	DefaultOutboxSlot        = "outbox_wal_table"
	DefaultOutboxPublication = "outbox_wal_table"
	DefaultLeaseDuration     = 60 * time.Second
	DefaultSweepInterval     = outbox.DefaultPollInterval
	DefaultSweepAge          = time.Second
	DefaultSlotRecheck       = 10 * time.Second
)

// OutboxConfig configures an OutboxRelay: the outbox table's own inserts read from a logical
// replication slot instead of polling, with the polling relay (outbox.Subscriber through a
// forwarder) over the same table for what the stream leaves and for a lost slot. The zero
// value of every field but Destination is the default.
type OutboxConfig struct {
	// Slot and Publication are the slot and the publication (of the outbox table, inserts
	// only). Defaults DefaultOutboxSlot and DefaultOutboxPublication: distinct from a
	// business-table Source's, so both can run on one database.
	Slot, Publication string
	// Schema names the outbox table (it must match the table's Migrate config).
	Schema outbox.SchemaConfig
	// Destination receives every event, as the forwarder would publish it (same UUID, payload,
	// headers and outbox metadata, topic unchanged: route topics with a router publisher; the
	// outbox.EventFromContext value is set by the polling relay only). Required. Safe for
	// concurrent use: up to Concurrency calls at once from the stream, and the polling
	// relay's.
	Destination message.Publisher
	// BatchSize, Concurrency, MaxAttempts, RetryBackoff, MaxBackoff, DeliveryTimeout,
	// StatusInterval, Heartbeat and MaxRetainedWAL are Config's, for the stream. An event that fails MaxAttempts
	// Publish calls gets one attempt counted in its row and is left to the polling relay,
	// with the key's later events of the batch; over MaxRetainedWAL every event is left to it.
	BatchSize, Concurrency, MaxAttempts int
	RetryBackoff, MaxBackoff            time.Duration
	DeliveryTimeout                     time.Duration
	StatusInterval, Heartbeat           time.Duration
	MaxRetainedWAL                      int64
	// LeaseDuration is how long the stream leases the rows of a batch (the polling relay skips
	// leased rows); the stream renews the leases every third of it while it delivers the batch,
	// so it bounds how long rows stay leased after the stream stops answering for them (a crash),
	// not how long a delivery may take. At least 1s. Default DefaultLeaseDuration.
	LeaseDuration time.Duration
	// Relay configures the polling relay over the table (Schema is replaced by Schema;
	// ExcludeTopics is refused with ErrUnsupported: the stream delivers every topic). While
	// the slot streams it runs only in sweep windows, without wake probe or wakeup: at start,
	// and at each SweepInterval when a pending, due, unleased row that the stream has passed
	// is older than SweepAge and not held behind a dead-lettered or not yet due event of its
	// key (a failed event's retry, a key's rows held behind it, rows older than the slot); a window ends at the first claim that leases less than a full batch, or
	// after SweepInterval. After a lost slot it runs as configured here.
	Relay outbox.SubscriberConfig
	// SweepInterval is the period of the sweep checks (and a window's longest run): how long,
	// beyond SweepAge and its retry backoff, an event the stream left may wait. Default
	// DefaultSweepInterval.
	SweepInterval time.Duration
	// SweepAge is how old a row the stream has passed must be to open a sweep window, so that
	// rows the stream is about to deliver (committed out of sequence order) do not. Default
	// DefaultSweepAge.
	SweepAge time.Duration
	// SlotRecheck is how often, after a lost slot, the relay checks whether a usable slot
	// exists again (made by SetupOutbox or "outbox capture wal setup-outbox"), to
	// stream again. Default DefaultSlotRecheck.
	SlotRecheck time.Duration
	// Logger receives the log lines. Default watermill.NopLogger.
	Logger watermill.LoggerAdapter
}

func (c OutboxConfig) withDefaults() OutboxConfig {
	if c.Slot == "" {
		c.Slot = DefaultOutboxSlot
	}
	if c.Publication == "" {
		c.Publication = DefaultOutboxPublication
	}
	if c.LeaseDuration == 0 {
		c.LeaseDuration = DefaultLeaseDuration
	}
	if c.SweepInterval == 0 {
		c.SweepInterval = DefaultSweepInterval
	}
	if c.SweepAge == 0 {
		c.SweepAge = DefaultSweepAge
	}
	if c.SlotRecheck == 0 {
		c.SlotRecheck = DefaultSlotRecheck
	}
	if c.Logger == nil {
		c.Logger = watermill.NopLogger{}
	}
	c.Relay.Schema = c.Schema
	return c
}

// source is the Config of the stream.
func (c OutboxConfig) source() Config {
	return Config{Slot: c.Slot, Publication: c.Publication, Schema: c.Schema, Destination: c.Destination, BatchSize: c.BatchSize,
		Concurrency: c.Concurrency, MaxAttempts: c.MaxAttempts, RetryBackoff: c.RetryBackoff, MaxBackoff: c.MaxBackoff,
		DeliveryTimeout: c.DeliveryTimeout, StatusInterval: c.StatusInterval, Heartbeat: c.Heartbeat, MaxRetainedWAL: c.MaxRetainedWAL, Logger: c.Logger}
}

// Validate returns a *outbox.ConfigError naming the first invalid field, or nil (one wrapping
// ErrUnsupported for Relay.ExcludeTopics). Destination is checked by NewOutboxRelay only.
func (c OutboxConfig) Validate() error {
	c = c.withDefaults()
	for field, v := range map[string]time.Duration{"LeaseDuration": c.LeaseDuration, "SweepInterval": c.SweepInterval, "SweepAge": c.SweepAge, "SlotRecheck": c.SlotRecheck} {
		if v < 0 {
			return &outbox.ConfigError{Field: "wal.OutboxConfig." + field, Reason: "must not be negative"}
		}
	}
	if c.LeaseDuration < time.Second {
		return &outbox.ConfigError{Field: "wal.OutboxConfig.LeaseDuration", Reason: "at least 1s"}
	}
	// The stream delivers every topic of the table: a topic split would have it deliver, and
	// mark published, the events another relay serves.
	if len(c.Relay.ExcludeTopics) > 0 {
		return &outbox.ConfigError{Field: "wal.OutboxConfig.Relay.ExcludeTopics", Reason: "the outbox-table mode delivers every topic of the table; split topics over polling relays instead", Err: ErrUnsupported}
	}
	if err := c.source().check(); err != nil {
		var ce *outbox.ConfigError
		if errors.As(err, &ce) && strings.HasPrefix(ce.Field, "wal.Config.") {
			e := *ce
			e.Field = "wal.OutboxConfig." + strings.TrimPrefix(ce.Field, "wal.Config.")
			return &e
		}
		return err
	}
	return c.Relay.Validate()
}

// SetupOutboxSQL returns the statements SetupOutbox runs, for a migration tool: the
// publication of the outbox table's inserts and the slot. Run the slot's statement outside a
// transaction that has written anything.
func SetupOutboxSQL(cfg OutboxConfig) (string, error) {
	if err := cfg.Validate(); err != nil {
		return "", err
	}
	cfg = cfg.withDefaults()
	return fmt.Sprintf("CREATE PUBLICATION %s FOR TABLE %s WITH (publish = 'insert');\nSELECT pg_create_logical_replication_slot('%s', 'pgoutput');\n",
		pgx.Identifier{cfg.Publication}.Sanitize(), outboxTable(cfg.Schema), cfg.Slot), nil
}

// SetupOutbox creates or updates, idempotently, the publication of the outbox table's
// inserts and the slot when missing (a slot created now starts at the current position: the
// polling relay delivers what was written before). It refuses a server without wal_level =
// logical. The role needs the REPLICATION attribute (see the package doc, "Permissions") and
// ownership of the outbox table.
func SetupOutbox(ctx context.Context, pool *pgxpool.Pool, cfg OutboxConfig) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	cfg = cfg.withDefaults()
	if err := checkLevel(ctx, pool); err != nil {
		return err
	}
	pub := pgx.Identifier{cfg.Publication}.Sanitize()
	var exists bool
	if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_publication WHERE pubname = $1)`, cfg.Publication).Scan(&exists); err != nil {
		return fmt.Errorf("wal: read publication: %w", err)
	}
	stmts := []string{fmt.Sprintf("CREATE PUBLICATION %s FOR TABLE %s WITH (publish = 'insert')", pub, outboxTable(cfg.Schema))}
	if exists {
		stmts = []string{fmt.Sprintf("ALTER PUBLICATION %s SET TABLE %s", pub, outboxTable(cfg.Schema)),
			fmt.Sprintf("ALTER PUBLICATION %s SET (publish = 'insert')", pub)}
	}
	for _, q := range stmts {
		if _, err := pool.Exec(ctx, q); err != nil {
			return fmt.Errorf("wal: %s: %w", q, err)
		}
	}
	return ensureSlot(ctx, pool, cfg.Slot)
}

// DropOutbox removes the outbox-table mode's slot and publication (see Drop).
func DropOutbox(ctx context.Context, pool *pgxpool.Pool, cfg OutboxConfig) error {
	cfg = cfg.withDefaults()
	return dropSlot(ctx, pool, cfg.Slot, cfg.Publication)
}

// OutboxRelay delivers the outbox table's events to a destination from the table's own
// inserts in the WAL, with the polling relay as the safety net. The outbox table stays the
// source of truth: the stream leases the rows it delivers and marks them published like a
// relay, and the slot is confirmed only past rows so recorded, so whatever the stream does not
// deliver is still a pending row that the polling relay delivers in its sweep windows (per-key
// order kept: the stream delivers a key's rows only from the key's oldest unpublished row on,
// and the relay's claim skips rows the stream holds). On a lost slot (*SlotError) it logs one
// line at Error level, counts it (Stats.Fallbacks, outbox_wal_fallbacks_total) and polls the
// table as Relay configures until a usable slot exists again. Create it with NewOutboxRelay
// and run it with Run; run one per slot.
type OutboxRelay struct {
	cfg  OutboxConfig
	pool *pgxpool.Pool
	src  *Source
}

// NewOutboxRelay returns an OutboxRelay. Errors: a *outbox.ConfigError for an invalid
// OutboxConfig or a nil Destination.
func NewOutboxRelay(pool *pgxpool.Pool, cfg OutboxConfig) (*OutboxRelay, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Destination == nil {
		return nil, &outbox.ConfigError{Field: "wal.OutboxConfig.Destination", Reason: "required"}
	}
	if pool == nil {
		return nil, &outbox.ConfigError{Field: "pool", Reason: "nil"}
	}
	cfg = cfg.withDefaults()
	scfg := cfg.source().withDefaults()
	r := &OutboxRelay{cfg: cfg, pool: pool}
	r.src = &Source{cfg: scfg, pool: pool, outbox: outboxTable(cfg.Schema)}
	r.src.ob = newOutboxMode(r.src.outbox, scfg.Slot, cfg.LeaseDuration)
	return r, nil
}

// Source returns the stream's Source, for Stats and NewCollector.
func (r *OutboxRelay) Source() *Source { return r.src }

// Run delivers until ctx ends (then it returns nil) or the configuration does not match the
// database (a *outbox.ConfigError) or the polling relay cannot start. A lost slot is not an
// error: Run polls the table until a usable slot exists again.
func (r *OutboxRelay) Run(ctx context.Context) error {
	for {
		err := r.stream(ctx)
		if ctx.Err() != nil {
			return nil
		}
		var se *SlotError
		if !errors.As(err, &se) {
			return err
		}
		r.src.fallbacks.Add(1)
		r.src.fromTable.Store(true)
		released, rerr := r.src.ob.releaseLeases(ctx, r.pool)
		if rerr != nil {
			released = -1 // unknown: they expire after LeaseDuration
		}
		r.cfg.Logger.Error("wal: outbox slot lost; delivering from the outbox table by polling until a usable slot exists", err, watermill.LogFields{"slot": r.cfg.Slot, "leases_released": released})
		if err := r.poll(ctx); err != nil || ctx.Err() != nil {
			return err
		}
		r.src.fromTable.Store(false)
		r.cfg.Logger.Info("wal: outbox slot usable again; streaming", watermill.LogFields{"slot": r.cfg.Slot})
	}
}

// stream runs the Source and, beside it, the sweeps of the polling relay, until either ends.
func (r *OutboxRelay) stream(ctx context.Context) error {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sweepErr := make(chan error, 1)
	go func() { sweepErr <- r.sweeps(sctx); cancel() }()
	err := r.src.Run(sctx)
	cancel()
	if serr := <-sweepErr; err == nil && serr != nil {
		err = serr
	}
	return err
}

// sweeps runs the polling relay in windows while the slot streams: at once and at each
// SweepInterval, when stranded finds a row for it. The relay
// is not left running: its claims would race the stream for every fresh row (a claim between
// a row's commit and the stream's lease takes it, and the stream then leaves the key's next
// rows to the relay, which polls again at once, and so on while writes continue).
func (r *OutboxRelay) sweeps(ctx context.Context) error {
	tick := time.NewTicker(r.cfg.SweepInterval)
	defer tick.Stop()
	// Rows written before now are the stream's to pass: those older than the slot are then
	// found by stranded like rows the stream left.
	var top int64
	if err := r.pool.QueryRow(ctx, fmt.Sprintf(`SELECT coalesce(max("sequence"), 0) FROM %s`, r.src.outbox)).Scan(&top); err != nil && ctx.Err() == nil {
		top = math.MaxInt64 // sweep whatever is old
	}
	maxStore(&r.src.ob.seen, uint64(top))
	for {
		if r.stranded(ctx) {
			if err := r.window(ctx); err != nil || ctx.Err() != nil {
				return err
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// stranded reports whether the table holds a row for the relay: pending, due, not leased,
// at or below the last sequence the stream has handled (any, while no replication session is
// up) and older than SweepAge (a row left by the stream — a failed event, a key held behind an
// older row — or written before the slot),
// and not held behind a dead-lettered or not yet due event of its key (the relay cannot claim
// it: a window for it would only race the stream, at every SweepInterval while the dead
// letter stays).
// On an error it reports true: a needless window costs one claim.
func (r *OutboxRelay) stranded(ctx context.Context) bool {
	seen := int64(r.src.ob.seen.Load())
	if !r.src.connected.Load() {
		// No replication session (refused, reconnecting): nothing streams the rows written
		// meanwhile and nothing races the relay for them.
		seen = math.MaxInt64
	}
	var found bool
	err := r.pool.QueryRow(ctx, fmt.Sprintf(`SELECT EXISTS (SELECT 1 FROM %[1]s o WHERE o."published_at" IS NULL AND o."dead_lettered_at" IS NULL AND o."sequence" <= $1
	AND o."created_at" < now() - $2::float8 * interval '1 microsecond' AND (o."next_attempt_at" IS NULL OR o."next_attempt_at" <= now())
	AND (o."lease_until" IS NULL OR o."lease_until" < now())
	AND NOT EXISTS (SELECT 1 FROM %[1]s d WHERE d."published_at" IS NULL AND d."ordering_key" IS NOT NULL
		AND (d."dead_lettered_at" IS NOT NULL OR d."next_attempt_at" IS NOT NULL) AND d."ordering_key" = o."ordering_key"
		AND d."sequence" < o."sequence" AND (d."dead_lettered_at" IS NOT NULL OR d."next_attempt_at" > now())))`, r.src.outbox),
		seen, float64(r.cfg.SweepAge.Microseconds())).Scan(&found)
	return err != nil || found
}

// window runs the polling relay (Relay, without wake probe or wakeup) until a claim leases
// less than a full batch — what is left is then fresh rows the stream delivers — and the
// events claimed are marked, or for one SweepInterval at most.
func (r *OutboxRelay) window(ctx context.Context) error {
	wctx, cancel := context.WithTimeout(ctx, r.cfg.SweepInterval)
	defer cancel()
	sc := r.cfg.Relay
	sc.WakeProbeInterval = 0
	sc.DisableWakeProbe = true
	sc.Wakeup = nil
	full := sc.BatchSize
	if full == 0 {
		full = outbox.DefaultBatchSize
	}
	// The window ends once a claim leased less than a full batch and every event claimed in
	// it has its mark (acked, failed or released), so the events it claimed are not cut off.
	var claimed, marked atomic.Int64
	var ending atomic.Bool
	done := func() {
		if ending.Load() && marked.Load() >= claimed.Load() {
			cancel()
		}
	}
	onClaim, onMark := sc.Hooks.OnClaim, sc.Hooks.OnMark
	sc.Hooks.OnClaim = func(i outbox.ClaimInfo) {
		if onClaim != nil {
			onClaim(i)
		}
		claimed.Add(int64(i.Events))
		if !i.Probe && i.Events < full {
			ending.Store(true)
		}
		done()
	}
	sc.Hooks.OnMark = func(m outbox.MarkInfo) {
		if onMark != nil {
			onMark(m)
		}
		if m.Err == nil {
			marked.Add(int64(m.Events))
		}
		done()
	}
	return r.relay(wctx, sc)
}

// poll runs the polling relay as configured until ctx ends (nil), it fails, or the slot is
// usable again (nil).
func (r *OutboxRelay) poll(ctx context.Context) error {
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	relayErr := make(chan error, 1)
	go func() { relayErr <- r.relay(pctx, r.cfg.Relay) }()
	tick := time.NewTicker(r.cfg.SlotRecheck)
	defer tick.Stop()
	for {
		select {
		case err := <-relayErr:
			return err
		case <-tick.C:
			if st, err := Status(pctx, r.pool, r.cfg.Slot); err == nil && st.usable() == nil {
				cancel()
				return <-relayErr
			}
		}
	}
}

// relay runs an outbox.Subscriber with cfg through a forwarder to the destination until ctx
// ends (nil) or it cannot start.
func (r *OutboxRelay) relay(ctx context.Context, cfg outbox.SubscriberConfig) error {
	sub, err := outbox.NewSubscriber(r.pool, cfg, r.cfg.Logger)
	if err != nil {
		return err
	}
	f, err := forwarder.New(sub, r.cfg.Destination, forwarder.Config{}, r.cfg.Logger)
	if err != nil {
		_ = sub.Close()
		return err
	}
	err = f.Run(ctx)
	_ = sub.Close()
	if ctx.Err() != nil {
		return nil
	}
	if err == nil {
		err = errors.New("wal: polling relay stopped")
	}
	return err
}

// checkLevel refuses a server without wal_level = logical.
func checkLevel(ctx context.Context, pool *pgxpool.Pool) error {
	var level string
	if err := pool.QueryRow(ctx, `SHOW wal_level`).Scan(&level); err != nil {
		return fmt.Errorf("wal: read wal_level: %w", err)
	}
	if level != "logical" {
		return &outbox.ConfigError{Field: "wal_level", Reason: fmt.Sprintf("the server runs with wal_level = %s: set wal_level = logical (rds.logical_replication = 1 on Amazon RDS) and restart it", level)}
	}
	return nil
}

// ensureSlot creates slot when missing and refuses an invalidated one.
func ensureSlot(ctx context.Context, pool *pgxpool.Pool, slot string) error {
	st, err := Status(ctx, pool, slot)
	if err != nil {
		return err
	}
	if st.Exists {
		return st.usable()
	}
	if _, err := pool.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, slot); err != nil {
		return fmt.Errorf("wal: create slot %q: %w", slot, err)
	}
	return nil
}

// dropSlot drops slot (when it exists) and publication.
func dropSlot(ctx context.Context, pool *pgxpool.Pool, slot, publication string) error {
	if _, err := pool.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, slot); err != nil {
		return fmt.Errorf("wal: drop slot %q: %w", slot, err)
	}
	if _, err := pool.Exec(ctx, "DROP PUBLICATION IF EXISTS "+pgx.Identifier{publication}.Sanitize()); err != nil {
		return fmt.Errorf("wal: drop publication: %w", err)
	}
	return nil
}
