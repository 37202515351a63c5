package doctor

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/watermill-outbox/outbox/wakeup/pgnotify"
)

// postgresChecks runs the PostgreSQL checks in order.
func postgresChecks(ctx context.Context, pool *pgxpool.Pool, cfg Config) []Check {
	qt := pgx.Identifier(strings.Split(tableName(cfg.Schema), ".")).Sanitize()
	out := []Check{pgVersion(ctx, pool)}
	sc, exists := schemaCheck(ctx, pool, cfg, pgIndexes(pool, cfg.Schema))
	out = append(out, sc)
	out = append(out, pgPooler(ctx, pool.Config().ConnConfig))
	if exists {
		out = append(out, pgWakeProbe(ctx, pool, qt))
	} else {
		out = append(out, skipped("wake-probe", "no outbox table"))
	}
	out = append(out, pgListenNotify(ctx, pool.Config().ConnConfig, cfg))
	out = append(out, pgWAL(ctx, pool, cfg)...)
	out = append(out, pgOldTransactions(ctx, pool, cfg)...)
	if exists {
		out = append(out, pgAutovacuum(ctx, pool, qt)...)
	} else {
		out = append(out, skipped("autovacuum", "no outbox table"), skipped("dead-tuples", "no outbox table"))
	}
	return append(out, pgJIT(ctx, pool))
}

// pgVersion checks the server version against MinPostgresVersion.
func pgVersion(ctx context.Context, pool *pgxpool.Pool) Check {
	const name = "server-version"
	var (
		num     int
		version string
	)
	if err := pool.QueryRow(ctx, `SELECT current_setting('server_version_num')::int, current_setting('server_version')`).Scan(&num, &version); err != nil {
		return errCheck(name, "reading the server version", err)
	}
	if num < MinPostgresVersion {
		return failed(name, fmt.Sprintf("PostgreSQL %s; the outbox needs PostgreSQL 13 or later", version), "upgrade the server to PostgreSQL 13 or later.")
	}
	return ok(name, "PostgreSQL "+version+" (13 or later is supported)")
}

// pgPooler finds out whether the connection settings go through a transaction-mode pooler
// (PgBouncer pool_mode=transaction): two client connections open at once that run on the
// same server backend, or a session setting of one connection that the other sees, or a
// connection whose backend changes between statements, can only be a pooler lending server
// sessions per transaction. Behind one, it checks the exec mode: pgx's default
// (cache_statement) prepares named statements on a server session that other clients then
// share, so it tries that on both connections.
func pgPooler(ctx context.Context, cc *pgx.ConnConfig) Check {
	const name = "pooler"
	c1, err := pgx.ConnectConfig(ctx, cc.Copy())
	if err != nil {
		return errCheck(name, "connecting", err)
	}
	defer c1.Close(context.WithoutCancel(ctx))
	c2, err := pgx.ConnectConfig(ctx, cc.Copy())
	if err != nil {
		return errCheck(name, "connecting a second time", err)
	}
	defer c2.Close(context.WithoutCancel(ctx))
	token := randomHex(8)
	// Simple protocol: nothing prepared, so the detection works in every exec mode.
	simple := pgx.QueryExecModeSimpleProtocol
	var pid1, pid2, pid1again int
	var seen string
	if err := c1.QueryRow(ctx, `SELECT pg_backend_pid(), set_config('outbox_doctor.probe', $1, false)`, simple, token).Scan(&pid1, new(string)); err != nil {
		return errCheck(name, "reading the backend of a connection", err)
	}
	if err := c2.QueryRow(ctx, `SELECT pg_backend_pid(), coalesce(current_setting('outbox_doctor.probe', true), '')`, simple).Scan(&pid2, &seen); err != nil {
		return errCheck(name, "reading the backend of a second connection", err)
	}
	if err := c1.QueryRow(ctx, `SELECT pg_backend_pid()`, simple).Scan(&pid1again); err != nil {
		return errCheck(name, "reading the backend of a connection again", err)
	}
	pooled := pid1 == pid2 || seen == token || pid1 != pid1again
	mode := cc.DefaultQueryExecMode
	if !pooled {
		return ok(name, fmt.Sprintf("direct sessions (two connections ran on their own backends); exec mode %s", execModeName(mode)))
	}
	const what = "transaction-mode pooler detected (two client connections shared one server session)"
	if mode == pgx.QueryExecModeCacheStatement {
		// Both prepare the same statement name on whichever server session they get.
		// (Exec without arguments would take the simple protocol and prepare nothing.)
		q := `SELECT $1::int /* outbox doctor ` + token + ` */`
		err1 := c1.QueryRow(ctx, q, 1).Scan(new(int))
		err2 := c2.QueryRow(ctx, q, 1).Scan(new(int))
		if err := errors.Join(err1, err2); err != nil {
			return failed(name, what+fmt.Sprintf("; pgx's default exec mode cache_statement fails through it: %s", oneLine(err.Error())),
				"add default_query_exec_mode=exec (or cache_describe) to the database URL, or run PgBouncer 1.21+ with max_prepared_statements set.")
		}
	}
	return warned(name, what+fmt.Sprintf("; exec mode %s works through it; session state (LISTEN, session advisory locks, SET) does not survive a transaction", execModeName(mode)),
		"nothing to do for `outbox relay` (its wake probe needs no LISTEN); give wakeup/pgnotify a DSN that connects directly to PostgreSQL (or through a session-mode pooler).")
}

