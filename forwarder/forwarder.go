package forwarder

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-outbox/outbox"
)

// Subscriber is the outbox side of a Forwarder: *outbox.Subscriber implements it. Subscribe
// emits messages one at a time per ordering key (the per-message path); SubscribeBatches emits
// whole claimed batches (the batch path, see outbox.Batch).
type Subscriber interface {
	message.Subscriber
	SubscribeBatches(ctx context.Context, topic string) (<-chan outbox.Batch, error)
}

// Forwarder relays outbox events to a Watermill publisher: each event the publisher
// acknowledges is acked (marked published); each failure is nacked with its error recorded in
// last_error, so the outbox retries it with backoff and dead-letters it at MaxAttempts.
//
// When the publisher implements BatchPublisher (and Config.DisableBatches is false) each claimed
// batch goes out in one PublishBatch call with a result per message; otherwise a Watermill
// Router runs Handler on every message, with outbox.RecordError outermost and
// Config.Middlewares inside it, different ordering keys concurrently (up to the Subscriber's
// Concurrency) and one key's events one after another.
//
// Run, Close and Running are safe for concurrent use. A Forwarder runs once.
type Forwarder struct {
	sub    Subscriber
	pub    message.Publisher
	batch  BatchPublisher // nil: per-message path
	cfg    Config
	logger watermill.LoggerAdapter

	mu         sync.Mutex
	started    bool
	closed     bool
	cancel     context.CancelFunc
	router     *message.Router
	running    chan struct{}
	stopTaking chan struct{}
	loopsDone  chan struct{}
	done       chan struct{}
}

// New returns a Forwarder from sub (usually an *outbox.Subscriber) to pub. A nil logger means
// watermill.NopLogger. Errors: an *outbox.ConfigError for a nil sub or pub or an invalid cfg.
// It starts nothing; call Run.
func New(sub Subscriber, pub message.Publisher, cfg Config, logger watermill.LoggerAdapter) (*Forwarder, error) {
	if sub == nil {
		return nil, &outbox.ConfigError{Field: "sub", Reason: "nil subscriber"}
	}
	if pub == nil {
		return nil, &outbox.ConfigError{Field: "pub", Reason: "nil publisher"}
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	f := &Forwarder{
		sub: sub, pub: pub, cfg: cfg,
		logger:     logger.With(watermill.LogFields{"forwarder": cfg.HandlerName, "subscribe_topic": cfg.SubscribeTopic}),
		running:    make(chan struct{}),
		stopTaking: make(chan struct{}),
		loopsDone:  make(chan struct{}),
		done:       make(chan struct{}),
	}
	if bp, ok := pub.(BatchPublisher); ok && !cfg.DisableBatches {
		f.batch = bp
	}
	return f, nil
}

// Running returns a channel that is closed once Run has subscribed and is forwarding.
func (f *Forwarder) Running() <-chan struct{} { return f.running }

// Run forwards until ctx ends or Close is called, and then returns nil; either way it stops as
// Close describes (the messages or batches in flight get CloseTimeout to be answered). It returns an error
// only when it cannot start: ErrAlreadyRunning, ErrClosed, or the Subscriber's error for
// Config.SubscribeTopic (for example an *outbox.ConfigError for a bad pattern). Failed
// deliveries never reach the caller: they are retried and dead-lettered by the outbox.
func (f *Forwarder) Run(ctx context.Context) error {
	f.mu.Lock()
	switch {
	case f.closed:
		f.mu.Unlock()
		return ErrClosed
	case f.started:
		f.mu.Unlock()
		return ErrAlreadyRunning
	}
	f.started = true
	if f.batch == nil {
		// Watermill's Router closes itself gracefully when its context ends.
		rctx, cancel := context.WithCancel(ctx)
		f.cancel = cancel
		f.router = f.newRouter()
		f.mu.Unlock()
		defer close(f.done)
		defer cancel()
		return f.runRouter(rctx)
	}
	// The batch loops run on a context that the caller's does not end: when ctx ends, the
	// Forwarder stops as Close does (no new batch; the batches in flight get CloseTimeout to
	// be confirmed), instead of cutting them short and sending them all again.
	bctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	f.cancel = cancel
	f.mu.Unlock()
	closed := make(chan struct{})
	stop := context.AfterFunc(ctx, func() { _ = f.Close(); close(closed) })
	err := func() error {
		defer close(f.done) // Close waits for it
		defer cancel()
		return f.runBatches(bctx)
	}()
	if !stop() {
		<-closed // stopped by ctx: return once Close has released or marked what was out
	}
	return err
}

// Close stops the Forwarder: no new event is taken, the messages in flight get up to
// Config.CloseTimeout to be answered, then the outbox Subscriber is closed (as Watermill's
// Router closes its subscribers) and Close waits for Run to return. The publisher is not
// closed: it belongs to the caller. Idempotent; it returns an error only when the router's
// close timed out.
func (f *Forwarder) Close() error {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		if f.started {
			<-f.done
		}
		return nil
	}
	f.closed = true
	started, router := f.started, f.router
	close(f.stopTaking)
	f.mu.Unlock()
	if !started {
		return f.sub.Close()
	}
	var err error
	if router != nil {
		// A router closed before it runs would start its handlers afterwards.
		select {
		case <-f.running:
		case <-f.done:
		}
		err = router.Close()
	} else {
		t := time.NewTimer(f.cfg.CloseTimeout)
		select {
		case <-f.loopsDone:
		case <-t.C:
			f.logger.Info("outbox forwarder: close timeout, abandoning the batches in flight", nil)
		}
		t.Stop()
		f.cancel()
		_ = f.sub.Close()
	}
	<-f.done
	return err
}

