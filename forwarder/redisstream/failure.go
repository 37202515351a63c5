package redisstream

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/internal/netfail"
	"github.com/watermill-outbox/outbox/internal/redisfail"
)

// DefaultMaxEntryBytes is Config.MaxEntryBytes' default: Redis's default proto-max-bulk-len
// (512 MiB), the largest single argument Redis accepts; above it Redis answers a protocol
// error and closes the connection, failing every other command of the pipeline.
const DefaultMaxEntryBytes = 512 << 20

// ErrEntryTooLarge is the cause of a message whose entry (field names and values together) is
// larger than Config.MaxEntryBytes; it is refused before sending, inside an
// *outbox.PermanentError (the outbox dead-letters it at once).
var ErrEntryTooLarge = errors.New("outbox redisstream: entry larger than Config.MaxEntryBytes")

// probeTimeout bounds the PING that tells a broken connection from a server that is down.
const probeTimeout = 2 * time.Second

// classify maps an XADD's error to the outbox's failure classes: unreachable (refused, DNS,
// dial timeout), a reply of a server that cannot serve writes (redisfail.UnavailableReply), or a connection that broke or stopped answering
// while the server does not answer a PING either, is outbox.Unavailable; anything else (a
// WRONGTYPE stream, an error reply of another kind, a broken connection to a server that
// answers) stays an ordinary failure. down is called at most once per batch.
func (p *Publisher) classify(err error, down func() bool) error {
	switch {
	case netfail.Unreachable(err), redisfail.UnavailableReply(err), netfail.Dropped(err) && down():
		return &outbox.UnavailableError{Destination: p.name, Err: err}
	}
	return err
}

// downCheck returns a function that reports, once per batch, whether the server fails to
// answer a PING within probeTimeout.
func (p *Publisher) downCheck(ctx context.Context) func() bool {
	var once sync.Once
	var down bool
	return func() bool {
		once.Do(func() {
			ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), probeTimeout)
			defer cancel()
			down = p.client.Ping(ctx).Err() != nil
		})
		return down
	}
}

// destinationName names the server for *outbox.UnavailableError.
func destinationName(c redis.UniversalClient) string {
	if rc, ok := c.(*redis.Client); ok {
		return "redis " + rc.Options().Addr
	}
	return "redis"
}