// execModeName is the DSN spelling of a pgx exec mode.
func execModeName(m pgx.QueryExecMode) string {
	switch m {
	case pgx.QueryExecModeCacheStatement:
		return "cache_statement"
	case pgx.QueryExecModeCacheDescribe:
		return "cache_describe"
	case pgx.QueryExecModeDescribeExec:
		return "describe_exec"
	case pgx.QueryExecModeExec:
		return "exec"
	case pgx.QueryExecModeSimpleProtocol:
		return "simple_protocol"
	}
	return fmt.Sprint(int(m))
}

// randomHex is n random bytes in hex.
func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// pgWakeProbe checks what the relay's wake probe reads: the identity sequence behind
// "sequence", readable, with CACHE 1 (values served from a larger cache do not move it).
func pgWakeProbe(ctx context.Context, pool *pgxpool.Pool, qt string) Check {
	const name = "wake-probe"
	var (
		seq   string
		cache int64
	)
	err := pool.QueryRow(ctx, `SELECT s.seqrelid::regclass::text, s.seqcache FROM pg_sequence s WHERE s.seqrelid = pg_get_serial_sequence($1, 'sequence')::regclass`, qt).Scan(&seq, &cache)
	if errors.Is(err, pgx.ErrNoRows) {
		return failed(name, "no identity sequence behind the table's \"sequence\" column: the relay's wake probe cannot run and relays poll every PollInterval",
			"recreate the table with "+"the DDL of outbox.SchemaSQL (sequence is GENERATED ALWAYS AS IDENTITY).")
	}
	if err != nil {
		return errCheck(name, "reading the table's sequence", err)
	}
	if _, err := pool.Exec(ctx, `SELECT pg_sequence_last_value($1::regclass)`, seq); err != nil {
		return errCheck(name, "reading the sequence as the relay's probe does", err)
	}
	if cache != 1 {
		return warned(name, fmt.Sprintf("sequence %s has CACHE %d: events numbered from a writer's cache do not move it, so the relay's wake probe misses them until the next poll", seq, cache),
			fmt.Sprintf("ALTER TABLE %s ALTER COLUMN \"sequence\" SET CACHE 1.", qt))
	}
	return ok(name, fmt.Sprintf("sequence %s (CACHE 1) is readable: relays started by `outbox relay` claim within milliseconds of a commit", seq))
}