func (f *Forwarder) newRouter() *message.Router {
	r, _ := message.NewRouter(message.RouterConfig{CloseTimeout: f.cfg.CloseTimeout}, f.logger)
	r.AddMiddleware(outbox.RecordError)
	r.AddMiddleware(f.cfg.Middlewares...)
	h := Handler(f.pub, f.cfg)
	for i := range f.cfg.Subscriptions {
		name := f.cfg.HandlerName
		if i > 0 {
			name = fmt.Sprintf("%s_%d", name, i)
		}
		r.AddConsumerHandler(name, f.cfg.SubscribeTopic, f.sub, h)
	}
	return r
}

func (f *Forwarder) runRouter(ctx context.Context) error {
	go func() {
		select {
		case <-f.router.Running():
			close(f.running)
		case <-f.done:
		}
	}()
	close(f.loopsDone)
	return f.router.Run(ctx)
}

func (f *Forwarder) runBatches(ctx context.Context) error {
	defer close(f.loopsDone)
	chans := make([]<-chan outbox.Batch, 0, f.cfg.Subscriptions)
	for range f.cfg.Subscriptions {
		ch, err := f.sub.SubscribeBatches(ctx, f.cfg.SubscribeTopic)
		if err != nil {
			return fmt.Errorf("forwarder: subscribe to %q: %w", f.cfg.SubscribeTopic, err)
		}
		chans = append(chans, ch)
	}
	close(f.running)
	f.logger.Info("outbox forwarder running (batches)", watermill.LogFields{"subscriptions": len(chans)})
	var wg sync.WaitGroup
	for _, ch := range chans {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-f.stopTaking:
					return
				case <-ctx.Done():
					return
				case b, ok := <-ch:
					if !ok {
						return
					}
					f.forwardBatch(ctx, b)
				}
			}
		}()
	}
	wg.Wait()
	return nil
}

// forwardBatch publishes one claimed batch and answers every message. The publish is cut short
// when ctx ends or the batch's messages time out (their contexts end at the subscriber's
// DeliveryTimeout).
//
// A failure that ends with the Forwarder's stop (CloseTimeout passed, the publish was cut
// short) is not the destination's judgement of the event: it is nacked as
// outbox.NotAttempted, so the outbox counts no attempt and sends the event again. A permanent
// error keeps its class.
func (f *Forwarder) forwardBatch(runCtx context.Context, b outbox.Batch) {
	if len(b.Messages) == 0 {
		return
	}
	ctx, cancel := context.WithCancel(runCtx)
	stop := context.AfterFunc(b.Messages[0].Context(), cancel)
	errs := forwardBatch(ctx, f.batch, f.cfg.Topic, b.Messages)
	stop()
	cancel()
	stopped := runCtx.Err() != nil
	failed := map[string]string{} // ordering key → first failed event id
	for i, msg := range b.Messages {
		key := msg.Metadata.Get(outbox.MetadataOrderingKey)
		if errs[i] != nil && stopped && !errors.Is(errs[i], outbox.ErrPermanent) {
			errs[i] = outbox.NotAttempted(fmt.Errorf("forwarder stopped before the destination answered: %w", errs[i]))
		}
		if errs[i] != nil {
			if key != "" && failed[key] == "" {
				failed[key] = msg.UUID
			}
			outbox.SetNackError(msg, errs[i])
			msg.Nack()
			continue
		}
		if first := failed[key]; key != "" && first != "" {
			// The destination took a later event of a key whose earlier event failed (see
			// BatchPublisher): the subscriber releases it and delivers it again after the
			// failed one, so receivers see it twice, once out of order.
			f.logger.Info("outbox forwarder: destination took an event after an earlier event of its ordering key failed; it will be delivered again in order",
				watermill.LogFields{"event_id": msg.UUID, "earlier_event_id": first, "ordering_key": key})
		}
		msg.Ack()
	}
}

// forwardBatch prepares msgs, publishes them with bp and returns a result per message. A
// message that cannot be prepared fails, and the later messages of its ordering key are held
// back.
func forwardBatch(ctx context.Context, bp BatchPublisher, mapTopic func(string, *message.Message) string, msgs []*message.Message) []error {
	errs := make([]error, len(msgs))
	outs := make([]Outgoing, 0, len(msgs))
	idx := make([]int, 0, len(msgs))
	held := map[string]bool{}
	for i, msg := range msgs {
		key := msg.Metadata.Get(outbox.MetadataOrderingKey)
		if key != "" && held[key] {
			errs[i] = &PublishError{EventID: msg.UUID, Err: ErrHeldBack}
			continue
		}
		topic, out, err := prepare(mapTopic, msg)
		if err != nil {
			errs[i] = err
			if key != "" {
				held[key] = true
			}
			continue
		}
		outs = append(outs, Outgoing{Topic: topic, Message: out})
		idx = append(idx, i)
	}
	if len(outs) == 0 {
		return errs
	}
	results := bp.PublishBatch(ctx, outs)
	for j, i := range idx {
		err := ErrMissingResult
		if j < len(results) {
			err = results[j]
		}
		if err != nil {
			errs[i] = &PublishError{EventID: msgs[i].UUID, Topic: outs[j].Topic, Err: err}
		}
	}
	return errs
}
