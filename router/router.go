// Package router is a Watermill message.Publisher that sends each message to the publisher of
// its topic: an exact topic route first, otherwise the first matching pattern route in
// declared order, otherwise the default. A topic that no route takes is an error (ErrNoRoute),
// so an outbox event with such a topic is retried and dead-lettered, never marked delivered.
//
//	pub, err := router.New(router.Config{
//		Routes: []router.Route{
//			{Topic: "orders.audit", Publisher: webhookPub}, // exact: wins over "orders.*"
//			{Topic: "orders.*", Publisher: kafkaPub},
//			{Topic: "billing.*", Publisher: amqpPub},
//		},
//		Default: redisPub, // optional
//	}, logger)
//
// The Publisher also implements forwarder.BatchPublisher: a batch is split by destination and
// each part goes to its publisher in one PublishBatch call when that publisher takes batches.
//
// Outages: a destination's unavailable error (outbox.ErrUnavailable, see
// outbox.UnavailableError) comes back named after its route (Route.Name, default the route's
// Topic; "default" for Config.Default), so the outbox Subscriber pauses only the topics routed
// to the destination that is down while the other routes keep flowing.
package router

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"sync/atomic"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/forwarder"
)

// ErrNoRoute is matched (errors.Is) by every *NoRouteError: no route takes the topic and there
// is no default.
var ErrNoRoute = errors.New("router: no route for topic")

// DefaultRouteName is Config.DefaultName's default.
const DefaultRouteName = "default"

// ErrClosed is returned by Publish after Close.
var ErrClosed = errors.New("router: closed")

// NoRouteError is the error of a Publish to a topic that no route takes. It matches ErrNoRoute.
type NoRouteError struct {
	Topic string
}

// Error names the topic.
func (e *NoRouteError) Error() string { return fmt.Sprintf("router: no route for topic %q", e.Topic) }

// Is reports whether target is ErrNoRoute.
func (e *NoRouteError) Is(target error) bool { return target == ErrNoRoute }

// Route sends the messages of the topics that Topic selects to Publisher.
type Route struct {
	// Name names the destination in the unavailable errors of its publisher (see Publisher);
	// default "" means Topic. Routes to one destination should share a Name, so that its
	// outage pauses all of their topics together; routes with different Names pause
	// independently.
	Name string
	// Topic is an exact topic ("orders.paid"), a prefix pattern ending in '*' ("orders.*"), or
	// "*" for every topic (then later routes and the default are never reached). '*' elsewhere
	// and '?' are configuration errors; other characters are ordinary.
	Topic string
	// Publisher receives the messages; required.
	Publisher message.Publisher
}

// Config configures a Publisher. The zero value routes nothing (every Publish fails with
// ErrNoRoute).
type Config struct {
	// Routes in declared order. Exact routes win over patterns wherever they are declared;
	// among patterns the first match wins. Two routes with the same Topic are a configuration
	// error.
	Routes []Route
	// Default receives the topics no route takes; nil means such topics fail with ErrNoRoute.
	Default message.Publisher
	// DefaultName names Default in unavailable errors (see Route.Name); "" means
	// DefaultRouteName.
	DefaultName string
	// CloseDestinations makes Close close every destination publisher (each once). Default
	// false: the destinations belong to the caller.
	CloseDestinations bool
}

// Validate returns an *outbox.ConfigError (errors.Is(err, outbox.ErrConfig)) naming the first
// invalid route, or nil.
func (c Config) Validate() error {
	seen := map[string]bool{}
	for i, r := range c.Routes {
		field := fmt.Sprintf("router.Config.Routes[%d]", i)
		if r.Publisher == nil {
			return &outbox.ConfigError{Field: field + ".Publisher", Reason: "nil publisher"}
		}
		if _, err := outbox.ParseTopicPattern(r.Topic); err != nil {
			var ce *outbox.ConfigError
			if errors.As(err, &ce) {
				return &outbox.ConfigError{Field: field + ".Topic", Reason: ce.Reason}
			}
			return err
		}
		if seen[r.Topic] {
			return &outbox.ConfigError{Field: field + ".Topic", Reason: fmt.Sprintf("%q is routed twice", r.Topic)}
		}
		seen[r.Topic] = true
	}
	return nil
}

type pattern struct {
	match outbox.TopicPattern
	index int // in Config.Routes
}

// Publisher routes each message to the publisher of its topic. It is safe for concurrent use
// when its destinations are.
type Publisher struct {
	exact    map[string]int // topic → index in Config.Routes
	patterns []pattern
	def      message.Publisher
	cfg      Config
	logger   watermill.LoggerAdapter

	mu     sync.RWMutex
	closed bool
}

