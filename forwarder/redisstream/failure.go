package redisstream

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/internal/netfail"
)

// DefaultMaxEntryBytes is Config.MaxEntryBytes' default: Redis's default proto-max-bulk-len
// (512 MiB), the largest single argument Redis accepts; above it Redis answers a protocol
// error and closes the connection, failing every other command of the pipeline.
const DefaultMaxEntryBytes = 512 << 20

// ErrEntryTooLarge is the cause of a message whose entry (field names and values together) is
// larger than Config.MaxEntryBytes; it is refused before sending, inside an
// *outbox.PermanentError (the outbox dead-letters it at once).
var ErrEntryTooLarge = errors.New("outbox redisstream: entry larger than Config.MaxEntryBytes")

// unavailableReplies are the prefixes of Redis error replies that mean the server cannot serve
// writes at all right now: loading its data set, a replica without its master, a cluster that
// is down or resharding, a script or module busy, out of memory (maxmemory with noeviction),
// a read-only replica after a failover, too few replicas (min-replicas-to-write).
var unavailableReplies = []string{"LOADING", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN", "BUSY", "OOM", "READONLY", "NOREPLICAS"}

// probeTimeout bounds the PING that tells a broken connection from a server that is down.
const probeTimeout = 2 * time.Second

// classify maps an XADD's error to the outbox's failure classes: unreachable (refused, DNS,
// dial timeout), an unavailableReplies answer, or a connection that broke or stopped answering
// while the server does not answer a PING either, is outbox.Unavailable; anything else (a
// WRONGTYPE stream, an error reply of another kind, a broken connection to a server that
// answers) stays an ordinary failure. down is called at most once per batch.
func (p *Publisher) classify(err error, down func() bool) error {
	switch {
	case netfail.Unreachable(err), unavailableReply(err), netfail.Dropped(err) && down():
		return &outbox.UnavailableError{Destination: p.name, Err: err}
	}
	return err
}

// unavailableReply reports whether err is a Redis error reply with an unavailableReplies prefix.
func unavailableReply(err error) bool {
	var re redis.Error
	if !errors.As(err, &re) {
		return false
	}
	msg := re.Error()
	for _, prefix := range unavailableReplies {
		if strings.HasPrefix(msg, prefix) && (len(msg) == len(prefix) || msg[len(prefix)] == ' ') {
			return true
		}
	}
	return false
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