// pgListenNotify sends a signal through wakeup/pgnotify on a channel of its own and waits for
// it on the listener, end to end: the self-probe of pgnotify.New (LISTEN on one connection,
// NOTIFY from another), then a Signal that must reach Listen.
func pgListenNotify(ctx context.Context, cc *pgx.ConnConfig, cfg Config) Check {
	const name = "listen-notify"
	verdict, fix := Warn, "nothing to do if the relays use `outbox relay` or the wake probe; relays with wakeup/pgnotify need a DSN that connects directly to PostgreSQL (or a session-mode pooler) for pgnotify.New."
	if cfg.Wakeup == WakeListen {
		verdict, fix = Fail, "give wakeup/pgnotify a DSN that connects directly to PostgreSQL (or a session-mode pooler), not through a transaction-mode pooler; or drop it and use the wake probe (SubscriberConfig.WakeProbeInterval, on by default)."
	}
	bad := func(detail string) Check { return Check{Name: name, Verdict: verdict, Detail: detail, Fix: fix} }
	channel := "outbox_doctor_" + randomHex(6)
	pctx, cancel := context.WithTimeout(ctx, cfg.ProbeTimeout+10*time.Second)
	defer cancel()
	start := time.Now()
	w, err := pgnotify.New(pctx, cc.Copy(), pgnotify.Config{Channel: channel, ProbeTimeout: cfg.ProbeTimeout}, nil)
	switch {
	case errors.Is(err, pgnotify.ErrProbeFailed):
		return bad(fmt.Sprintf("a NOTIFY did not reach the LISTEN connection within %s: the connections do not keep their sessions (a transaction-mode pooler)", cfg.ProbeTimeout))
	case errors.Is(err, pgnotify.ErrListenUnsupported), errors.Is(err, pgnotify.ErrNotifyUnsupported):
		return bad("the server refuses LISTEN/NOTIFY: " + oneLine(err.Error()))
	case err != nil:
		return bad("LISTEN/NOTIFY wakeup could not start: " + oneLine(err.Error()))
	}
	defer w.Close()
	const topic = "outbox.doctor"
	lctx, lcancel := context.WithTimeout(ctx, cfg.ProbeTimeout+5*time.Second)
	defer lcancel()
	ch := w.Listen(lctx, func(t string) bool { return t == topic })
	// The first value says the listener is subscribed; the second is the signal.
	select {
	case <-ch:
	case <-lctx.Done():
		return bad("the LISTEN connection did not subscribe within " + (cfg.ProbeTimeout + 5*time.Second).String())
	}
	sent := time.Now()
	w.Signal(topic)
	timer := time.NewTimer(cfg.ProbeTimeout)
	defer timer.Stop()
	select {
	case <-ch:
	case <-timer.C:
		return bad(fmt.Sprintf("a signal sent through wakeup/pgnotify did not reach its listener within %s", cfg.ProbeTimeout))
	}
	return ok(name, fmt.Sprintf("a signal sent through wakeup/pgnotify (NOTIFY) reached its listener (LISTEN) in %s (set-up and self-probe %s)",
		byAge(time.Since(sent)), byAge(sent.Sub(start))))
}

