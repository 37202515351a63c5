package doctor

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/watermill-outbox/outbox/wakeup/sqlitewal"
)

// pgOnly are the checks that exist for PostgreSQL only, skipped elsewhere with the reason.
func pgOnly(dialect string, names ...string) []Check {
	reasons := map[string]string{
		"pooler":           dialect + " has no transaction pooler in front of it to check",
		"wake-probe":       "PostgreSQL only (the relay's sequence probe)",
		"listen-notify":    dialect + " has no LISTEN/NOTIFY",
		"wal-level":        "PostgreSQL only",
		"replication-slot": "PostgreSQL only (the WAL path does not exist yet)",
		"autovacuum":       "PostgreSQL only",
		"dead-tuples":      "PostgreSQL only",
		"jit":              "PostgreSQL only",
	}
	var out []Check
	for _, n := range names {
		out = append(out, skipped(n, reasons[n]))
	}
	return out
}

// sqliteChecks runs the SQLite checks in order.
func sqliteChecks(ctx context.Context, db *sql.DB, cfg Config) []Check {
	out := []Check{sqliteVersion(ctx, db)}
	sc, _ := schemaCheck(ctx, db, cfg, sqlIndexes(db, `SELECT name FROM pragma_index_list(?)`, tableName(cfg.Schema)))
	out = append(out, sc)
	out = append(out, pgOnly("SQLite", "pooler", "wake-probe", "listen-notify")...)
	out = append(out, sqliteWAL(ctx, db))
	out = append(out, pgOnly("SQLite", "wal-level", "replication-slot")...)
	out = append(out, skipped("idle-in-transaction", "SQLite has no server sessions to inspect"), skipped("oldest-xmin", "SQLite has no server sessions to inspect"))
	return append(out, pgOnly("SQLite", "autovacuum", "dead-tuples", "jit")...)
}

// sqliteVersion checks the SQLite library's version (3.42 or later: the schema uses
// unixepoch('subsec')).
func sqliteVersion(ctx context.Context, db *sql.DB) Check {
	const name = "server-version"
	var v string
	if err := db.QueryRowContext(ctx, `SELECT sqlite_version()`).Scan(&v); err != nil {
		return errCheck(name, "reading sqlite_version()", err)
	}
	if !atLeast(v, 3, 42, 0) {
		return failed(name, "SQLite "+v+"; the outbox needs 3.42 or later", "build with modernc.org/sqlite (it bundles a recent SQLite) or link SQLite 3.42+.")
	}
	return ok(name, "SQLite "+v+" (3.42 or later is supported)")
}

// sqliteWAL checks the database's journal mode (WAL, as outbox.SQLiteDSN sets it) and that
// relays in other processes can watch its write-ahead log (wakeup/sqlitewal, what `outbox
// relay` uses).
func sqliteWAL(ctx context.Context, db *sql.DB) Check {
	const name = "wal-watch"
	var mode, file string
	if err := db.QueryRowContext(ctx, `PRAGMA journal_mode`).Scan(&mode); err != nil {
		return errCheck(name, "reading the journal mode", err)
	}
	if err := db.QueryRowContext(ctx, `SELECT file FROM pragma_database_list WHERE name = 'main'`).Scan(&file); err != nil {
		return errCheck(name, "reading the database file's path", err)
	}
	if !strings.EqualFold(mode, "wal") {
		return warned(name, fmt.Sprintf("journal_mode=%s: writers and relays block each other, and relays wake on writes to the database file itself", mode),
			"open every connection with outbox.SQLiteDSN(path), which sets WAL mode (persistent: PRAGMA journal_mode=WAL once also does).")
	}
	if file == "" {
		return skipped(name, "an in-memory database: no other process can relay it")
	}
	w, err := sqlitewal.New(file, nil)
	if err != nil {
		return warned(name, "the database's directory cannot be watched ("+oneLine(err.Error())+"): relays in other processes poll every PollInterval",
			"put the database on a local file system where file notifications work (inotify limits: fs.inotify.max_user_watches).")
	}
	_ = w.Close()
	return ok(name, "journal_mode=wal; relays in other processes wake on each commit (wakeup/sqlitewal can watch "+file+"-wal)")
}

// mysqlChecks runs the MariaDB/MySQL checks in order.
func mysqlChecks(ctx context.Context, db *sql.DB, cfg Config) []Check {
	out := []Check{mysqlVersion(ctx, db)}
	table := tableName(cfg.Schema)
	var schema any // nil: the connection's database
	if i := strings.IndexByte(table, '.'); i >= 0 {
		schema, table = table[:i], table[i+1:]
	}
	sc, _ := schemaCheck(ctx, db, cfg, sqlIndexes(db,
		`SELECT DISTINCT INDEX_NAME FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = COALESCE(?, DATABASE()) AND TABLE_NAME = ?`, schema, table))
	out = append(out, sc)
	out = append(out, pgOnly("MariaDB/MySQL", "pooler", "wake-probe", "listen-notify", "wal-level", "replication-slot")...)
	out = append(out, mysqlOldTransactions(ctx, db, cfg)...)
	return append(out, pgOnly("MariaDB/MySQL", "autovacuum", "dead-tuples", "jit")...)
}

