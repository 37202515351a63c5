package wakeup

import (
	"context"
	"math/rand/v2"
	"sort"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
)

// MaxPendingTopics bounds the distinct topics a Coalescer keeps between two sends; beyond it
// the pending set collapses to the empty topic ("wake every relay").
const MaxPendingTopics = 1024

// sendTimeout bounds one send of a Coalescer, and the final send of Close.
const sendTimeout = 5 * time.Second

// Coalescer is the writer side shared by the transports of this module: Signal only records
// topics (it never blocks on the transport), and one goroutine sends them, each distinct topic
// once per batch, at most one batch per window. The first signal after a quiet period is sent
// at once; signals arriving within the window after a send wait for the window's end and go
// out together. So under any write rate, the transport sees at most one message per topic per
// window, and writers never queue on it.
//
// When send fails, the batch is lost (a lost signal is harmless) and the next send waits a
// backoff (Reconnect); each failure is logged, at ERROR from the FailuresBeforeError-th in a
// row on. A Coalescer is safe for concurrent use.
type Coalescer struct {
	window time.Duration
	send   func(ctx context.Context, topics []string) error
	retry  Reconnect
	logger watermill.LoggerAdapter

	mu      sync.Mutex
	pending map[string]struct{}
	closed  bool

	kick      chan struct{}
	done      chan struct{}
	stopped   chan struct{}
	closeOnce sync.Once
}

// NewCoalescer starts a Coalescer that hands batches of distinct topics to send (in sorted
// order; the empty topic means "wake every relay"). window ≤ 0 means DefaultWindow; retry's
// zero fields mean their defaults. send is called from one goroutine at a time with a context
// bounded to a few seconds; it should return promptly when that context ends. A nil logger
// means watermill.NopLogger. Call Close to stop it.
func NewCoalescer(window time.Duration, send func(ctx context.Context, topics []string) error, retry Reconnect, logger watermill.LoggerAdapter) *Coalescer {
	if window <= 0 {
		window = DefaultWindow
	}
	c := &Coalescer{
		window:  window,
		send:    send,
		retry:   retry.WithDefaults(),
		logger:  orNop(logger),
		pending: map[string]struct{}{},
		kick:    make(chan struct{}, 1),
		done:    make(chan struct{}),
		stopped: make(chan struct{}),
	}
	go c.run()
	return c
}

// Signal records topics for the next batch and returns at once. Signals after Close are
// dropped.
func (c *Coalescer) Signal(topics ...string) {
	if len(topics) == 0 {
		return
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	if _, all := c.pending[""]; !all {
		for _, t := range topics {
			c.pending[t] = struct{}{}
		}
		if len(c.pending) > MaxPendingTopics {
			c.pending = map[string]struct{}{"": {}}
		}
	}
	c.mu.Unlock()
	notify(c.kick)
}

// Close sends the signals still pending (bounded by a few seconds) and stops the goroutine.
// Idempotent; returns nil.
func (c *Coalescer) Close() error {
	c.closeOnce.Do(func() {
		c.mu.Lock()
		c.closed = true
		c.mu.Unlock()
		close(c.done)
	})
	<-c.stopped
	return nil
}

func (c *Coalescer) take() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.pending) == 0 {
		return nil
	}
	topics := make([]string, 0, len(c.pending))
	if _, all := c.pending[""]; all {
		topics = append(topics, "")
	} else {
		for t := range c.pending {
			topics = append(topics, t)
		}
		sort.Strings(topics)
	}
	clear(c.pending)
	return topics
}

func (c *Coalescer) run() {
	defer close(c.stopped)
	failures := 0
	for {
		select {
		case <-c.kick:
		case <-c.done:
			c.flush(&failures)
			return
		}
		wait := c.window
		if !c.flush(&failures) {
			wait = max(wait, c.retry.backoff(failures, rand.Float64()))
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-c.done:
			t.Stop()
			c.flush(&failures)
			return
		}
	}
}

// flush sends the pending topics; it reports false when the send failed.
func (c *Coalescer) flush(failures *int) bool {
	topics := c.take()
	if len(topics) == 0 {
		return true
	}
	ctx, cancel := context.WithTimeout(context.Background(), sendTimeout)
	err := c.send(ctx, topics)
	cancel()
	if err != nil {
		*failures++
		logFailure(c.logger, "wakeup: signals lost (relays will find the events at their next poll)", err, *failures,
			watermill.LogFields{"topics": len(topics)})
		return false
	}
	if *failures > 0 {
		c.logger.Info("wakeup: signals sent again", watermill.LogFields{"after_failures": *failures})
	}
	*failures = 0
	c.logger.Trace("wakeup: signals sent", watermill.LogFields{"topics": len(topics)})
	return true
}
