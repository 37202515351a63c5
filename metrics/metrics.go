// Package metrics turns the relay's outbox.Hooks and its periodic Backlog into measurements,
// behind one small interface, Recorder, so that the root package forces no metrics library on
// a user. Package metrics/prom implements Recorder with Prometheus (client_golang), package
// metrics/otel with OpenTelemetry metrics.
//
// Wiring, for a Subscriber of your own:
//
//	rec, _ := prom.New(prometheus.DefaultRegisterer)
//	obs, _ := metrics.New(rec, metrics.Config{})
//	cfg.Hooks = metrics.ComposeHooks(cfg.Hooks, obs.Hooks())
//	sub, _ := outbox.NewSubscriber(pool, cfg, logger)
//	go obs.SampleBacklog(ctx, sub) // one Backlog query per Config.BacklogInterval
//	dest = obs.Publisher(dest, "kafka")        // per-call destination latency
//	go obs.WatchSubscriptions(ctx, runners...) // relay up, subscriptions running
//
// Writers: outbox.PublisherConfig{OnWrite: obs.OnWrite} counts written events, validation
// errors by field and each call's duration.
//
// Labels are bounded: a topic is reported under the first of Config.TopicPatterns it matches
// (the pattern itself is the label), never an ordering key or event id; without patterns the
// first Config.MaxTopics distinct topics are their own labels and later ones OtherTopic. A
// destination (UnavailableError.Destination, one per webhook host) is bounded the same way by
// Config.DestinationPatterns and Config.MaxDestinations, later ones reported as
// OtherDestination. The Observer applies the bounds before any Recorder sees a label, so every
// Recorder (Prometheus, OpenTelemetry) gets at most the cap plus one series per metric.
package metrics

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/health"
)

// HeldRecorder is a Recorder that also counts the events held back for their destination
// (outbox.HeldInfo: an outage of that destination, or its rate or in-flight limit). The
// package's Prometheus and OpenTelemetry recorders implement it; the Observer calls it when
// its Recorder does. destination is the bounded label.
type HeldRecorder interface {
	Held(destination, reason string)
}

// Recorder receives the relay's measurements. topic and destination are already the bounded
// labels when an Observer (or Observer.Publisher) calls it (see Config.TopicPatterns and
// Config.DestinationPatterns). Implementations must be safe for concurrent use and fast: the
// counting methods are called from the subscriptions' goroutines (see outbox.Hooks).
type Recorder interface {
	// Delivered counts one delivered event; delay is commit→delivered (database clock).
	Delivered(topic string, delay time.Duration)
	// Failed counts one failed delivery that will be retried.
	Failed(topic string)
	// DeadLettered counts one dead-lettered event.
	DeadLettered(topic string)
	// Unavailable counts one event released because its destination was unavailable (no
	// attempt counted).
	Unavailable(topic string)
	// LeaseLost counts events whose lease another relay took over.
	LeaseLost(events int)
	// Claim records one claim statement: how many events it leased and how long it took.
	Claim(events int, d time.Duration)
	// Mark records one mark statement; failed is true when it returned an error.
	Mark(d time.Duration, failed bool)
	// Backlog sets the backlog gauges from one Subscriber.Backlog sample.
	Backlog(b outbox.Backlog)
	// BacklogFailed counts a Backlog sample that failed (the gauges keep their last value).
	BacklogFailed()
	// DestinationUnavailable sets whether destination ("" when unnamed) is in an outage: down
	// is true while any destination reported under that label is (the Observer counts them).
	// The Observer calls it under its lock, in the order the outages changed: it must not call
	// back into the Observer.
	DestinationUnavailable(destination string, down bool)
	// DestinationCall records one call to a destination (see Publisher): its duration and
	// whether it succeeded.
	DestinationCall(destination string, d time.Duration, ok bool)
	// Subscriptions sets how many of the relay's total subscriptions are running (see
	// Observer.WatchSubscriptions).
	Subscriptions(running, total int)

	// Written counts one event written by a Publisher (see Observer.OnWrite); duplicate is
	// true for an idempotency key that already existed (nothing new was stored).
	Written(topic string, duplicate bool)
	// WriteInvalid counts one Publisher call refused by validation; field is the
	// outbox.ValidationError's Field ("topic", "uuid", "payload", "headers", "ordering_key",
	// "idempotency_key", "extra_columns", "message": a bounded set).
	WriteInvalid(field string)
	// WriteCall records one Publisher call: its duration and outcome (OutcomeOK,
	// OutcomeInvalid or OutcomeError).
	WriteCall(d time.Duration, outcome string)
}

