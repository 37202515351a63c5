// Package redisfail tells which Redis error replies mean that the server cannot serve writes
// at all right now, for the destinations that write to Redis (forwarder/redisstream,
// forwarder/asynq): such a reply makes the destination unavailable (no attempt counted), not
// the event's failure.
package redisfail

import (
	"errors"
	"strings"

	"github.com/redis/go-redis/v9"
)

// unavailableReplies are the prefixes of Redis error replies that mean the server cannot serve
// writes at all right now: loading its data set, a replica without its master, a cluster that
// is down or resharding, a script or module busy, out of memory (maxmemory with noeviction),
// a read-only replica after a failover, too few replicas (min-replicas-to-write).
var unavailableReplies = []string{"LOADING", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN", "BUSY", "OOM", "READONLY", "NOREPLICAS"}

// UnavailableReply reports whether err (or an error it wraps) is a Redis error reply starting
// with one of unavailableReplies' words. Safe for concurrent use.
func UnavailableReply(err error) bool {
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
