// Package health serves a relay's operational endpoints over HTTP: /metrics (any handler, for
// example promhttp's), /healthz (the process answers) and /readyz (every readiness check
// passes: the database is reachable, the subscriptions are running, no destination is in an
// outage). The outbox command's
// `relay --http-addr` serves it; library users who run the relay inside their own service
// mount the same Handler.
package health

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/watermill-outbox/outbox"
)

// DefaultTimeout is Config.Timeout's default.
const DefaultTimeout = time.Second

// Check is one readiness check: Func returns nil when ready, else why not. It must honour
// ctx (Config.Timeout) and be safe for concurrent use.
type Check struct {
	Name string
	Func func(ctx context.Context) error
}

// Config configures Handler. The zero value serves /healthz and an always-ready /readyz.
type Config struct {
	// Metrics is served at /metrics; nil answers 404 there.
	Metrics http.Handler
	// Ready are the checks of /readyz, run one after another within Timeout.
	Ready []Check
	// Timeout bounds one /readyz request's checks together. Default 1s; must not be
	// negative.
	Timeout time.Duration
}

// Validate returns an *outbox.ConfigError naming the first invalid field, or nil.
func (c Config) Validate() error {
	if c.Timeout < 0 {
		return &outbox.ConfigError{Field: "health.Config.Timeout", Reason: "must not be negative"}
	}
	for i, ch := range c.Ready {
		if ch.Name == "" || ch.Func == nil {
			return &outbox.ConfigError{Field: fmt.Sprintf("health.Config.Ready[%d]", i), Reason: "needs a Name and a Func"}
		}
	}
	return nil
}

// Handler returns the handler of /metrics, /healthz and /readyz (GET and HEAD; other paths
// 404). /healthz answers 200 "ok". /readyz answers 200 "ready" when every check passes, else
// 503 with one line per failed check ("database: …"). Errors: an *outbox.ConfigError for an
// invalid cfg. The handler is safe for concurrent use.
func Handler(cfg Config) (http.Handler, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = DefaultTimeout
	}
	mux := http.NewServeMux()
	if cfg.Metrics != nil {
		mux.Handle("GET /metrics", cfg.Metrics)
	}
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), cfg.Timeout)
		defer cancel()
		var failed []string
		for _, c := range cfg.Ready {
			if err := c.Func(ctx); err != nil {
				failed = append(failed, c.Name+": "+oneLine(err))
			}
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if len(failed) > 0 {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte(strings.Join(failed, "\n") + "\n"))
			return
		}
		_, _ = w.Write([]byte("ready\n"))
	})
	return mux, nil
}

func oneLine(err error) string {
	return strings.Join(strings.Fields(err.Error()), " ")
}

// Database is the readiness check "database": the outbox table of schema is reachable in db
// (any handle outbox.Migrate takes) through outbox.CheckTable, one catalog query.
func Database(db any, schema outbox.SchemaConfig) Check {
	return Check{Name: "database", Func: func(ctx context.Context) error {
		return outbox.CheckTable(ctx, db, schema)
	}}
}

// ErrNotRunning is the error of Running's check while a runner has not started or has
// stopped.
var ErrNotRunning = errors.New("not running")

// Running is the readiness check "subscriptions": each of runners is running — its Running
// channel is closed (it subscribed) and its Done channel is not (it has not stopped). A
// forwarder.Forwarder gives both through Running and a channel closed when its Run returns.
func Running(runners ...Runner) Check {
	return Check{Name: "subscriptions", Func: func(context.Context) error {
		for i, r := range runners {
			select {
			case <-r.Done:
				return fmt.Errorf("%s %d of %d stopped: %w", r.Name, i+1, len(runners), ErrNotRunning)
			default:
			}
			select {
			case <-r.Running:
			default:
				return fmt.Errorf("%s %d of %d not subscribed yet: %w", r.Name, i+1, len(runners), ErrNotRunning)
			}
		}
		return nil
	}}
}

// OutageSource is what Destinations reads: *outbox.Subscriber and *outbox.MultiSubscriber.
type OutageSource interface {
	Outages() []outbox.Outage
}

// Destinations is the readiness check "destinations": no destination of sources is in an
// outage (a destination that answered unavailable, whose topics the relay pauses and probes;
// see outbox.UnavailableError). Its error names each such destination, for how long it has
// been down and its last error, for example "redis 127.0.0.1:6379 unavailable for 12s:
// dial tcp 127.0.0.1:6379: connect: connection refused". It reflects what the relay saw when
// it delivered: a destination that is down while no event is bound for it is not reported.
func Destinations(sources ...OutageSource) Check {
	return Check{Name: "destinations", Func: func(context.Context) error {
		var down []string
		for _, src := range sources {
			for _, o := range src.Outages() {
				name := o.Destination
				if name == "" {
					name = "destination"
				}
				msg := fmt.Sprintf("%s unavailable for %s", name, time.Since(o.Since).Round(time.Second))
				if o.LastError != nil {
					msg += ": " + o.LastError.Error()
				}
				down = append(down, msg)
			}
		}
		if len(down) == 0 {
			return nil
		}
		return errors.New(strings.Join(down, "; "))
	}}
}

// Runner is one long runner for Running: Running is closed once it runs, Done once it stopped.
type Runner struct {
	Name          string
	Running, Done <-chan struct{}
}