// pgWAL reports wal_level and, when cfg.Slot names one, the state of that replication slot.
func pgWAL(ctx context.Context, pool *pgxpool.Pool, cfg Config) []Check {
	var level string
	if err := pool.QueryRow(ctx, `SELECT current_setting('wal_level')`).Scan(&level); err != nil {
		return []Check{errCheck("wal-level", "reading wal_level", err), skipped("replication-slot", "wal_level could not be read")}
	}
	if cfg.Slot == "" {
		note := ""
		if level != "logical" {
			note = "; a logical replication slot (the WAL path) will need wal_level=logical"
		}
		return []Check{ok("wal-level", "wal_level="+level+note),
			skipped("replication-slot", "no slot configured: the outbox reads its table, it has no WAL path (logical replication) yet")}
	}
	walCheck := ok("wal-level", "wal_level=logical")
	if level != "logical" {
		walCheck = failed("wal-level", fmt.Sprintf("wal_level=%s: logical replication slot %q cannot be used", level, cfg.Slot),
			"set wal_level = logical in postgresql.conf and restart the server.")
	}
	var (
		plugin, slotType, walStatus string
		active                      bool
		retained                    *int64
	)
	err := pool.QueryRow(ctx, `SELECT coalesce(plugin, ''), slot_type, active, coalesce(wal_status, ''),
		(pg_current_wal_lsn() - coalesce(confirmed_flush_lsn, restart_lsn))::bigint
		FROM pg_replication_slots WHERE slot_name = $1`, cfg.Slot).Scan(&plugin, &slotType, &active, &walStatus, &retained)
	if errors.Is(err, pgx.ErrNoRows) {
		return []Check{walCheck, failed("replication-slot", fmt.Sprintf("replication slot %q does not exist", cfg.Slot),
			"create it (SELECT pg_create_logical_replication_slot(…, 'pgoutput')) or name an existing slot.")}
	}
	if err != nil {
		return []Check{walCheck, errCheck("replication-slot", "reading pg_replication_slots", err)}
	}
	lag := "unknown"
	if retained != nil {
		lag = fmt.Sprintf("%d bytes", *retained)
	}
	detail := fmt.Sprintf("slot %q (%s %s): active=%t, wal_status=%s, WAL behind its consumer: %s", cfg.Slot, slotType, plugin, active, walStatus, lag)
	switch {
	case walStatus == "lost":
		return []Check{walCheck, failed("replication-slot", detail+": the WAL it needs was removed", "drop and recreate the slot; events written meanwhile must be re-read from the table.")}
	case !active:
		return []Check{walCheck, warned("replication-slot", detail+": nobody consumes it, so it retains WAL (disk) and its catalog xmin",
			"start its consumer, or drop the slot (SELECT pg_drop_replication_slot(…)) if it is abandoned.")}
	case walStatus == "unreserved":
		return []Check{walCheck, warned("replication-slot", detail+": it is about to lose WAL it needs (max_slot_wal_keep_size)",
			"let the consumer catch up, or raise max_slot_wal_keep_size.")}
	}
	return []Check{walCheck, ok("replication-slot", detail)}
}

