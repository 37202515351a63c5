package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os/signal"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/forwarder"
	"github.com/watermill-outbox/outbox/health"
)

// relayFlags are the outbox.SubscriberConfig settings as flags.
type relayFlags struct {
	batchSize       int
	pollInterval    time.Duration
	maxAttempts     int
	retryBase       time.Duration
	retryMax        time.Duration
	lease           time.Duration
	deliveryTimeout time.Duration
	concurrency     int
	relayName       string
	exclude         []string
	unavailable     time.Duration
	unavailableMax  time.Duration
	unavailableDead time.Duration
	markInterval    time.Duration
	maxStarts       int
	wakeProbe       time.Duration
	// Flow control of the destination (per-message destinations only): destName names it,
	// perMessage says whether --to is delivered one message at a time; both set from --to
	// before config.
	rateLimit   float64
	rateBurst   int
	maxInFlight int
	destName    string
	perMessage  bool
}

func (f *relayFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.IntVar(&f.batchSize, "batch-size", outbox.DefaultBatchSize, fmt.Sprintf("events leased per claim, 1..%d", outbox.MaxBatchSize))
	fl.DurationVar(&f.pollInterval, "poll-interval", outbox.DefaultPollInterval, "wait between polls that found nothing, a Go duration")
	fl.IntVar(&f.maxAttempts, "max-attempts", outbox.DefaultMaxAttempts, "failed deliveries after which an event is dead-lettered, at least 1")
	fl.DurationVar(&f.retryBase, "retry-base", outbox.DefaultRetryBase, "first retry delay; the n-th failure waits min(retry-base·2^(n-1), retry-max) ±10%")
	fl.DurationVar(&f.retryMax, "retry-max", outbox.DefaultRetryMax, "longest retry delay, at least --retry-base")
	fl.DurationVar(&f.lease, "lease", outbox.DefaultLeaseDuration, "how long a claim leases its events (renewed while they are out), at least 1s")
	fl.DurationVar(&f.deliveryTimeout, "delivery-timeout", 0, "how long one delivery may take before it counts as failed, below --lease; 0 = min(30s, lease/2)")
	fl.IntVar(&f.concurrency, "concurrency", outbox.DefaultConcurrency, "deliveries in flight at once per subscription (different ordering keys)")
	fl.StringVar(&f.relayName, "relay-name", "", "name of this relay in leased_by; empty = host:pid:random. A stable name lets a restarted relay take back its predecessor's leases at once; it must be unique among live relays")
	fl.StringSliceVar(&f.exclude, "exclude", nil, "topic pattern never relayed (exact, \"prefix*\" or \"*\"); repeatable or comma-separated")
	fl.DurationVar(&f.unavailable, "unavailable-backoff", outbox.DefaultUnavailableBackoff, "first wait before probing a destination that answered unavailable (no attempt is counted; its topics pause)")
	fl.DurationVar(&f.unavailableMax, "unavailable-backoff-max", outbox.DefaultUnavailableBackoffMax, "longest wait between probes of an unavailable destination, at least --unavailable-backoff")
	fl.DurationVar(&f.unavailableDead, "unavailable-dead-letter-after", 0, "dead-letter the events of a destination unavailable for this long without a break; 0 = never")
	fl.DurationVar(&f.markInterval, "mark-interval", outbox.DefaultMarkInterval, "how often the acks of a batch still out are written (a killed relay repeats at most those since the last write)")
	fl.DurationVar(&f.wakeProbe, "wake-probe", outbox.DefaultWakeProbeInterval, "PostgreSQL: how often the relay probes the table's sequence to claim within milliseconds of any writer's commit (one tiny statement, no table rows read); 0 = off (poll only)")
	fl.Float64Var(&f.rateLimit, "rate-limit", 0, "most events per second sent to the destination (http(s) and asynq destinations); events over it wait in the table, no attempt counted; 0 = unlimited")
	fl.IntVar(&f.rateBurst, "rate-burst", 0, "events sent at once above --rate-limit after a quiet time; 0 = rate-limit/10, at least 1")
	fl.IntVar(&f.maxInFlight, "max-in-flight", 0, "most events out to the destination at once (http(s) and asynq destinations); 0 = --concurrency per subscription")
	fl.IntVar(&f.maxStarts, "max-delivery-starts", outbox.DefaultMaxDeliveryStarts, "dead-letter an event whose delivery started this many times without an outcome (the relay crashed on it each time)")
}

