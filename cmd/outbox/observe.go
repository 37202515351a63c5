package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/console"
	"github.com/watermill-outbox/outbox/health"
	"github.com/watermill-outbox/outbox/metrics"
	"github.com/watermill-outbox/outbox/metrics/prom"
)

// obsFlags are the relay's observability flags.
type obsFlags struct {
	httpAddr        string
	metricsTopics   []string
	backlogInterval time.Duration
	console         bool
	consoleToken    string
}

func (f *obsFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&f.httpAddr, "http-addr", "", "serve /metrics (Prometheus), /healthz and /readyz on this address (e.g. 127.0.0.1:9464); empty = off")
	fl.StringSliceVar(&f.metricsTopics, "metrics-topic", nil, "topic pattern that labels metrics (a topic is counted under the first pattern it matches, else \"other\"); repeatable; default: each topic, up to 100")
	fl.DurationVar(&f.backlogInterval, "backlog-interval", metrics.DefaultBacklogInterval, "how often the backlog gauges are sampled (one query), at least 100ms")
	fl.BoolVar(&f.console, "console", false, "also serve the operator console (see outbox console) on --http-addr, with this relay's destination outages; read-only unless --console-token")
	fl.StringVar(&f.consoleToken, "console-token", "", "operator token that enables the console's actions (with --console)")
}

// relayStats counts the relay's outcomes for the stop summary; it also serves the metrics and
// health endpoints when --http-addr is set.
type relayStats struct {
	flags                   obsFlags
	started                 time.Time
	delivered, failed, dead atomic.Int64
	obs                     *metrics.Observer // nil without --http-addr
	rec                     *prom.Recorder
	reg                     *prometheus.Registry
	srv                     *http.Server
	ln                      net.Listener
	con                     *console.Console // nil without --console
}

// newRelayStats validates the flags and, with --http-addr, listens on it (a usage error when
// the address is bad or taken).
func newRelayStats(f obsFlags) (*relayStats, error) {
	s := &relayStats{flags: f, started: time.Now()}
	mcfg := metrics.Config{TopicPatterns: f.metricsTopics, BacklogInterval: f.backlogInterval}
	if err := mcfg.Validate(); err != nil {
		var ce *outbox.ConfigError
		if errors.As(err, &ce) && ce.Field == "metrics.Config.BacklogInterval" {
			return nil, badFlag("backlog-interval", fmt.Sprintf(": %s", ce.Reason))
		}
		return nil, badFlag("metrics-topic", fmt.Sprintf(": %s", ce.Reason))
	}
	if f.httpAddr == "" {
		if f.console || f.consoleToken != "" {
			return nil, &usageError{errors.New("--console and --console-token need --http-addr (the address the console is served on)")}
		}
		return s, nil
	}
	if f.consoleToken != "" && !f.console {
		return nil, &usageError{errors.New("--console-token goes with --console")}
	}
	s.reg = prometheus.NewRegistry()
	s.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), readBuildInfo().collector())
	var err error
	if s.rec, err = prom.New(s.reg); err != nil {
		return nil, err
	}
	if s.obs, err = metrics.New(s.rec, mcfg); err != nil {
		return nil, err
	}
	if s.ln, err = net.Listen("tcp", f.httpAddr); err != nil {
		return nil, badFlag("http-addr", fmt.Sprintf(": %v", err))
	}
	return s, nil
}

// hooks are the Hooks every Subscriber of the relay gets.
func (s *relayStats) hooks() outbox.Hooks {
	own := outbox.Hooks{
		OnDelivered:    func(outbox.DeliveredInfo) { s.delivered.Add(1) },
		OnFailed:       func(outbox.FailedInfo) { s.failed.Add(1) },
		OnDeadLettered: func(outbox.FailedInfo) { s.dead.Add(1) },
	}
	if s.obs == nil {
		return own
	}
	return metrics.ComposeHooks(own, s.obs.Hooks())
}