// pgOldTransactions checks the sessions idle inside a transaction and the oldest snapshot
// (backend_xmin) of the cluster: both keep VACUUM and HOT pruning from removing the row
// versions every lease and mark leaves behind. This connection's own backend and autovacuum
// workers are not counted.
func pgOldTransactions(ctx context.Context, pool *pgxpool.Pool, cfg Config) []Check {
	var (
		idleN                     int
		idlePID                   *int
		idleWho, idleApp, idleSQL string
		idleFor                   *float64
		idleXmin                  bool
	)
	err := pool.QueryRow(ctx, `WITH idle AS (
		SELECT pid, coalesce(usename::text, '') AS who, coalesce(application_name, '') AS app, left(coalesce(query, ''), 80) AS q,
			extract(epoch FROM now() - state_change)::float8 AS secs, backend_xmin IS NOT NULL AS xmin
		FROM pg_stat_activity
		WHERE state IN ('idle in transaction', 'idle in transaction (aborted)') AND pid <> pg_backend_pid())
	SELECT (SELECT count(*) FROM idle WHERE secs >= $1)::int, o.pid, coalesce(o.who, ''), coalesce(o.app, ''), coalesce(o.q, ''), o.secs, coalesce(o.xmin, false)
	FROM (SELECT 1) one LEFT JOIN LATERAL (SELECT * FROM idle ORDER BY secs DESC LIMIT 1) o ON true`,
		cfg.OldTxWarn.Seconds()).Scan(&idleN, &idlePID, &idleWho, &idleApp, &idleSQL, &idleFor, &idleXmin)
	var idle Check
	const fixIdle = "end it (the application must COMMIT or ROLLBACK; pg_terminate_backend(pid) as a last resort) and bound such sessions with idle_in_transaction_session_timeout (e.g. ALTER DATABASE … SET idle_in_transaction_session_timeout = '5min')."
	switch {
	case err != nil:
		idle = errCheck("idle-in-transaction", "reading pg_stat_activity", err)
	case idlePID == nil:
		idle = ok("idle-in-transaction", "no session is idle inside a transaction")
	default:
		age := time.Duration(*idleFor * float64(time.Second))
		holding := ""
		if idleXmin {
			holding = " holding a snapshot"
		}
		detail := fmt.Sprintf("oldest: pid %d (user %q, application %q) idle in a transaction for %s%s, last statement %q; %d session(s) idle in a transaction for %s or longer",
			*idlePID, idleWho, idleApp, byAge(age), holding, idleSQL, idleN, cfg.OldTxWarn)
		idle = Check{Name: "idle-in-transaction", Verdict: cfg.grade(age), Detail: detail}
		if idle.Verdict != OK {
			idle.Fix = fixIdle
		}
	}
	var (
		xPID              *int
		xWho, xApp, state string
		xAge              *int64
		xFor              *float64
	)
	err = pool.QueryRow(ctx, `SELECT o.pid, coalesce(o.who, ''), coalesce(o.app, ''), coalesce(o.state, ''), o.xids, o.secs
	FROM (SELECT 1) one LEFT JOIN LATERAL (
		SELECT pid, usename::text AS who, application_name AS app, state, age(backend_xmin)::bigint AS xids,
			extract(epoch FROM now() - coalesce(xact_start, query_start, backend_start))::float8 AS secs
		FROM pg_stat_activity
		WHERE backend_xmin IS NOT NULL AND pid <> pg_backend_pid() AND backend_type <> 'autovacuum worker'
		ORDER BY age(backend_xmin) DESC, secs DESC LIMIT 1) o ON true`).Scan(&xPID, &xWho, &xApp, &state, &xAge, &xFor)
	var xmin Check
	switch {
	case err != nil:
		xmin = errCheck("oldest-xmin", "reading pg_stat_activity", err)
	case xPID == nil:
		xmin = ok("oldest-xmin", "no other session holds a snapshot")
	default:
		age := time.Duration(*xFor * float64(time.Second))
		xmin = Check{Name: "oldest-xmin", Verdict: cfg.grade(age),
			Detail: fmt.Sprintf("oldest snapshot: pid %d (user %q, application %q, %s), transaction open for %s, xmin %d transactions old", *xPID, xWho, xApp, state, byAge(age), *xAge)}
		if xmin.Verdict != OK {
			xmin.Fix = "end that transaction: while it is open, VACUUM cannot remove the row versions the relay's leases and marks leave, and the table and its indexes grow; bound transactions with idle_in_transaction_session_timeout / statement_timeout and run long reports on a replica without hot_standby_feedback."
		}
	}
	return []Check{idle, xmin}
}