// New returns a Publisher for cfg. A nil logger means watermill.NopLogger. Errors: an
// *outbox.ConfigError from cfg.Validate.
func New(cfg Config, logger watermill.LoggerAdapter) (*Publisher, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	cfg.Routes = append([]Route(nil), cfg.Routes...)
	p := &Publisher{exact: map[string]int{}, def: cfg.Default, cfg: cfg, logger: logger}
	for i, r := range cfg.Routes {
		tp, _ := outbox.ParseTopicPattern(r.Topic) // checked by Validate
		if exact, ok := tp.Exact(); ok {
			p.exact[exact] = i
		} else {
			p.patterns = append(p.patterns, pattern{match: tp, index: i})
		}
	}
	return p, nil
}

// Route returns the publisher that topic goes to, or a *NoRouteError.
func (p *Publisher) Route(topic string) (message.Publisher, error) {
	i := p.route(topic)
	if i < 0 {
		return nil, &NoRouteError{Topic: topic}
	}
	return p.dest(i), nil
}

// route returns the index of topic's destination: a position in cfg.Routes, len(cfg.Routes)
// for the default, or -1 for none.
func (p *Publisher) route(topic string) int {
	if i, ok := p.exact[topic]; ok {
		return i
	}
	for _, pt := range p.patterns {
		if pt.match.Match(topic) {
			return pt.index
		}
	}
	if p.def != nil {
		return len(p.cfg.Routes)
	}
	return -1
}

// name returns the destination name of route i (len(cfg.Routes) for the default).
func (p *Publisher) name(i int) string {
	if i == len(p.cfg.Routes) {
		if p.cfg.DefaultName != "" {
			return p.cfg.DefaultName
		}
		return DefaultRouteName
	}
	if r := p.cfg.Routes[i]; r.Name != "" {
		return r.Name
	}
	return p.cfg.Routes[i].Topic
}

// named returns err of route i's publisher with, when it matches outbox.ErrUnavailable, the
// route's name as the destination: an *outbox.UnavailableError{Destination: name} wrapping
// err, with err's RetryAfter. Other errors are returned unchanged.
func (p *Publisher) named(i int, err error) error {
	if err == nil || !errors.Is(err, outbox.ErrUnavailable) {
		return err
	}
	ue := &outbox.UnavailableError{Destination: p.name(i), Err: err}
	var inner *outbox.UnavailableError
	if errors.As(err, &inner) {
		ue.RetryAfter = inner.RetryAfter
	}
	return ue
}

func (p *Publisher) dest(i int) message.Publisher {
	if i == len(p.cfg.Routes) {
		return p.def
	}
	return p.cfg.Routes[i].Publisher
}

// Publish sends msgs to the publisher of topic and returns its error — unchanged, except that
// an error matching outbox.ErrUnavailable is wrapped in an *outbox.UnavailableError whose
// Destination is the route's name (Route.Name), so that the outbox Subscriber pauses only the
// topics of the destination that is down. Errors: a *NoRouteError (errors.Is(err,
// ErrNoRoute)) when no route takes topic, ErrClosed after Close.
func (p *Publisher) Publish(topic string, msgs ...*message.Message) error {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.closed {
		return ErrClosed
	}
	i := p.route(topic)
	if i < 0 {
		return &NoRouteError{Topic: topic}
	}
	return p.named(i, p.dest(i).Publish(topic, msgs...))
}

