package integration_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-outbox/outbox/forwarder"
	"github.com/watermill-outbox/outbox/router"
)

// shutdownRounds and shutdownInFlight: each round stops a relay with this many events out.
const shutdownRounds, shutdownInFlight = 20, 50

// shutdownDest is a destination whose deliveries are in flight when the relay stops: every
// call blocks until begun is closed; then events whose index (payload "i") is a multiple of 3
// are delivered, the others wait for their context to end (the relay's stop cuts them short)
// and fail with its error, as a client cut off mid-call does.
type shutdownDest struct {
	begun   chan struct{}
	begin   func()        // closes begun once
	started chan struct{} // one value per message handed to the destination
}

func newShutdownDest(t *testing.T) *shutdownDest {
	d := &shutdownDest{begun: make(chan struct{}), started: make(chan struct{}, shutdownInFlight)}
	d.begin = sync.OnceFunc(func() { close(d.begun) })
	t.Cleanup(d.begin) // a failed round does not leave its deliveries blocked
	return d
}

func shutdownIndex(msg *message.Message) int {
	var p struct{ I int }
	_ = json.Unmarshal(msg.Payload, &p)
	return p.I
}

// deliver is one message's call.
func (d *shutdownDest) deliver(ctx context.Context, msg *message.Message) error {
	d.started <- struct{}{}
	<-d.begun
	if shutdownIndex(msg)%3 == 0 {
		return nil
	}
	<-ctx.Done()
	return fmt.Errorf("publish cut short: %w", ctx.Err())
}

func (d *shutdownDest) Publish(_ string, msgs ...*message.Message) error {
	for _, m := range msgs {
		if err := d.deliver(m.Context(), m); err != nil {
			return err
		}
	}
	return nil
}

func (d *shutdownDest) Close() error { return nil }

// PublishBatch makes shutdownDest a forwarder.BatchPublisher: the whole batch in one call.
func (d *shutdownDest) PublishBatch(ctx context.Context, batch []forwarder.Outgoing) []error {
	errs := make([]error, len(batch))
	var wg sync.WaitGroup
	for i, o := range batch {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = d.deliver(ctx, o.Message)
		}()
	}
	wg.Wait()
	return errs
}

// waitStarted waits until all shutdownInFlight messages reached the destination.
func (d *shutdownDest) waitStarted(t *testing.T, round int) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for n := range shutdownInFlight {
		select {
		case <-d.started:
		case <-timeout:
			t.Fatalf("round %d: %d messages in flight after 10s, want %d", round, n, shutdownInFlight)
		}
	}
}