// pgAutovacuum checks that autovacuum runs on the outbox table and reports its dead tuples.
func pgAutovacuum(ctx context.Context, pool *pgxpool.Pool, qt string) []Check {
	var (
		global, counts string
		relopts        []string
	)
	err := pool.QueryRow(ctx, `SELECT current_setting('autovacuum'), current_setting('track_counts'), coalesce(c.reloptions, '{}')
		FROM pg_class c WHERE c.oid = to_regclass($1)`, qt).Scan(&global, &counts, &relopts)
	var av Check
	switch {
	case err != nil:
		av = errCheck("autovacuum", "reading the autovacuum settings", err)
	case !pgBool(global, true):
		av = failed("autovacuum", "autovacuum is off for the whole server: the row versions every lease and mark leaves are never removed automatically",
			"set autovacuum = on in postgresql.conf (or ALTER SYSTEM SET autovacuum = on) and reload.")
	case !pgBool(counts, true):
		av = failed("autovacuum", "track_counts is off: autovacuum cannot tell which tables need it",
			"set track_counts = on in postgresql.conf and reload.")
	default:
		av = ok("autovacuum", "autovacuum is on for the server and the table")
		for _, o := range relopts {
			k, v, _ := strings.Cut(o, "=")
			if k == "autovacuum_enabled" && !pgBool(v, true) {
				av = failed("autovacuum", fmt.Sprintf("the outbox table has autovacuum_enabled=%s: its dead row versions (every lease and mark leaves one) are never removed automatically", v),
					fmt.Sprintf("ALTER TABLE %s RESET (autovacuum_enabled).", qt))
			}
		}
		if len(relopts) > 0 && av.Verdict == OK {
			av.Detail += " (table options: " + strings.Join(relopts, ", ") + ")"
		}
	}
	var (
		live, dead   int64
		since        *float64
		found        bool
		vacuumed     string
		autovacCount int64
	)
	err = pool.QueryRow(ctx, `SELECT n_live_tup, n_dead_tup, extract(epoch FROM now() - greatest(last_autovacuum, last_vacuum))::float8, autovacuum_count, true
		FROM pg_stat_user_tables WHERE relid = to_regclass($1)`, qt).Scan(&live, &dead, &since, &autovacCount, &found)
	if errors.Is(err, pgx.ErrNoRows) {
		return []Check{av, skipped("dead-tuples", "no statistics for the table (track_counts off, or a new table)")}
	}
	if err != nil {
		return []Check{av, errCheck("dead-tuples", "reading pg_stat_user_tables", err)}
	}
	vacuumed = "never vacuumed"
	if since != nil {
		vacuumed = "last vacuumed " + byAge(time.Duration(*since*float64(time.Second))) + " ago"
	}
	detail := fmt.Sprintf("%d live and %d dead row versions, %s (%d autovacuum runs)", live, dead, vacuumed, autovacCount)
	if dead >= DeadTuplesWarn && dead > live {
		return []Check{av, warned("dead-tuples", detail+": more dead row versions than live ones",
			"look for what keeps autovacuum from removing them (the oldest-xmin and autovacuum checks), then VACUUM the table; on a busy outbox lower its autovacuum_vacuum_scale_factor (e.g. ALTER TABLE … SET (autovacuum_vacuum_scale_factor = 0.01)).")}
	}
	return []Check{av, ok("dead-tuples", detail)}
}

// pgBool reads a PostgreSQL boolean setting or reloption value; def for an unknown spelling.
func pgBool(v string, def bool) bool {
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "on", "true", "yes", "1", "t", "y":
		return true
	case "off", "false", "no", "0", "f", "n":
		return false
	}
	return def
}

// pgJIT checks jit for the connecting role (role, database and server settings combined).
func pgJIT(ctx context.Context, pool *pgxpool.Pool) Check {
	const name = "jit"
	var jit, role, cost string
	if err := pool.QueryRow(ctx, `SELECT current_setting('jit'), current_user::text, current_setting('jit_above_cost')`).Scan(&jit, &role, &cost); err != nil {
		return errCheck(name, "reading jit", err)
	}
	if pgBool(jit, false) {
		return warned(name, fmt.Sprintf("jit=on for role %q (jit_above_cost %s): a statement planned above that cost is compiled first, which takes 100+ ms — ten times a claim. The relay turns JIT off in its own transactions; `outbox status`, dead-letter commands, your reports and older relays on this role do not", role, cost),
			fmt.Sprintf("ALTER ROLE %s SET jit = off (new sessions of the role get it).", pgx.Identifier{role}.Sanitize()))
	}
	return ok(name, fmt.Sprintf("jit=off for role %q", role))
}
