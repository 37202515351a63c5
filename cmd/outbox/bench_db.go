package main

// The bench's SQL that differs by database: settling a seeded table, the raw loop's round, the
// raw events table, and the held snapshot.

import (
	"context"
	"database/sql"
	"strconv"
	"strings"
	"time"
)

// settle flushes the seed's pages and statistics so that the timed part starts alike.
func (b *bench) settle(table string) {
	switch b.d.url.kind {
	case kindSQLite:
		_ = b.d.exec(b.ctx, `PRAGMA wal_checkpoint(TRUNCATE)`)
	case kindMySQL:
		// InnoDB has no CHECKPOINT statement (it flushes in the background); fresh statistics
		// at least give both loops the same plans.
		_ = b.d.exec(b.ctx, "ANALYZE TABLE "+b.d.ident(table))
	default:
		_ = b.d.exec(b.ctx, "VACUUM ANALYZE "+b.d.ident(table))
		_ = b.d.exec(b.ctx, "CHECKPOINT")
	}
}

// rawIndex gives the raw loop's table the index a hand-written loop on it would have: its
// pending rows by sequence (PostgreSQL and SQLite; created before the seed, so that it is
// built untimed). Without it the loop's ORDER BY sequence LIMIT 1000 walks the primary key
// through every row it has already published: EXPLAIN (ANALYZE, BUFFERS) on PostgreSQL 15,
// 100,000 rows of which the oldest 50,000 published, read 14k buffers per lease (50,000 rows
// removed by the filter), 1.2–1.4k with the index, so the loop slowed as it drained and
// ours ÷ raw read high. MariaDB/MySQL have no partial indexes; their round forces the
// published_at index instead (rawMySQLRound).
func (b *bench) rawIndex(table string) error {
	if b.d.url.kind == kindMySQL {
		return nil
	}
	return b.d.exec(b.ctx, `CREATE INDEX `+b.d.ident(table+"_raw_pending_idx")+` ON `+b.d.ident(table)+
		` ("sequence") WHERE "published_at" IS NULL AND "dead_lettered_at" IS NULL`)
}

// rawRound is one round of the raw loop on the outbox table named table: lease the oldest
// 1,000 claimable rows, read them as a relay would, mark them published. It returns how many
// it marked (0: the backlog is drained).
func (b *bench) rawRound(table string) (int, error) {
	t := b.d.ident(table)
	switch b.d.url.kind {
	case kindSQLite:
		return b.rawSQLiteRound(t)
	case kindMySQL:
		return b.rawMySQLRound(t, b.d.ident(table+"_published_idx"))
	}
	return b.rawPostgresRound(t)
}

// leasedSeqs reads the raw loop's leased rows (sequence, id, topic, payload, headers, as a
// relay would) and returns their sequences. pgx.Rows and *sql.Rows both qualify.
func leasedSeqs(rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
}) ([]int64, error) {
	var seqs []int64
	for rows.Next() {
		var seq int64
		var id, topic, payload, headers string
		if err := rows.Scan(&seq, &id, &topic, &payload, &headers); err != nil {
			return nil, err
		}
		seqs = append(seqs, seq)
	}
	return seqs, rows.Err()
}

// leasedSQL is leasedSeqs of database/sql rows (or the error of the query that returned
// them), which it closes.
func leasedSQL(rows *sql.Rows, err error) ([]int64, error) {
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	return leasedSeqs(rows)
}

// seqList is seqs as an SQL list of integer literals ("1,2,3").
func seqList(seqs []int64) string {
	list := make([]string, len(seqs))
	for i, s := range seqs {
		list[i] = strconv.FormatInt(s, 10)
	}
	return strings.Join(list, ",")
}

func (b *bench) rawPostgresRound(t string) (int, error) {
	rows, err := b.d.pool.Query(b.ctx, `UPDATE `+t+` SET lease_until = now() + interval '60 seconds', leased_by = 'raw' WHERE sequence IN (
		SELECT sequence FROM `+t+` WHERE published_at IS NULL AND dead_lettered_at IS NULL AND (lease_until IS NULL OR lease_until < now())
		ORDER BY sequence LIMIT 1000 FOR UPDATE SKIP LOCKED) RETURNING sequence, id::text, topic, payload::text, headers::text`)
	if err != nil {
		return 0, err
	}
	seqs, err := leasedSeqs(rows)
	rows.Close()
	if err != nil || len(seqs) == 0 {
		return 0, err
	}
	_, err = b.d.pool.Exec(b.ctx, `UPDATE `+t+` SET published_at = now(), lease_until = NULL, leased_by = NULL WHERE sequence = ANY($1)`, seqs)
	return len(seqs), err
}

func (b *bench) rawSQLiteRound(t string) (int, error) {
	now := time.Now().UnixMicro()
	seqs, err := leasedSQL(b.d.sqlDB.QueryContext(b.ctx, `UPDATE `+t+` SET lease_until = $1, leased_by = 'raw' WHERE sequence IN (
		SELECT sequence FROM `+t+` WHERE published_at IS NULL AND dead_lettered_at IS NULL AND (lease_until IS NULL OR lease_until < $2)
		ORDER BY sequence LIMIT 1000) RETURNING sequence, id, topic, payload, headers`, now+60e6, now))
	if err != nil || len(seqs) == 0 {
		return 0, err
	}
	_, err = b.d.sqlDB.ExecContext(b.ctx, `UPDATE `+t+` SET published_at = $1, lease_until = NULL, leased_by = NULL WHERE sequence IN (SELECT value FROM json_each($2))`,
		time.Now().UnixMicro(), "["+seqList(seqs)+"]")
	return len(seqs), err
}