// TestShutdownChargesNoAttempt stops a relay with 50 events in flight, 20 times each: a plain
// Watermill Router over the outbox Subscriber (no RecordError), the Forwarder's per-message
// path (a Router inside) delivering through a router.Publisher, and the Forwarder's batch
// path. The Subscriber's CloseTimeout (100 ms) lets the deliveries that finish go through; the
// rest end with their context. MaxAttempts is 1, so a charged attempt would be a dead letter.
// Each round: exactly the delivered third is published, the rest released with 0 attempts;
// afterwards every event is delivered.
func TestShutdownChargesNoAttempt(t *testing.T) {
	for _, how := range []string{"watermill-router", "forwarder-router-publisher", "forwarder-batch", "forwarder-batch-ctx"} {
		t.Run(how, func(t *testing.T) {
			e := fwdNewEnv(t)
			cfg := e.subCfg()
			cfg.MaxAttempts, cfg.BatchSize, cfg.MaxRunPerKey, cfg.Concurrency = 1, shutdownInFlight, shutdownInFlight, shutdownInFlight
			cfg.CloseTimeout = 100 * time.Millisecond
			delivered := 0
			for r := range shutdownRounds {
				topic := fmt.Sprintf("stop.%d", r)
				e.seed(shutdownInFlight, 0, func(int) string { return topic })
				sub := e.subscriber(cfg)
				dest := newShutdownDest(t)
				var stop func() error
				switch how {
				case "watermill-router":
					rt, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, nil)
					if err != nil {
						t.Fatal(err)
					}
					rt.AddConsumerHandler("h", topic, sub, func(msg *message.Message) error { return dest.deliver(msg.Context(), msg) })
					errc := make(chan error, 1)
					go func() { errc <- rt.Run(context.Background()) }()
					stop = func() error {
						err := rt.Close()
						if rerr := <-errc; rerr != nil {
							t.Errorf("router run: %v", rerr)
						}
						return err
					}
				case "forwarder-router-publisher":
					rp, err := router.New(router.Config{Routes: []router.Route{{Topic: "stop.*", Publisher: forwarder.Func(dest.deliver)}}}, nil)
					if err != nil {
						t.Fatal(err)
					}
					// router.Publisher takes batches; the per-message path is asked for.
					f := e.run(sub, rp, forwarder.Config{SubscribeTopic: topic, CloseTimeout: 10 * time.Second, DisableBatches: true})
					stop = f.Close
				case "forwarder-batch":
					f := e.run(sub, dest, forwarder.Config{SubscribeTopic: topic, CloseTimeout: 100 * time.Millisecond})
					stop = f.Close
				case "forwarder-batch-ctx":
					// Stopped by ending Run's context (as `outbox relay` on SIGTERM), not Close.
					f, err := forwarder.New(sub, dest, forwarder.Config{SubscribeTopic: topic, CloseTimeout: 100 * time.Millisecond}, nil)
					if err != nil {
						t.Fatal(err)
					}
					rctx, cancel := context.WithCancel(context.Background())
					errc := make(chan error, 1)
					go func() { errc <- f.Run(rctx) }()
					select {
					case <-f.Running():
					case err := <-errc:
						t.Fatalf("forwarder did not start: %v", err)
					case <-time.After(10 * time.Second):
						t.Fatal("forwarder not running after 10s")
					}
					stop = func() error { cancel(); return <-errc }
				}
				dest.waitStarted(t, r)
				dest.begin()
				if err := stop(); err != nil {
					t.Fatalf("round %d: close: %v", r, err)
				}
				want := (shutdownInFlight + 2) / 3 // indexes 0, 3, … 48
				delivered += want
				where := fmt.Sprintf("topic = '%s' AND ", topic)
				if n := e.count(where + "published_at IS NOT NULL"); n != want {
					t.Fatalf("round %d: %d published, want %d", r, n, want)
				}
				if n := e.count(where + "published_at IS NULL AND dead_lettered_at IS NULL AND lease_until IS NULL AND attempts = 0 AND delivery_starts = 0"); n != shutdownInFlight-want {
					e.dump()
					t.Fatalf("round %d: %d released without an attempt, want %d", r, n, shutdownInFlight-want)
				}
			}
			if n := e.count("attempts > 0 OR dead_lettered_at IS NOT NULL"); n != 0 {
				t.Fatalf("%d events charged an attempt over %d stops, want 0", n, shutdownRounds)
			}
			t.Logf("%s: %d stops with %d events in flight: %d delivered during the stop, %d released, 0 attempts charged, 0 dead letters",
				how, shutdownRounds, shutdownInFlight, delivered, shutdownRounds*shutdownInFlight-delivered)

			// Every event is delivered afterwards.
			var mu sync.Mutex
			seen := map[string]int{}
			e.run(e.subscriber(cfg), forwarder.Func(func(_ context.Context, msg *message.Message) error {
				mu.Lock()
				seen[msg.UUID]++
				mu.Unlock()
				return nil
			}), forwarder.Config{SubscribeTopic: "stop.*"})
			e.waitSettled(30*time.Second, shutdownRounds*shutdownInFlight, 0)
			if n := e.count("attempts > 0"); n != 0 {
				t.Fatalf("%d events charged an attempt, want 0", n)
			}
			mu.Lock()
			defer mu.Unlock()
			if len(seen) != shutdownRounds*shutdownInFlight-delivered {
				t.Fatalf("the last relay delivered %d events, want %d", len(seen), shutdownRounds*shutdownInFlight-delivered)
			}
		})
	}
}