// config returns the SubscriberConfig of the flags, validated. A bad value is a usage error
// naming the flag.
func (f *relayFlags) config(schema outbox.SchemaConfig, probes bool) (outbox.SubscriberConfig, error) {
	cfg := outbox.SubscriberConfig{
		Schema:          schema,
		BatchSize:       f.batchSize,
		PollInterval:    f.pollInterval,
		MaxAttempts:     f.maxAttempts,
		RetryBase:       f.retryBase,
		RetryMax:        f.retryMax,
		LeaseDuration:   f.lease,
		DeliveryTimeout: f.deliveryTimeout,
		Concurrency:     f.concurrency,
		RelayName:       f.relayName,
		ExcludeTopics:   f.exclude,

		UnavailableBackoff:         f.unavailable,
		UnavailableBackoffMax:      f.unavailableMax,
		UnavailableDeadLetterAfter: f.unavailableDead,
		MarkInterval:               f.markInterval,
		MaxDeliveryStarts:          f.maxStarts,
	}
	switch {
	case !probes:
		// No probe there: the flag's default is not an error (the start log says how the
		// relay wakes); a value given explicitly is refused below by Validate.
		if f.wakeProbe != outbox.DefaultWakeProbeInterval {
			cfg.WakeProbeInterval = f.wakeProbe
		}
	case f.wakeProbe == 0:
		cfg.DisableWakeProbe = true
	default:
		cfg.WakeProbeInterval = f.wakeProbe
	}
	// Zero means "default" in SubscriberConfig; on the command line 0 is a mistake, except for
	// --delivery-timeout whose default is derived from --lease.
	for name, v := range map[string]int64{"batch-size": int64(f.batchSize), "poll-interval": int64(f.pollInterval), "max-attempts": int64(f.maxAttempts),
		"retry-base": int64(f.retryBase), "retry-max": int64(f.retryMax), "lease": int64(f.lease), "concurrency": int64(f.concurrency),
		"unavailable-backoff": int64(f.unavailable), "unavailable-backoff-max": int64(f.unavailableMax), "mark-interval": int64(f.markInterval),
		"max-delivery-starts": int64(f.maxStarts)} {
		if v <= 0 {
			return cfg, badFlag(name, " must be positive")
		}
	}
	if err := f.limits(&cfg); err != nil {
		return cfg, err
	}
	if err := cfg.Validate(); err != nil {
		var ce *outbox.ConfigError
		if errors.As(err, &ce) {
			if flag := flagOfField(ce.Field); strings.HasPrefix(flag, "--") {
				return cfg, badFlag(strings.TrimPrefix(flag, "--"), ": "+flagsInReason(ce.Reason))
			}
		}
		return cfg, &usageError{errors.New(strings.TrimPrefix(err.Error(), "outbox: "))}
	}
	return cfg, nil
}