// Outcomes of WriteCall.
const (
	// OutcomeOK: the call wrote its events (or found them stored already).
	OutcomeOK = "ok"
	// OutcomeInvalid: an *outbox.ValidationError refused the call before any SQL.
	OutcomeInvalid = "invalid"
	// OutcomeError: the database refused the call.
	OutcomeError = "error"
)

// DefaultBacklogInterval is Config.BacklogInterval's default.
const DefaultBacklogInterval = 15 * time.Second

// DefaultMaxTopics is Config.MaxTopics' default.
const DefaultMaxTopics = 100

// OtherTopic is the label of a topic that matches no Config.TopicPatterns, or that comes
// after MaxTopics distinct topics when no patterns are given.
const OtherTopic = "other"

// DefaultMaxDestinations is Config.MaxDestinations' default.
const DefaultMaxDestinations = 100

// OtherDestination is the label of a destination that matches no Config.DestinationPatterns,
// or that comes after MaxDestinations distinct destinations when no patterns are given.
const OtherDestination = "other"

// Config configures an Observer. The zero value is valid.
type Config struct {
	// TopicPatterns bound the topic label: a topic is reported as the first pattern it
	// matches (exact, "prefix*" or "*", as outbox.ParseTopicPattern takes them), else as
	// OtherTopic. Empty (the default): each topic is its own label, up to MaxTopics distinct
	// topics; later ones are OtherTopic.
	TopicPatterns []string
	// MaxTopics caps the distinct topic labels when TopicPatterns is empty. Default 100; at
	// least 1.
	MaxTopics int
	// DestinationPatterns bound the destination label (of outbox_destination_unavailable and
	// of destination calls): a destination name (outbox.UnavailableError.Destination, such as
	// "webhook api.example.com:443", or the name given to Observer.Publisher) is reported as
	// the first pattern it matches (exact, "prefix*" or "*", as for TopicPatterns), else as
	// OtherDestination. Empty (the default): each destination is its own label, up to
	// MaxDestinations distinct destinations; later ones are OtherDestination.
	DestinationPatterns []string
	// MaxDestinations caps the distinct destination labels when DestinationPatterns is empty.
	// Default DefaultMaxDestinations (100); at least 1.
	MaxDestinations int
	// BacklogInterval is how often SampleBacklog queries the backlog. Default 15s; at least
	// 100ms.
	BacklogInterval time.Duration
}

// Validate returns an *outbox.ConfigError naming the first invalid field, or nil.
func (c Config) Validate() error {
	if c.MaxTopics < 0 {
		return &outbox.ConfigError{Field: "metrics.Config.MaxTopics", Reason: "must not be negative"}
	}
	if c.MaxDestinations < 0 {
		return &outbox.ConfigError{Field: "metrics.Config.MaxDestinations", Reason: "must not be negative"}
	}
	if c.BacklogInterval < 0 || (c.BacklogInterval > 0 && c.BacklogInterval < 100*time.Millisecond) {
		return &outbox.ConfigError{Field: "metrics.Config.BacklogInterval", Reason: "must be at least 100ms"}
	}
	if err := checkPatterns("TopicPatterns", c.TopicPatterns); err != nil {
		return err
	}
	return checkPatterns("DestinationPatterns", c.DestinationPatterns)
}

// checkPatterns returns an *outbox.ConfigError for the first of patterns that
// outbox.ParseTopicPattern refuses, or nil.
func checkPatterns(field string, patterns []string) error {
	for i, p := range patterns {
		if _, err := outbox.ParseTopicPattern(p); err != nil {
			return &outbox.ConfigError{Field: fmt.Sprintf("metrics.Config.%s[%d]", field, i), Reason: fmt.Sprintf("%q is not a pattern", p), Err: err}
		}
	}
	return nil
}

// Observer feeds a Recorder from outbox.Hooks (Hooks) and from periodic Backlog samples
// (SampleBacklog). Safe for concurrent use; one Observer may serve several Subscribers.
type Observer struct {
	rec   Recorder
	cfg   Config
	topic *labeler
	dest  *labeler

	mu      sync.Mutex
	outages map[string]int // destination → subscriptions in an outage with it; none at 0
	down    map[string]int // destination label → destinations down under it; none at 0
}

// labeler maps names (topics or destinations) to bounded labels: the first pattern a name
// matches, else other; without patterns the first max distinct names are their own labels.
// The mapping of a name never changes. Safe for concurrent use.
type labeler struct {
	names    []string // the patterns as configured: the labels
	patterns []outbox.TopicPattern
	max      int
	other    string

	cache sync.Map // name → label (string), read without a lock on the hot path

	mu     sync.Mutex
	cached int // entries in cache, at most 10*max
	own    int // distinct names labelled as themselves, at most max
}

