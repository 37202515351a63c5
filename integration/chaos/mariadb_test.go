package chaos

import (
	"math/rand/v2"
	"os"
	"testing"
	"time"
)

// TestChaosMariaDB runs the kill9 and writers cells against the shared MariaDB/MySQL test
// database (internal/mariadbtest; unique tables, dropped with their <table>_keys companions at
// the end) with the relays' --db a mysql:// URL, and a private Redis server as the destination;
// then the restart cells (mariadb-restart-term: SIGTERM, mariadb-restart-kill: SIGKILL, each
// followed by a start on the same data directory and port) against a private mariadbd
// initialised in a temp dir (a missing mariadbd skips them, or fails them when CI=true).
// OUTBOX_CHAOS=full selects the full sizes (those of TestChaos); the default is the short run.
// An unreachable MariaDB skips the test, or fails it when CI=true.
func TestChaosMariaDB(t *testing.T) {
	sz := shortSizes
	if os.Getenv("OUTBOX_CHAOS") == "full" {
		sz = fullSizes
	}
	s := &suite{sz: sz, seed: uint64(time.Now().UnixNano())}
	s.db = newMySQLBackend(t)
	dir := t.TempDir()
	s.rng = rand.New(rand.NewPCG(s.seed, 13))
	s.redis = startRedis(t, dir)
	s.bin = buildOutbox(t, dir)
	t.Logf("chaos %s run on MariaDB %s, Redis on %s, seed %d", sz.mode, s.db.url(), s.redis.Addr(), s.seed)

	t.Run("kill9", func(t *testing.T) { s.kill9(t, "mariadb-kill9", true) })
	t.Run("writers", func(t *testing.T) { s.writers(t, "mariadb-writers") })
	// The restarts use a private server: the shared one is never stopped.
	t.Run("restart", func(t *testing.T) {
		srv := startMariaDB(t)
		shared := s.db
		s.db = newPrivateMySQLBackend(t, srv)
		defer func() { s.db = shared }()
		for _, mode := range []string{"term", "kill"} {
			t.Run(mode, func(t *testing.T) { s.dbRestart(t, "mariadb-restart-"+mode, mode) })
		}
	})
	s.finish(t)
}