// limits sets cfg's destination flow control from --rate-limit, --rate-burst and
// --max-in-flight: the one destination of --to, named destName, limited (see
// SubscriberConfig.DestinationLimits). Batch destinations (Kafka, RabbitMQ, Redis) refuse them.
func (f *relayFlags) limits(cfg *outbox.SubscriberConfig) error {
	switch {
	case f.rateLimit == 0 && f.rateBurst == 0 && f.maxInFlight == 0:
		return nil
	case f.rateLimit < 0 || math.IsNaN(f.rateLimit) || math.IsInf(f.rateLimit, 0):
		return badFlag("rate-limit", " must be a number of events per second, at least 0")
	case f.rateBurst < 0:
		return badFlag("rate-burst", " must not be negative")
	case f.rateBurst > 0 && f.rateLimit == 0:
		return badFlag("rate-burst", " needs --rate-limit")
	case f.maxInFlight < 0:
		return badFlag("max-in-flight", " must not be negative")
	case !f.perMessage:
		return &usageError{errors.New("--rate-limit, --rate-burst and --max-in-flight apply to http(s) and asynq destinations (delivered one message at a time); Kafka, RabbitMQ and Redis take a whole batch per call")}
	}
	name := f.destName
	cfg.Destination = func(string, *message.Message) string { return name }
	cfg.DestinationLimits = map[string]outbox.DestinationLimit{name: {Rate: f.rateLimit, Burst: f.rateBurst, MaxInFlight: f.maxInFlight}}
	return nil
}

// topicPatternForm says what a topic pattern looks like, for checkList.
const topicPatternForm = `a topic pattern (an exact topic, a prefix ending in '*' such as "orders.*", or '*' for all)`

// fieldWord is a word of a ConfigError's reason that may name a SubscriberConfig field.
var fieldWord = regexp.MustCompile(`\b[A-Z][A-Za-z]+\b`)

// flagsInReason is a ConfigError's reason with every SubscriberConfig field it names
// ("must not be below RetryBase") replaced by the field's flag ("--retry-base").
func flagsInReason(reason string) string {
	return fieldWord.ReplaceAllStringFunc(reason, func(w string) string {
		if flag := flagOfField("SubscriberConfig." + w); strings.HasPrefix(flag, "--") {
			return flag
		}
		return w
	})
}

// effectiveDeliveryTimeout is the relay's delivery timeout: --delivery-timeout, or when it is
// 0 the default that SubscriberConfig.DeliveryTimeout documents, min(30s, lease/2).
func effectiveDeliveryTimeout(cfg outbox.SubscriberConfig) time.Duration {
	if cfg.DeliveryTimeout > 0 {
		return cfg.DeliveryTimeout
	}
	return min(outbox.DefaultDeliveryTimeout, cfg.LeaseDuration/2)
}

// startFields are the fields of the relay's start line: every flag of cmd under its own name
// with the value in effect (given, from the environment, or the default), except --help and
// hidden spellings; values holds the ones to show instead of the flag's own (the database and
// destination with any password removed, derived defaults). --secret is shown as set or not.
// An empty string is shown as "".
func startFields(cmd *cobra.Command, values map[string]string) watermill.LogFields {
	fields := watermill.LogFields{}
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		if f.Name == "help" || f.Hidden {
			return
		}
		v, ok := values[f.Name]
		switch {
		case ok:
		case f.Name == "secret" || f.Name == "console-token": // never printed
			v = "unset"
			if f.Value.String() != "" {
				v = "set"
			}
		default:
			v = f.Value.String()
		}
		if v == "" {
			v = `""`
		}
		fields[f.Name] = v
	})
	return fields
}

// flagOfField names the flag of a SubscriberConfig field.
func flagOfField(field string) string {
	m := map[string]string{
		"SubscriberConfig.BatchSize": "--batch-size", "SubscriberConfig.PollInterval": "--poll-interval",
		"SubscriberConfig.MaxAttempts": "--max-attempts", "SubscriberConfig.RetryBase": "--retry-base",
		"SubscriberConfig.RetryMax": "--retry-max", "SubscriberConfig.LeaseDuration": "--lease",
		"SubscriberConfig.DeliveryTimeout": "--delivery-timeout", "SubscriberConfig.Concurrency": "--concurrency",
		"SubscriberConfig.RelayName": "--relay-name", "SubscriberConfig.ExcludeTopics": "--exclude",
		"SubscriberConfig.UnavailableBackoff": "--unavailable-backoff", "SubscriberConfig.UnavailableBackoffMax": "--unavailable-backoff-max",
		"SubscriberConfig.UnavailableDeadLetterAfter": "--unavailable-dead-letter-after", "SubscriberConfig.MarkInterval": "--mark-interval",
		"SubscriberConfig.MaxDeliveryStarts": "--max-delivery-starts", "SubscriberConfig.WakeProbeInterval": "--wake-probe",
	}
	if f, ok := m[field]; ok {
		return f
	}
	return "a flag"
}

