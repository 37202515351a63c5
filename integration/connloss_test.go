package integration_test

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/watermill-outbox/outbox/forwarder"
	"github.com/watermill-outbox/outbox/forwarder/amqp"
	"github.com/watermill-outbox/outbox/internal/brokertest"
	"github.com/watermill-outbox/outbox/internal/pgtest"
)

// drop closes the proxied connections and keeps listening: a connection lost mid-flight to a
// broker that answers a new connection at once.
func (p *outageProxy) drop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.conns = nil
}

// cuttingDest wraps a BatchPublisher: when armed, the next PublishBatch has its connection
// dropped while it publishes, and the number of messages left without a confirm (non-nil
// results) is added to unconfirmed.
type cuttingDest struct {
	*amqp.Publisher
	px          *outageProxy
	armed       atomic.Bool
	cuts        chan struct{}
	unconfirmed atomic.Int64
}

func (d *cuttingDest) PublishBatch(ctx context.Context, batch []forwarder.Outgoing) []error {
	if !d.armed.CompareAndSwap(true, false) {
		return d.Publisher.PublishBatch(ctx, batch)
	}
	// The drop runs while PublishBatch publishes and awaits confirms.
	go d.px.drop()
	errs := d.Publisher.PublishBatch(ctx, batch)
	n := 0
	for _, err := range errs {
		if err != nil {
			n++
		}
	}
	d.unconfirmed.Add(int64(n))
	d.cuts <- struct{}{}
	return errs
}

// TestAMQPConnectionCutChargesNoAttempt: the AMQP connection is dropped in the middle of a
// batch, 10 times; the Publisher reconnects and the unconfirmed messages are sent again.
// MaxAttempts is 1, so a charged attempt would be a dead letter: 0 attempts, 0 dead letters,
// each event marked published once and only after RabbitMQ confirmed it (every marked event
// is in the queue), and the queue holds at most as many duplicates as messages were left
// unconfirmed.
func TestAMQPConnectionCutChargesNoAttempt(t *testing.T) {
	const rounds, perRound, keys = 10, 400, 40
	url := brokertest.RequireRabbitMQ(t)
	e := fwdNewEnv(t)
	q := fwdName("connloss-amqp")
	fwdAMQPQueues(t, url, q)
	px := newOutageProxy(t, strings.TrimSuffix(strings.SplitN(url, "@", 2)[1], "/"))
	dest := &cuttingDest{Publisher: fwdAMQPPublisher(t, amqp.Config{URL: "amqp://guest:guest@" + px.addr + "/"}), px: px, cuts: make(chan struct{}, 1)}

	ch := fwdAMQPChannel(t, url)
	deliveries, err := ch.Consume(q, "", true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu       sync.Mutex
		received = map[string]int{}
	)
	go func() {
		for d := range deliveries {
			mu.Lock()
			received[d.MessageId]++
			mu.Unlock()
		}
	}()

	cfg := e.subCfg()
	cfg.MaxAttempts, cfg.BatchSize, cfg.MaxRunPerKey = 1, perRound, perRound/keys
	e.run(e.subscriber(cfg), dest, forwarder.Config{})
	total := 0
	for r := range rounds {
		dest.armed.Store(true)
		e.seed(perRound, keys, func(int) string { return q })
		total += perRound
		select {
		case <-dest.cuts:
		case <-time.After(30 * time.Second):
			t.Fatalf("round %d: no batch cut within 30s", r)
		}
		e.waitSettled(60*time.Second, total, 0)
	}
	distinct := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(received)
	}
	pgtest.Eventually(t, 30*time.Second, "every event in the queue", func() bool { return distinct() == total })
	if n := e.count("attempts > 0 OR dead_lettered_at IS NOT NULL"); n != 0 {
		t.Fatalf("%d events charged an attempt over %d cuts, want 0", n, rounds)
	}
	e.checkMarkedOnce(fwdIDs(e.events))
	mu.Lock()
	defer mu.Unlock()
	dups := 0
	for _, ev := range e.events {
		c := received[ev.id]
		if c == 0 {
			t.Errorf("event %s marked published but not in the queue", ev.id)
		}
		dups += max(c-1, 0)
	}
	unconfirmed := int(dest.unconfirmed.Load())
	if unconfirmed == 0 {
		t.Fatal("no message was left unconfirmed by the cuts: the test did not cut mid-batch")
	}
	if dups > unconfirmed {
		t.Fatalf("%d duplicates in the queue, more than the %d unconfirmed messages", dups, unconfirmed)
	}
	t.Logf("%d cuts mid-batch: %d messages left unconfirmed, %d duplicates in the queue, 0 attempts charged, 0 dead letters, %d events each marked once",
		rounds, unconfirmed, dups, total)
}

