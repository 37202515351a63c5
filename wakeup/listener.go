package wakeup

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	"github.com/ThreeDotsLabs/watermill"
)

// Session is one connection of a listener, run by RunListener: it connects, subscribes, calls
// subscribed once the subscription is in place, then hands every received topic to the Hub
// (Hub.Dispatch) until the connection fails or ctx ends. It returns the error that ended it
// (nil or ctx's error when ctx ended). subscribed must be called from the session's own
// goroutine.
type Session func(ctx context.Context, subscribed func()) error

// RunListener runs session until ctx ends, reconnecting with backoff: after a session ends
// with ctx still live, it waits r's backoff (exponential per consecutive failure, capped, with
// jitter) and starts a new one. Each subscribed call marks hub subscribed (which signals every
// listener once: subscriptions poll for what was committed while nothing listened) and resets
// the failure count; the hub is marked unsubscribed when the session ends. Failures are
// logged (WARN, then ERROR from the FailuresBeforeError-th in a row on) with the listener's
// name; the relays keep polling meanwhile. It returns when ctx ends.
func RunListener(ctx context.Context, hub *Hub, r Reconnect, logger watermill.LoggerAdapter, name string, session Session) {
	r = r.WithDefaults()
	logger = orNop(logger).With(watermill.LogFields{"wakeup_listener": name})
	failures := 0
	for ctx.Err() == nil {
		err := session(ctx, func() {
			if failures > 0 {
				logger.Info("wakeup: listener subscribed again", watermill.LogFields{"after_failures": failures})
			} else {
				logger.Debug("wakeup: listener subscribed", nil)
			}
			failures = 0
			hub.SetSubscribed(true)
		})
		hub.SetSubscribed(false)
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			err = errors.New("wakeup: listener session ended")
		}
		failures++
		wait := r.backoff(failures, rand.Float64())
		logFailure(logger, "wakeup: listener disconnected, reconnecting", err, failures, watermill.LogFields{"backoff": wait})
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}