func newRelayCmd() *cobra.Command {
	var (
		f            dbFlags
		rf           relayFlags
		to           string
		topics       []string
		secret       string
		allow        []string
		exchange     string
		permanent    []int
		destTopic    string
		debug, trace bool
		of           obsFlags
	)
	cmd := &cobra.Command{
		Use:   "relay --db URL --to URL [--topics PATTERN]… [--exclude PATTERN]…",
		Short: "Deliver committed events to Kafka, RabbitMQ, Redis Streams or a webhook until stopped",
		Long: `relay delivers the outbox's committed events to a destination, at least once and in order per
ordering key, with retries, backoff and dead letters. Run as many relays as you like on one table.
It stops gracefully on SIGINT or SIGTERM (events in flight are answered or released) and then
exits 0.

Destinations (--to):
  kafka://host:9092[,host2:9092]     one produce request per batch, acks=all, idempotent producer;
                                     ordering key = message key
  amqp://user:password@host:5672/    persistent messages with publisher confirms and mandatory routing
                                     through --amqp-exchange (default exchange: routing key = queue)
  redis://host:6379[/db]             XADD to the stream named by the topic
  asynq+redis://host:6379[/db]       an asynq task per event of a "task." topic (type = the rest of the
                                     topic, task id = event id; ?queue=, ?retention=, ?max-retry=);
                                     relays "task.*" unless --topics is given
  http(s)://host/path                signed POST per event (Outbox-Signature: sha256=HMAC of the body
                                     when --secret is set); private and loopback receivers need
                                     --allow-prefix
The destination topic (Kafka topic, routing key, stream) is the event's topic unless --dest-topic
names one for all.

How the relay finds new events (its log says which at start): on PostgreSQL it probes the
table's sequence every --wake-probe (5ms: one tiny statement that reads no rows) and claims
within milliseconds of any writer's commit, with no signal from the writers and through
PgBouncer too; on SQLite it wakes on each commit to the file (it watches the write-ahead log);
both also poll every --poll-interval. MariaDB/MySQL relays poll every --poll-interval (no
LISTEN/NOTIFY: lower --poll-interval for lower latency, at the price of more empty claims).`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) (err error) {
			dest, err := parseDestURL(to)
			if err != nil {
				return err
			}
			rf.destName, rf.perMessage = dest.name(), dest.kind == destHTTP || dest.kind == destAsynq
			prefixes, err := parsePrefixes(allow)
			if err != nil {
				return err
			}
			if err := checkList(cmd.Flags(), topics, topicPatternForm, "topics", "topic"); err != nil {
				return err
			}
			if err := checkList(cmd.Flags(), rf.exclude, topicPatternForm, "exclude"); err != nil {
				return err
			}
			if len(topics) == 0 && dest.kind == destAsynq {
				topics = asynqDefaultTopics
			}
			if len(topics) == 0 {
				topics = []string{forwarder.DefaultSubscribeTopic}
			}
			for _, t := range append(append([]string{}, topics...), rf.exclude...) {
				if _, err := outbox.ParseTopicPattern(t); err != nil {
					return &usageError{fmt.Errorf("topic pattern %q: use an exact topic, a prefix ending in '*' (\"orders.*\") or '*' for all", t)}
				}
			}
			if _, err := rf.config(outbox.SchemaConfig{}, true); err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			running := false
			defer func() {
				// Stopped by SIGINT/SIGTERM while starting (connecting to the database or the
				// destination): a stop, not a failure (exit 0). Once running, runRelay's own
				// result stands.
				if err != nil && !running && ctx.Err() != nil && cmd.Context().Err() == nil {
					err = nil
				}
			}()
			var (
				d      *database
				tables []string // several tables (a --table list or pattern), else nil
			)
			if elems, multi := tableList(f.table); multi {
				d, tables, err = f.openTables(ctx, elems)
			} else {
				d, err = f.open(ctx, false)
			}
			if err != nil {
				return err
			}
			defer d.Close()
			cfg, err := rf.config(d.schema, d.probes())
			if err != nil {
				return err
			}
			if tables != nil {
				cfg.Schema.Table = ""
			}
			stats, err := newRelayStats(of)
			if err != nil {
				return err
			}
			defer stats.close()
			cfg.Hooks = stats.hooks()
			logger := newSlogLogger(cmd.ErrOrStderr(), debug || trace, trace)
			pub, err := openPublisher(ctx, dest, destOptions{secret: secret, allow: prefixes, exchange: exchange, timeout: effectiveDeliveryTimeout(cfg), permanent: permanent}, logger)
			if err != nil {
				return err
			}
			defer pub.Close()
			var fcfg forwarder.Config
			if destTopic != "" {
				fcfg.Topic = func(string, *message.Message) string { return destTopic }
			}
			tracer, err := newRelayTracer(ctx, cfg.BatchSize)
			if err != nil {
				return err
			}
			defer tracer.close(logger)
			shown := map[string]string{"db": d.url.Shown(), "to": dest.shown, "delivery-timeout": effectiveDeliveryTimeout(cfg).String()}
			if !d.probes() {
				shown["wake-probe"] = "0s" // PostgreSQL only
			}
			fields := startFields(cmd, shown)
			fields["traces"] = tracesSetting(tracer)
			build := readBuildInfo()
			fields["version"], fields["commit"] = build.version, build.commit
			logger.Info("outbox relay starting", fields)
			// Tracing outside the timing: the destination call's duration is the destination's.
			running = true
			return runRelay(ctx, d, cfg, tables, tracer.wrap(stats.wrap(pub, dest.kind), dest.kind), fcfg, topics, logger, stats)
		},
	}
	f.register(cmd)
	rf.register(cmd)
	of.register(cmd)
	fl := cmd.Flags()
	fl.Lookup("table").Usage = "outbox table, optionally schema-qualified (PostgreSQL) or database-qualified (MariaDB/MySQL); or several, comma-separated, each possibly a pattern ('*', '?': \"tenant_*.watermill_outbox\") resolved once at start, relayed by one relay in fair turns"
	fl.StringVar(&to, "to", "", "destination URL: "+destForms+" (required)")
	markRequired(cmd, "to", "URL", destForms)
	fl.StringSliceVar(&topics, "topics", nil, "topic pattern to relay (exact, \"prefix*\" or \"*\"); repeatable or comma-separated; default \"*\" (all)")
	aliasFlag(cmd, "topics", "topic")
	fl.StringVar(&secret, "secret", "", "webhook signing secret, at least 16 bytes: requests carry Outbox-Signature: sha256=<hex HMAC-SHA256 of the body>; empty = unsigned")
	fl.StringSliceVar(&allow, "allow-prefix", nil, "webhook: let the relay reach this private or loopback range (CIDR or address, e.g. 127.0.0.0/8); repeatable")
	fl.StringVar(&exchange, "amqp-exchange", "", "RabbitMQ: existing exchange to publish through; empty = the default exchange")
	fl.IntSliceVar(&permanent, "webhook-permanent-status", nil, "webhook: an answer with this HTTP status dead-letters the event at once instead of retrying it (e.g. 410, 422); repeatable")
	fl.StringVar(&destTopic, "dest-topic", "", "fixed destination topic (Kafka topic, routing key, Redis stream) for every event; empty = the event's topic")
	fl.BoolVar(&debug, "debug", false, "log at debug level")
	fl.BoolVar(&trace, "trace", false, "log at trace level (every SQL statement and message)")
	return withEnv(cmd)
}

