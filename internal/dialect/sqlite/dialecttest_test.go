package sqlite

import (
	"fmt"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/watermill-outbox/outbox/internal/dialect"
	"github.com/watermill-outbox/outbox/internal/dialect/dialecttest"
)

// TestDialectSuite runs the shared dialect suite on a SQLite database in a temporary file.
func TestDialectSuite(t *testing.T) {
	db := openPool(t, filepath.Join(t.TempDir(), "suite.db"), 5000)
	ex := dialect.StdSQL{D: db}
	var n atomic.Int64
	dialecttest.Run(t, dialecttest.Harness{Dialect: Dialect{}, Ex: ex, Raw: ex, TextType: "TEXT",
		Table: func(*testing.T) *dialect.Table {
			name := fmt.Sprintf("outbox_%d", n.Add(1))
			return &dialect.Table{Parts: []string{name}, IndexBase: name}
		},
		// The relay's clock: SQLite's times are microseconds from the writers' and relays' clocks.
		At: func(d time.Duration) string { return fmt.Sprint(time.Now().Add(d).UnixMicro()) },
		Deviations: map[string]string{
			// Harmless today: the Subscriber lowers Limit only for a split, which needs a
			// reported walk (ClaimResult.Walked > 0), and the SQLite claim reports none.
			"ClaimLimit": "the SQLite claim caps keyed events at BatchSize and ignores ClaimParams.Limit",
		},
	})
}