// TestKafkaProducerStateLossKeepsOrder: kfake answers produce requests now and then with
// OUT_OF_ORDER_SEQUENCE_NUMBER, UNKNOWN_PRODUCER_ID, INVALID_PRODUCER_EPOCH or PRODUCER_FENCED
// for every partition, as a bounced broker that forgot the idempotent producer does (nothing
// is appended). kgo takes a new producer epoch and sends the batches again in order (or, for
// PRODUCER_FENCED, fails the partition's records, released unattempted): MaxAttempts is 1, yet 0 attempts are charged and nothing is
// dead-lettered; read back with the stock watermill-kafka subscriber, every key is in order,
// once. The time from each refusal to the next accepted produce request is logged.
func TestKafkaProducerStateLossKeepsOrder(t *testing.T) {
	const topic = "fwd.kafka.producer-state"
	codes := []int16{kerr.OutOfOrderSequenceNumber.Code, kerr.UnknownProducerID.Code, kerr.InvalidProducerEpoch.Code, kerr.ProducerFenced.Code}
	e := fwdNewEnv(t)
	c := brokertest.Kafka(t, kfake.SeedTopics(2, topic))
	var (
		mu       sync.Mutex
		n        int
		refusals []time.Time
		accepted []time.Time
	)
	c.ControlKey(int16(kmsg.Produce), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		mu.Lock()
		defer mu.Unlock()
		n++
		if n%2 != 0 || len(refusals) >= 2*len(codes) {
			accepted = append(accepted, time.Now())
			return nil, nil, false // the broker appends as usual
		}
		code := codes[len(refusals)%len(codes)]
		refusals = append(refusals, time.Now())
		return brokertest.ProduceRefusal(kreq, code), nil, true
	})
	evs := e.seed(600, 30, func(int) string { return topic })
	cfg := e.subCfg()
	cfg.MaxAttempts = 1
	cfg.BatchSize = 25 // kgo sends a batch in one or two produce requests: 24 batches make enough of them
	e.run(e.subscriber(cfg), fwdKafkaPublisher(t, c, fwdKafkaFastOpts()...), forwarder.Config{})
	e.waitSettled(60*time.Second, len(evs), 0)
	if n := e.count("attempts > 0 OR dead_lettered_at IS NOT NULL"); n != 0 {
		t.Fatalf("%d events charged an attempt, want 0", n)
	}
	e.checkMarkedOnce(fwdIDs(evs))
	var col fwdCollector
	fwdKafkaConsume(t, c, &col, topic)
	pgtest.Eventually(t, 30*time.Second, "all events consumed", func() bool { return col.len() >= len(evs) })
	e.checkOrderOnce(col.all(), evs)

	mu.Lock()
	defer mu.Unlock()
	if len(refusals) != 2*len(codes) {
		t.Fatalf("%d produce requests refused, want %d", len(refusals), 2*len(codes))
	}
	var worst time.Duration
	for _, r := range refusals {
		for _, a := range accepted {
			if a.After(r) {
				worst = max(worst, a.Sub(r))
				break
			}
		}
	}
	t.Logf("%d produce requests refused for the producer's state (%d accepted): 0 attempts charged, per-key order intact; longest refusal → next accepted produce: %s",
		len(refusals), len(accepted), worst.Round(time.Millisecond))
}