func newLabeler(patterns []string, limit int, other string) *labeler {
	l := &labeler{names: patterns, max: limit, other: other}
	for _, p := range patterns {
		tp, _ := outbox.ParseTopicPattern(p)
		l.patterns = append(l.patterns, tp)
	}
	return l
}

func (l *labeler) label(name string) string {
	if v, ok := l.cache.Load(name); ok {
		return v.(string)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if v, ok := l.cache.Load(name); ok {
		return v.(string)
	}
	label := l.other
	switch {
	case len(l.patterns) > 0:
		for i, p := range l.patterns {
			if p.Match(name) {
				label = l.names[i]
				break
			}
		}
	case l.own < l.max:
		label = name
		l.own++
	}
	// The cache is bounded too. A name left out of it is labelled again on each call, with
	// the same answer: the names labelled as themselves are all cached (max < 10*max).
	if l.cached < 10*l.max {
		l.cache.Store(name, label)
		l.cached++
	}
	return label
}

// New returns an Observer writing to rec. Errors: an *outbox.ConfigError for a nil rec or an
// invalid cfg.
func New(rec Recorder, cfg Config) (*Observer, error) {
	if rec == nil {
		return nil, &outbox.ConfigError{Field: "rec", Reason: "nil Recorder"}
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.MaxTopics == 0 {
		cfg.MaxTopics = DefaultMaxTopics
	}
	if cfg.MaxDestinations == 0 {
		cfg.MaxDestinations = DefaultMaxDestinations
	}
	if cfg.BacklogInterval == 0 {
		cfg.BacklogInterval = DefaultBacklogInterval
	}
	return &Observer{
		rec: rec, cfg: cfg, outages: map[string]int{}, down: map[string]int{},
		topic: newLabeler(cfg.TopicPatterns, cfg.MaxTopics, OtherTopic),
		dest:  newLabeler(cfg.DestinationPatterns, cfg.MaxDestinations, OtherDestination),
	}, nil
}

// Label returns the bounded label of topic (see Config.TopicPatterns). Safe for concurrent
// use.
func (o *Observer) Label(topic string) string { return o.topic.label(topic) }

// DestinationLabel returns the bounded label of destination (see Config.DestinationPatterns).
// Safe for concurrent use.
func (o *Observer) DestinationLabel(destination string) string { return o.dest.label(destination) }

// Publisher is the package's Publisher with destination reported under its bounded label
// (DestinationLabel, computed once here) to the Observer's Recorder. Safe for concurrent use
// if pub is.
func (o *Observer) Publisher(pub message.Publisher, destination string) message.Publisher {
	return Publisher(pub, o.DestinationLabel(destination), o.rec)
}

// Hooks returns the outbox.Hooks that feed the Recorder. Combine them with your own through
// ComposeHooks.
func (o *Observer) Hooks() outbox.Hooks {
	return outbox.Hooks{
		OnDelivered:    func(i outbox.DeliveredInfo) { o.rec.Delivered(o.Label(i.Topic), i.Delay) },
		OnFailed:       func(i outbox.FailedInfo) { o.rec.Failed(o.Label(i.Topic)) },
		OnDeadLettered: func(i outbox.FailedInfo) { o.rec.DeadLettered(o.Label(i.Topic)) },
		OnUnavailable:  func(i outbox.FailedInfo) { o.rec.Unavailable(o.Label(i.Topic)) },
		OnLeaseLost:    func(i outbox.LeaseLostInfo) { o.rec.LeaseLost(i.Events) },
		OnClaim:        func(i outbox.ClaimInfo) { o.rec.Claim(i.Events, i.Duration) },
		OnMark:         func(i outbox.MarkInfo) { o.rec.Mark(i.Duration, i.Err != nil) },
		OnOutage:       o.outage,
		OnHeld: func(i outbox.HeldInfo) {
			if hr, ok := o.rec.(HeldRecorder); ok {
				hr.Held(o.DestinationLabel(i.Destination), i.Reason)
			}
		},
	}
}

// outage keeps a count of the subscriptions that see each destination down (a destination is
// unavailable while any of them does) and of the destinations down under each label (a label
// is unavailable while any of its destinations is). Both maps hold only what is down.
func (o *Observer) outage(i outbox.OutageInfo) {
	label := o.DestinationLabel(i.Destination)
	o.mu.Lock()
	defer o.mu.Unlock()
	n := o.outages[i.Destination]
	was := n > 0
	if i.Ended.IsZero() {
		n++
	} else if n > 0 {
		n--
	}
	setCount(o.outages, i.Destination, n)
	switch {
	case n > 0 && !was:
		o.down[label]++
	case n == 0 && was:
		setCount(o.down, label, o.down[label]-1)
	}
	o.rec.DestinationUnavailable(label, o.down[label] > 0)
}

// setCount sets m[k] to n, deleting k at 0.
func setCount(m map[string]int, k string, n int) {
	if n > 0 {
		m[k] = n
	} else {
		delete(m, k)
	}
}

// OnWrite is a PublisherConfig.OnWrite that records each Publisher call: Written for each of
// its events under the bounded topic label, WriteInvalid with the field of a validation
// error, and WriteCall with its duration and outcome. Set it as
// outbox.PublisherConfig{OnWrite: obs.OnWrite}. Safe for concurrent use.
func (o *Observer) OnWrite(i outbox.WriteInfo) {
	outcome := OutcomeOK
	var ve *outbox.ValidationError
	switch {
	case errors.As(i.Err, &ve):
		outcome = OutcomeInvalid
		o.rec.WriteInvalid(ve.Field)
	case i.Err != nil:
		outcome = OutcomeError
	}
	for _, e := range i.Events {
		o.rec.Written(o.Label(e.Topic), e.Duplicate)
	}
	o.rec.WriteCall(i.Duration, outcome)
}

// WatchSubscriptions keeps Recorder.Subscriptions up to date for runners (one per
// subscription, as health.Running takes them: a forwarder's Running channel, and a channel
// closed when its Run returned): it reports 0 of len(runners) at once, then each start and
// stop as it happens. It returns when every runner has stopped, or when ctx ends (the gauges
// then keep their last values: give it a context that outlives the runners to see them
// stop).
func (o *Observer) WatchSubscriptions(ctx context.Context, runners ...health.Runner) {
	var (
		mu      sync.Mutex
		running int
		wg      sync.WaitGroup
	)
	set := func(delta int) {
		mu.Lock()
		defer mu.Unlock()
		running += delta
		o.rec.Subscriptions(running, len(runners))
	}
	set(0)
	for _, r := range runners {
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case <-r.Running:
			case <-r.Done:
				return
			case <-ctx.Done():
				return
			}
			set(1)
			select {
			case <-r.Done:
				set(-1)
			case <-ctx.Done():
			}
		}()
	}
	wg.Wait()
}

