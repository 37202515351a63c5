package pgnotify

import (
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// TestUnsupported pins the SQLSTATEs taken as "this server has no LISTEN/NOTIFY": a hot
// standby (25006: cannot execute LISTEN/NOTIFY during recovery), PostgreSQL-compatible
// databases without them (0A000 feature not supported, 42883 unknown pg_notify, 42601 unknown
// LISTEN syntax), and a revoked pg_notify (42501). Anything else is an ordinary failure.
func TestUnsupported(t *testing.T) {
	for code, want := range map[string]bool{
		"25006": true, "0A000": true, "42883": true, "42601": true, "42501": true,
		"57P01": false, "08006": false, "53300": false,
	} {
		err := fmt.Errorf("wrapped: %w", &pgconn.PgError{Code: code})
		if got := unsupported(err); got != want {
			t.Errorf("unsupported(%s) = %v, want %v", code, got, want)
		}
	}
	if unsupported(errors.New("connection refused")) {
		t.Error("a non-server error classified as unsupported")
	}
}
