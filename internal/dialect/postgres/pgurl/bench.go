package pgurl

import (
	"context"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/internal/dialect/dburl"
)

// RelayWakeup implements dburl.DB: the Subscriber probes the table's sequence
// (SubscriberConfig.WakeProbeInterval, --wake-probe), which needs nothing from the writers and
// works through a transaction pooler; nothing else wakes the relay.
func (*DB) RelayWakeup(cfg outbox.SubscriberConfig, logger watermill.LoggerAdapter) dburl.Wakeup {
	fields := watermill.LogFields{"poll-interval": cfg.PollInterval.String()}
	if cfg.DisableWakeProbe {
		fields["wakeup"] = "none"
		logger.Info("outbox relay polls every --poll-interval: --wake-probe=0 turned the probe off", fields)
		return nil
	}
	interval := cfg.WakeProbeInterval
	if interval == 0 {
		interval = outbox.DefaultWakeProbeInterval
	}
	fields["wakeup"] = "probe"
	fields["wake-probe"] = interval.String()
	fields["wake-probe-idle"] = (outbox.WakeProbeIdleFactor * interval).String()
	logger.Info("outbox relay claims as soon as any writer commits: it probes the table's sequence every --wake-probe (every wake-probe-idle after a second without writes; no signal from writers needed, works through PgBouncer), and polls every --poll-interval", fields)
	return nil
}

// Settle implements dburl.Bench: VACUUM ANALYZE and CHECKPOINT.
func (d *DB) Settle(ctx context.Context, table string) {
	_ = d.Exec(ctx, "VACUUM ANALYZE "+d.Ident(table))
	_ = d.Exec(ctx, "CHECKPOINT")
}

// RawIndex implements dburl.Bench: the pending rows by sequence (created before the seed, so
// that it is built untimed). Without it the loop's ORDER BY sequence LIMIT 1000 walks the
// primary key through every row it has already published, so the loop slows as it drains.
func (d *DB) RawIndex(ctx context.Context, table string) error {
	return d.Exec(ctx, `CREATE INDEX `+d.Ident(table+"_raw_pending_idx")+` ON `+d.Ident(table)+
		` ("sequence") WHERE "published_at" IS NULL AND "dead_lettered_at" IS NULL`)
}

// RawRound implements dburl.Bench: UPDATE … RETURNING over FOR UPDATE SKIP LOCKED, then the
// mark.
func (d *DB) RawRound(ctx context.Context, table string) (int, error) {
	t := d.Ident(table)
	rows, err := d.Pool.Query(ctx, `UPDATE `+t+` SET lease_until = now() + interval '60 seconds', leased_by = 'raw' WHERE sequence IN (
		SELECT sequence FROM `+t+` WHERE published_at IS NULL AND dead_lettered_at IS NULL AND (lease_until IS NULL OR lease_until < now())
		ORDER BY sequence LIMIT 1000 FOR UPDATE SKIP LOCKED) RETURNING sequence, id::text, topic, payload::text, headers::text`)
	if err != nil {
		return 0, err
	}
	seqs, err := dburl.LeasedSeqs(rows)
	rows.Close()
	if err != nil || len(seqs) == 0 {
		return 0, err
	}
	_, err = d.Pool.Exec(ctx, `UPDATE `+t+` SET published_at = now(), lease_until = NULL, leased_by = NULL WHERE sequence = ANY($1)`, seqs)
	return len(seqs), err
}

// RawEventsColumns implements dburl.Bench.
func (*DB) RawEventsColumns() string {
	return `(seq BIGSERIAL PRIMARY KEY, id UUID NOT NULL, topic TEXT NOT NULL, payload JSON NOT NULL, created_at TIMESTAMPTZ NOT NULL DEFAULT now())`
}

// HoldSnapshot implements dburl.Bench: REPEATABLE READ (the oldest xmin stops VACUUM and HOT
// pruning).
func (d *DB) HoldSnapshot(ctx context.Context, table string) (func(), error) {
	conn, err := d.Pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	if _, err := conn.Exec(ctx, `BEGIN ISOLATION LEVEL REPEATABLE READ`); err != nil {
		conn.Release()
		return nil, err
	}
	var n int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM `+d.Ident(table)).Scan(&n); err != nil {
		conn.Release()
		return nil, err
	}
	return func() { _, _ = conn.Exec(context.Background(), `ROLLBACK`); conn.Release() }, nil
}