// BacklogSource is what SampleBacklog reads; *outbox.Subscriber implements it.
type BacklogSource interface {
	Backlog(ctx context.Context) (outbox.Backlog, error)
}

// SampleBacklog sets the backlog gauges from src at once and then every
// Config.BacklogInterval until ctx ends (one cheap query per sample; a failed sample counts
// in BacklogFailed and leaves the gauges as they were). It returns when ctx ends.
func (o *Observer) SampleBacklog(ctx context.Context, src BacklogSource) {
	t := time.NewTicker(o.cfg.BacklogInterval)
	defer t.Stop()
	for {
		o.SampleOnce(ctx, src)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// SampleOnce takes one Backlog sample from src and returns its error.
func (o *Observer) SampleOnce(ctx context.Context, src BacklogSource) error {
	qctx, cancel := context.WithTimeout(ctx, max(o.cfg.BacklogInterval, time.Second))
	defer cancel()
	b, err := src.Backlog(qctx)
	if err != nil {
		if ctx.Err() == nil {
			o.rec.BacklogFailed()
		}
		return err
	}
	o.rec.Backlog(b)
	return nil
}

// ComposeHooks returns Hooks that call each of hs's non-nil functions in order (for example a
// user's own hooks and an Observer's).
func ComposeHooks(hs ...outbox.Hooks) outbox.Hooks {
	var out outbox.Hooks
	for _, h := range hs {
		out.OnDelivered = chain(out.OnDelivered, h.OnDelivered)
		out.OnFailed = chain(out.OnFailed, h.OnFailed)
		out.OnDeadLettered = chain(out.OnDeadLettered, h.OnDeadLettered)
		out.OnUnavailable = chain(out.OnUnavailable, h.OnUnavailable)
		out.OnOutage = chain(out.OnOutage, h.OnOutage)
		out.OnLeaseLost = chain(out.OnLeaseLost, h.OnLeaseLost)
		out.OnClaim = chain(out.OnClaim, h.OnClaim)
		out.OnMark = chain(out.OnMark, h.OnMark)
		out.OnHeld = chain(out.OnHeld, h.OnHeld)
	}
	return out
}

func chain[T any](a, b func(T)) func(T) {
	switch {
	case a == nil:
		return b
	case b == nil:
		return a
	}
	return func(v T) { a(v); b(v) }
}
