package metrics

import (
	"context"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-outbox/outbox/forwarder"
)

// Publisher wraps a relay destination so that each call to it is recorded with
// Recorder.DestinationCall under destination, used as given (a fixed name such as "kafka";
// Observer.Publisher bounds it by Config.DestinationPatterns and MaxDestinations): one
// Publish call per message on the forwarder's per-message path, one PublishBatch call per
// batch on the batch path (a batch is ok when every message's result is nil). The result is a
// forwarder.BatchPublisher when pub is one. Safe for concurrent use if pub is.
func Publisher(pub message.Publisher, destination string, rec Recorder) message.Publisher {
	p := &timedPublisher{pub: pub, dest: destination, rec: rec}
	if bp, ok := pub.(forwarder.BatchPublisher); ok {
		return &timedBatchPublisher{timedPublisher: p, bp: bp}
	}
	return p
}

type timedPublisher struct {
	pub  message.Publisher
	dest string
	rec  Recorder
}

// Publish calls the wrapped Publish and records its duration.
func (p *timedPublisher) Publish(topic string, msgs ...*message.Message) error {
	start := time.Now()
	err := p.pub.Publish(topic, msgs...)
	p.rec.DestinationCall(p.dest, time.Since(start), err == nil)
	return err
}

// Close closes the wrapped publisher.
func (p *timedPublisher) Close() error { return p.pub.Close() }

type timedBatchPublisher struct {
	*timedPublisher
	bp forwarder.BatchPublisher
}

// PublishBatch calls the wrapped PublishBatch and records its duration.
func (p *timedBatchPublisher) PublishBatch(ctx context.Context, batch []forwarder.Outgoing) []error {
	start := time.Now()
	errs := p.bp.PublishBatch(ctx, batch)
	ok := len(errs) >= len(batch)
	for _, err := range errs {
		ok = ok && err == nil
	}
	p.rec.DestinationCall(p.dest, time.Since(start), ok)
	return errs
}