// PublishBatch implements forwarder.BatchPublisher: it splits batch by route, keeping each
// route's messages in batch order, and sends each part with one PublishBatch call
// when the destination is a forwarder.BatchPublisher, otherwise one Publish per message
// (holding back an ordering key's later messages after a failure). Parts of different
// routes go out concurrently. A message no route takes gets a *NoRouteError.
func (p *Publisher) PublishBatch(ctx context.Context, batch []forwarder.Outgoing) []error {
	errs := make([]error, len(batch))
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.closed {
		for i := range errs {
			errs[i] = ErrClosed
		}
		return errs
	}
	type part struct {
		pub message.Publisher
		idx []int
	}
	var parts []*part
	partRoute := map[*part]int{}
	byRoute := map[int]*part{}
	routes := make([]int, len(batch))
	keyRoute := map[string]int{} // ordering key → its one route, or -2 when it spans routes
	for i, o := range batch {
		routes[i] = p.route(o.Topic)
		key := o.Message.Metadata.Get(outbox.MetadataOrderingKey)
		if key == "" || routes[i] < 0 {
			continue
		}
		if r, ok := keyRoute[key]; !ok {
			keyRoute[key] = routes[i]
		} else if r != routes[i] {
			keyRoute[key] = -2
		}
	}
	// The events of a key that spans routes go out one after another in batch order, each
	// after the previous was accepted (a failure holds back the key's later events), beside
	// the per-route parts, which hold no such key.
	var spanning []int
	for i, o := range batch {
		r := routes[i]
		if r < 0 {
			errs[i] = &NoRouteError{Topic: o.Topic}
			continue
		}
		if key := o.Message.Metadata.Get(outbox.MetadataOrderingKey); key != "" && keyRoute[key] == -2 {
			spanning = append(spanning, i)
			continue
		}
		pt := byRoute[r]
		if pt == nil {
			pt = &part{pub: p.dest(r)}
			byRoute[r] = pt
			partRoute[pt] = r
			parts = append(parts, pt)
		}
		pt.idx = append(pt.idx, i)
	}
	var wg sync.WaitGroup
	if len(spanning) > 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			failed := map[string]bool{}
			for _, i := range spanning {
				key := batch[i].Message.Metadata.Get(outbox.MetadataOrderingKey)
				if failed[key] {
					errs[i] = forwarder.ErrHeldBack
					continue
				}
				errs[i] = p.named(routes[i], publishPart(ctx, p.dest(routes[i]), batch[i:i+1])[0])
				if errs[i] != nil {
					failed[key] = true
				}
			}
		}()
	}
	for _, pt := range parts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sub := make([]forwarder.Outgoing, len(pt.idx))
			for j, i := range pt.idx {
				sub[j] = batch[i]
			}
			res := publishPart(ctx, pt.pub, sub)
			for j, i := range pt.idx {
				errs[i] = p.named(partRoute[pt], res[j])
			}
		}()
	}
	wg.Wait()
	return errs
}

// partConcurrency bounds the messages of one part that a per-message destination has in
// flight at once (SubscriberConfig.Concurrency's default).
const partConcurrency = 10

func publishPart(ctx context.Context, pub message.Publisher, part []forwarder.Outgoing) []error {
	if bp, ok := pub.(forwarder.BatchPublisher); ok {
		res := bp.PublishBatch(ctx, part)
		out := make([]error, len(part))
		for j := range out {
			if j < len(res) {
				out[j] = res[j]
			} else {
				out[j] = forwarder.ErrMissingResult
			}
		}
		return out
	}
	// A per-message destination gets the part as the per-message path would: one lane per
	// ordering key (each unordered message a lane of its own), lanes concurrently, a key's
	// messages one after another with its later ones held back after a failure. Once the
	// destination answers unavailable, the messages not sent yet get that answer without a
	// call (a destination down as a whole: no attempt is counted, its topics are paused).
	out := make([]error, len(part))
	var lanes [][]int
	laneOf := map[string]int{}
	for j, o := range part {
		key := o.Message.Metadata.Get(outbox.MetadataOrderingKey)
		if key == "" {
			lanes = append(lanes, []int{j})
			continue
		}
		l, ok := laneOf[key]
		if !ok {
			l = len(lanes)
			laneOf[key] = l
			lanes = append(lanes, nil)
		}
		lanes[l] = append(lanes[l], j)
	}
	var down atomic.Pointer[error]
	sem := make(chan struct{}, partConcurrency)
	var wg sync.WaitGroup
	for _, lane := range lanes {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			failed := false
			for _, j := range lane {
				switch {
				case failed:
					out[j] = forwarder.ErrHeldBack
				case ctx.Err() != nil:
					out[j] = ctx.Err()
				case down.Load() != nil:
					out[j] = *down.Load()
				default:
					err := pub.Publish(part[j].Topic, part[j].Message)
					if errors.Is(err, outbox.ErrUnavailable) {
						down.CompareAndSwap(nil, &err)
					}
					out[j] = err
				}
				failed = failed || out[j] != nil
			}
		}()
	}
	wg.Wait()
	return out
}

// Close marks the Publisher closed (later Publish calls fail with ErrClosed) and, with
// Config.CloseDestinations, closes every destination once and returns their errors joined.
// Idempotent.
func (p *Publisher) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	if !p.cfg.CloseDestinations {
		return nil
	}
	var errs []error
	seen := map[any]bool{}
	for i := range len(p.cfg.Routes) + 1 {
		pub := p.dest(i)
		if pub == nil {
			continue
		}
		// A publisher of a comparable type is closed once however many routes it serves;
		// others (a forwarder.Func) once per route.
		var key any = i
		if reflect.ValueOf(pub).Comparable() {
			key = pub
		}
		if seen[key] {
			continue
		}
		seen[key] = true
		if err := pub.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