// runRelay runs one forwarder per topic pattern (each with its own Subscriber, or
// MultiSubscriber over tables when tables is not nil) until ctx ends, then stops them
// gracefully.
func runRelay(ctx context.Context, d *database, cfg outbox.SubscriberConfig, tables []string, pub message.Publisher, fcfg forwarder.Config, topics []string, logger watermill.LoggerAdapter, stats *relayStats) error {
	var (
		fwds []*forwarder.Forwarder
		subs []relaySubscriber
	)
	if w := d.RelayWakeup(cfg, logger); w != nil {
		defer w.Close()
		cfg.Wakeup = w
	}
	closeAll := func() {
		for _, fw := range fwds {
			_ = fw.Close()
		}
	}
	for i, t := range topics {
		scfg := cfg
		if scfg.RelayName != "" && len(topics) > 1 {
			// One Subscriber per pattern: each needs a name of its own, or the next one's
			// start takes back the live leases of the ones before it (SubscriberConfig.RelayName).
			scfg.RelayName = fmt.Sprintf("%s/%d", cfg.RelayName, i)
		}
		sub, err := newRelaySubscriber(d, scfg, tables, logger)
		if err != nil {
			closeAll()
			return err
		}
		c := fcfg
		c.SubscribeTopic = t
		fw, err := forwarder.New(sub, pub, c, logger)
		if err != nil {
			_ = sub.Close()
			closeAll()
			return err
		}
		fwds = append(fwds, fw)
		subs = append(subs, sub)
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, len(fwds))
	var wg sync.WaitGroup
	runners := make([]health.Runner, len(fwds))
	for i, fw := range fwds {
		wg.Add(1)
		done := make(chan struct{})
		runners[i] = health.Runner{Name: "forwarder " + topics[i], Running: fw.Running(), Done: done}
		go func() {
			defer wg.Done()
			defer close(done)
			// A stop that comes before Run starts closes the forwarder first: Run's ErrClosed
			// then is the stop, not a failure.
			if err := fw.Run(runCtx); err != nil && !(errors.Is(err, forwarder.ErrClosed) && runCtx.Err() != nil) {
				errs <- err
				cancel()
			}
		}()
	}
	ready := cfg.Schema
	if tables != nil {
		ready.Table = tables[0]
		logger.Info("outbox relay serving several tables", watermill.LogFields{"tables": strings.Join(tables, ",")})
	}
	outages := make([]health.OutageSource, len(subs))
	for i, sub := range subs {
		outages[i] = sub
	}
	if err := stats.openConsole(runCtx, d.Handle(), ready, outages, logger); err != nil {
		cancel()
		closeAll()
		wg.Wait()
		return fmt.Errorf("relay: --console: %s", oneLine(err.Error()))
	}
	stats.serve(runCtx, subs[0], outages, d.Handle(), ready, runners, logger)
	<-runCtx.Done()
	logger.Info("outbox relay stopping", nil)
	closeAll()
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return fmt.Errorf("relay: %s", oneLine(err.Error()))
	}
	logger.Info("outbox relay stopped", stats.summary(context.WithoutCancel(ctx), subs[0]))
	return nil
}

// relaySubscriber is what runRelay needs of a Subscriber or MultiSubscriber.
type relaySubscriber interface {
	forwarder.Subscriber
	Backlog(ctx context.Context) (outbox.Backlog, error)
	Outages() []outbox.Outage
}

// newRelaySubscriber returns a Subscriber of cfg, or a MultiSubscriber over tables.
func newRelaySubscriber(d *database, cfg outbox.SubscriberConfig, tables []string, logger watermill.LoggerAdapter) (relaySubscriber, error) {
	if tables == nil {
		return outbox.NewSubscriber(d.Handle(), cfg, logger)
	}
	return outbox.NewMultiSubscriber(d.Handle(), outbox.MultiSubscriberConfig{Tables: tables, Subscriber: cfg}, logger)
}