// wrap returns the destination publisher, timed per call under the destination's kind
// ("kafka", "rabbitmq", "redis-streams", "webhook", "asynq") when metrics are on.
func (s *relayStats) wrap(pub message.Publisher, kind destKind) message.Publisher {
	if s.obs == nil {
		return pub
	}
	return s.obs.Publisher(pub, strings.ReplaceAll(strings.ToLower(string(kind)), " ", "-"))
}

// serve starts the backlog sampler and the HTTP endpoints (with --http-addr) until ctx ends.
// db and schema are the readiness check's database; runners the forwarders; outages the
// subscribers whose destination outages make /readyz fail.
func (s *relayStats) serve(ctx context.Context, sub metrics.BacklogSource, outages []health.OutageSource, db any, schema outbox.SchemaConfig, runners []health.Runner, logger watermill.LoggerAdapter) {
	if s.obs == nil {
		return
	}
	go s.obs.SampleBacklog(ctx, sub)
	go s.obs.WatchSubscriptions(ctx, runners...)
	h, err := health.Handler(health.Config{
		Metrics: promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{}),
		Ready:   []health.Check{health.Database(db, schema), health.Running(runners...), health.Destinations(outages...)},
	})
	if err != nil {
		panic(err) // the config is fixed above
	}
	if s.con != nil {
		mux := http.NewServeMux()
		for _, p := range []string{"/metrics", "/healthz", "/readyz"} {
			mux.Handle(p, h)
		}
		mux.Handle("/", s.con)
		h = mux
	}
	s.srv = &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := s.srv.Serve(s.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logger.Error("outbox relay: http server failed", err, nil)
		}
	}()
	logger.Info("outbox relay serving /metrics, /healthz and /readyz", watermill.LogFields{"http-addr": s.ln.Addr().String()})
	if s.con != nil {
		logger.Info("outbox relay serving the operator console", watermill.LogFields{"url": "http://" + s.ln.Addr().String() + "/", "read-only": s.con.ReadOnly()})
	}
}

// outageSources is the outages of several subscribers, for the console.
type outageSources []health.OutageSource

func (o outageSources) Outages() []outbox.Outage {
	var out []outbox.Outage
	for _, src := range o {
		out = append(out, src.Outages()...)
	}
	return out
}

// DestinationLimits merges the flow control of the subscribers that have any, for the
// console's destinations page (the relay's subscribers share one configuration).
func (o outageSources) DestinationLimits() map[string]outbox.DestinationLimit {
	var out map[string]outbox.DestinationLimit
	for _, src := range o {
		if l, ok := src.(console.LimitSource); ok {
			for name, lim := range l.DestinationLimits() {
				if out == nil {
					out = map[string]outbox.DestinationLimit{}
				}
				out[name] = lim
			}
		}
	}
	return out
}

// openConsole makes the console that serve mounts (with --console) and creates its audit
// table.
func (s *relayStats) openConsole(ctx context.Context, db any, schema outbox.SchemaConfig, outages []health.OutageSource, logger watermill.LoggerAdapter) error {
	if !s.flags.console {
		return nil
	}
	c, err := console.New(console.Config{DB: db, Schema: schema, Token: s.flags.consoleToken, Outages: outageSources(outages), Logger: logger})
	if err != nil {
		return err
	}
	if err := c.Migrate(ctx); err != nil {
		_ = c.Close()
		return err
	}
	s.con = c
	return nil
}

// close stops the HTTP server (if any).
func (s *relayStats) close() {
	if s.con != nil {
		defer s.con.Close()
	}
	if s.srv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = s.srv.Shutdown(ctx)
	} else if s.ln != nil {
		_ = s.ln.Close()
	}
}

// summary are the fields of the stop line: what this relay did since it started and what is
// pending in the table now (-1 when the backlog query failed).
func (s *relayStats) summary(ctx context.Context, sub metrics.BacklogSource) watermill.LogFields {
	pending := int64(-1)
	qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if b, err := sub.Backlog(qctx); err == nil {
		pending = b.Pending
	}
	return watermill.LogFields{
		"delivered": s.delivered.Load(), "failed": s.failed.Load(), "dead_lettered": s.dead.Load(),
		"pending_at_stop": pending, "uptime": time.Since(s.started).Round(time.Millisecond).String(),
	}
}