// rawMySQLRound is the raw round on MariaDB/MySQL (quoted table t, quoted published_at
// index idx), which has no UPDATE … RETURNING: one READ COMMITTED transaction locks the oldest
// 1,000 claimable rows (SELECT … FOR UPDATE SKIP LOCKED, reading them as a relay would) and
// leases them; the mark is a second statement, as in the other databases' loops. The mark
// also clears outbox_key, which the outbox table's CHECK constraint ties to published_at (see
// internal/dialect/mysql).
//
// FORCE INDEX on the published_at index, measured on MariaDB 10.11 with 100,000 events of
// which the oldest 50,000 published (Handler_read_* of one lease): left to itself the
// optimizer walks the primary key from the start (EXPLAIN: type index, key PRIMARY) and reads
// 50,999 rows, so a drain rereads its own history each round; through the index it reads the
// NULL entries only, which InnoDB keeps in primary-key order (EXPLAIN: type ref, no filesort),
// 1,000 rows. A hand-written loop on this table would do the same. The index is named
// <table>_published_idx for table names of at most 40 bytes, as the bench's are.
func (b *bench) rawMySQLRound(t, idx string) (int, error) {
	tx, err := b.d.sqlDB.BeginTx(b.ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return 0, err
	}
	defer func() { _ = tx.Rollback() }()
	seqs, err := leasedSQL(tx.QueryContext(b.ctx, "SELECT `sequence`, id, topic, payload, headers FROM "+t+" FORCE INDEX ("+idx+")"+
		" WHERE published_at IS NULL AND dead_lettered_at IS NULL AND (lease_until IS NULL OR lease_until < UTC_TIMESTAMP(6))"+
		" ORDER BY `sequence` LIMIT 1000 FOR UPDATE SKIP LOCKED"))
	if err != nil || len(seqs) == 0 {
		return 0, err
	}
	list := seqList(seqs)
	if _, err := tx.ExecContext(b.ctx, "UPDATE "+t+" SET lease_until = UTC_TIMESTAMP(6) + INTERVAL 60 SECOND, leased_by = 'raw' WHERE `sequence` IN ("+list+")"); err != nil {
		return 0, err
	}
	if err := tx.Commit(); err != nil {
		return 0, err
	}
	_, err = b.d.sqlDB.ExecContext(b.ctx, "UPDATE "+t+" SET published_at = UTC_TIMESTAMP(6), lease_until = NULL, leased_by = NULL, outbox_key = NULL WHERE `sequence` IN ("+list+")")
	return len(seqs), err
}

// rawEventsColumns is the column list of the write path's comparator, a plain events table:
// identity, id, topic, payload, creation time; one index.
func (b *bench) rawEventsColumns() string {
	switch b.d.url.kind {
	case kindSQLite:
		return `(seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL, topic TEXT NOT NULL, payload TEXT NOT NULL, created_at INTEGER NOT NULL DEFAULT (CAST(unixepoch('subsec') * 1000000 AS INTEGER)))`
	case kindMySQL:
		return `(seq BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY, id CHAR(36) NOT NULL, topic VARCHAR(255) NOT NULL, payload JSON NOT NULL, created_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6))`
	}
	return `(seq BIGSERIAL PRIMARY KEY, id UUID NOT NULL, topic TEXT NOT NULL, payload JSON NOT NULL, created_at TIMESTAMPTZ NOT NULL DEFAULT now())`
}

// holdSnapshot opens a transaction that takes a snapshot (reads the table once) and then
// stays idle until release: PostgreSQL REPEATABLE READ (the oldest xmin stops VACUUM and HOT
// pruning), SQLite a read transaction (it stops checkpoints from resetting the log),
// MariaDB/MySQL a consistent-snapshot transaction (its read view stops InnoDB's purge of the
// row versions that leases and marks leave).
func (b *bench) holdSnapshot(table string) (release func(), err error) {
	q := `SELECT count(*) FROM ` + b.d.ident(table)
	if b.d.url.kind == kindPostgres {
		conn, err := b.d.pool.Acquire(b.ctx)
		if err != nil {
			return nil, err
		}
		if _, err := conn.Exec(b.ctx, `BEGIN ISOLATION LEVEL REPEATABLE READ`); err != nil {
			conn.Release()
			return nil, err
		}
		var n int
		if err := conn.QueryRow(b.ctx, q).Scan(&n); err != nil {
			conn.Release()
			return nil, err
		}
		return func() { _, _ = conn.Exec(context.Background(), `ROLLBACK`); conn.Release() }, nil
	}
	conn, err := b.d.sqlDB.Conn(b.ctx)
	if err != nil {
		return nil, err
	}
	begin := []string{`BEGIN DEFERRED`}
	if b.d.url.kind == kindMySQL {
		// A consistent snapshot needs REPEATABLE READ; SET TRANSACTION sets it for the next
		// transaction only, so the pooled connection keeps its session's level.
		begin = []string{`SET TRANSACTION ISOLATION LEVEL REPEATABLE READ`, `START TRANSACTION WITH CONSISTENT SNAPSHOT`}
	}
	for _, st := range begin {
		if _, err := conn.ExecContext(b.ctx, st); err != nil {
			_ = conn.Close()
			return nil, err
		}
	}
	var n int
	if err := conn.QueryRowContext(b.ctx, q).Scan(&n); err != nil {
		_, _ = conn.ExecContext(context.Background(), `ROLLBACK`)
		_ = conn.Close()
		return nil, err
	}
	return func() { _, _ = conn.ExecContext(context.Background(), `ROLLBACK`); _ = conn.Close() }, nil
}