// mysqlVersion checks MariaDB 10.6+ or MySQL 8.0.23+.
func mysqlVersion(ctx context.Context, db *sql.DB) Check {
	const name = "server-version"
	var v string
	if err := db.QueryRowContext(ctx, `SELECT VERSION()`).Scan(&v); err != nil {
		return errCheck(name, "reading VERSION()", err)
	}
	if strings.Contains(strings.ToLower(v), "mariadb") {
		if !atLeast(v, 10, 6, 0) {
			return failed(name, "MariaDB "+v+"; the outbox needs MariaDB 10.6 or later", "upgrade to MariaDB 10.6 or later.")
		}
		return ok(name, "MariaDB "+v+" (10.6 or later is supported)")
	}
	if !atLeast(v, 8, 0, 23) {
		return failed(name, "MySQL "+v+"; the outbox needs MySQL 8.0.23 or later", "upgrade to MySQL 8.0.23 or later.")
	}
	return ok(name, "MySQL "+v+" (8.0.23 or later is supported)")
}

// atLeast reports whether the version at the start of v ("3.45.1", "10.11.6-MariaDB") is at
// least major.minor.patch.
func atLeast(v string, major, minor, patch int) bool {
	if i := strings.IndexFunc(v, func(r rune) bool { return r != '.' && (r < '0' || r > '9') }); i >= 0 {
		v = v[:i]
	}
	want := []int{major, minor, patch}
	parts := strings.Split(v, ".")
	for i := range want {
		n := 0
		if i < len(parts) {
			n, _ = strconv.Atoi(parts[i])
		}
		if n != want[i] {
			return n > want[i]
		}
	}
	return true
}

// mysqlOldTransactions checks InnoDB transactions: sessions idle inside one, and the oldest
// one (its read view keeps purge from removing the row versions every lease and mark leaves).
func mysqlOldTransactions(ctx context.Context, db *sql.DB, cfg Config) []Check {
	type trx struct {
		id          int64
		user        string
		open, sleep int64
		command     string
	}
	rows, err := db.QueryContext(ctx, `SELECT p.ID, COALESCE(p.USER, ''), TIMESTAMPDIFF(SECOND, t.trx_started, NOW()), COALESCE(p.TIME, 0), COALESCE(p.COMMAND, '')
		FROM information_schema.INNODB_TRX t JOIN information_schema.PROCESSLIST p ON p.ID = t.trx_mysql_thread_id
		WHERE p.ID <> CONNECTION_ID() ORDER BY t.trx_started`)
	if err != nil {
		c := errCheck("idle-in-transaction", "reading information_schema.INNODB_TRX (needs the PROCESS privilege)", err)
		return []Check{c, {Name: "oldest-xmin", Verdict: c.Verdict, Detail: c.Detail, Fix: c.Fix}}
	}
	defer rows.Close()
	var all []trx
	for rows.Next() {
		var t trx
		if err := rows.Scan(&t.id, &t.user, &t.open, &t.sleep, &t.command); err != nil {
			c := errCheck("idle-in-transaction", "reading information_schema.INNODB_TRX", err)
			return []Check{c, {Name: "oldest-xmin", Verdict: c.Verdict, Detail: c.Detail, Fix: c.Fix}}
		}
		all = append(all, t)
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		c := errCheck("idle-in-transaction", "reading information_schema.INNODB_TRX", err)
		return []Check{c, {Name: "oldest-xmin", Verdict: c.Verdict, Detail: c.Detail, Fix: c.Fix}}
	}
	idle := ok("idle-in-transaction", "no session is idle inside a transaction")
	var worst *trx
	n := 0
	for i, t := range all {
		if t.command != "Sleep" {
			continue
		}
		if time.Duration(t.sleep)*time.Second >= cfg.OldTxWarn {
			n++
		}
		if worst == nil || t.sleep > worst.sleep {
			worst = &all[i]
		}
	}
	if worst != nil {
		age := time.Duration(worst.sleep) * time.Second
		idle = Check{Name: "idle-in-transaction", Verdict: cfg.grade(age),
			Detail: fmt.Sprintf("oldest: connection %d (user %q) idle in a transaction for %s; %d session(s) idle in a transaction for %s or longer", worst.id, worst.user, byAge(age), n, cfg.OldTxWarn)}
		if idle.Verdict != OK {
			idle.Fix = "end it (the application must COMMIT or ROLLBACK; KILL <id> as a last resort) and bound idle sessions with wait_timeout."
		}
	}
	oldest := ok("oldest-xmin", "no other InnoDB transaction is open")
	if len(all) > 0 {
		t := all[0]
		age := time.Duration(t.open) * time.Second
		oldest = Check{Name: "oldest-xmin", Verdict: cfg.grade(age),
			Detail: fmt.Sprintf("oldest InnoDB transaction: connection %d (user %q, %s) open for %s", t.id, t.user, t.command, byAge(age))}
		if oldest.Verdict != OK {
			oldest.Fix = "end that transaction: while its read view is open, InnoDB purge cannot remove the row versions the relay's leases and marks leave (the history list grows)."
		}
	}
	return []Check{idle, oldest}
}
