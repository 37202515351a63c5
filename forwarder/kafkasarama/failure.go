package kafkasarama

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/eapache/go-resiliency/breaker"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/forwarder"
	"github.com/watermill-outbox/outbox/internal/netfail"
)

// unavailableErrors are the Kafka and Sarama errors that say the cluster (or the partition's
// leader) cannot take writes right now, whatever the message: no broker reachable, no leader,
// too few in-sync replicas for acks = all, a request timeout, a broker-side network or storage
// failure. Sarama has already retried them Producer.Retry.Max times when they surface.
var unavailableErrors = []error{
	sarama.ErrOutOfBrokers, sarama.ErrBrokerNotAvailable, sarama.ErrLeaderNotAvailable,
	sarama.ErrNotLeaderForPartition, sarama.ErrNotEnoughReplicas, sarama.ErrNotEnoughReplicasAfterAppend,
	sarama.ErrRequestTimedOut, sarama.ErrNetworkException, sarama.ErrKafkaStorageError,
}

// producerStateErrors say that the broker lost or refuses the idempotent producer's state, not
// the message: OUT_OF_ORDER_SEQUENCE_NUMBER and UNKNOWN_PRODUCER_ID (a broker that forgot the
// producer's sequence, after a bounce or a retention cut), INVALID_PRODUCER_EPOCH (Sarama
// bumped its epoch after giving up on a record batch) and PRODUCER_FENCED. The message was not
// appended. The Publisher recreates its producer (a new producer id, sequences from 0) and
// sends each key again from its first unacknowledged message (producerLost); what still fails
// is not attempted (outbox.NotAttempted).
var producerStateErrors = []error{
	sarama.ErrOutOfOrderSequenceNumber, sarama.ErrUnknownProducerID, sarama.ErrInvalidProducerEpoch, sarama.ErrProducerFenced,
}

// producerStateLost reports whether err is one of producerStateErrors.
func producerStateLost(err error) bool {
	for _, e := range producerStateErrors {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// probeTimeout bounds the metadata request that tells a dropped connection from a cluster
// that is down.
const probeTimeout = 2 * time.Second

// classify maps a message's send error to the outbox's failure classes: too large for the
// producer or the broker (MESSAGE_TOO_LARGE, also when refused before sending) is permanent;
// unreachable brokers, an unavailableErrors answer, or a lost contact with the cluster (a
// connection that broke, a broker not connected, Sarama's circuit breaker open after failed
// metadata requests) while the cluster does not answer a metadata request either (down is
// called at most once per batch) is unavailable; the producer's state lost (producerStateErrors)
// or a connection that broke while the cluster answers is not attempted (the outcome is
// unknown, not refused: released, sent again at the next claim); anything else (an unknown
// topic, an open circuit breaker while the cluster answers, an authorization error) stays an
// ordinary failure.
func (p *Publisher) classify(err error, down func() bool) error {
	switch {
	case err == nil, errors.Is(err, forwarder.ErrHeldBack), errors.Is(err, ErrClosed),
		errors.Is(err, outbox.ErrPermanent), errors.Is(err, outbox.ErrUnavailable),
		errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return err
	case errors.Is(err, sarama.ErrMessageSizeTooLarge):
		return outbox.Permanent(err)
	case producerStateLost(err):
		return outbox.NotAttempted(err)
	case netfail.Unreachable(err), isUnavailable(err), lostContact(err) && down():
		return &outbox.UnavailableError{Destination: p.name, Err: err}
	case netfail.Dropped(err), errors.Is(err, sarama.ErrNotConnected):
		return outbox.NotAttempted(err)
	}
	return err
}

func isUnavailable(err error) bool {
	for _, u := range unavailableErrors {
		if errors.Is(err, u) {
			return true
		}
	}
	return false
}

// downCheck returns a function that reports, once per batch, whether the cluster was down:
// another message of the batch (errs) found no broker reachable (a refused dial, Sarama out
// of brokers), or the cluster fails to answer a metadata request within probeTimeout. The
// first covers a batch whose sends failed during an outage shorter than Sarama's retries,
// classified after the cluster is back.
func (p *Publisher) downCheck(errs []error) func() bool {
	for _, err := range errs {
		if err != nil && (netfail.Unreachable(err) || errors.Is(err, sarama.ErrOutOfBrokers)) {
			return func() bool { return true }
		}
	}
	var once sync.Once
	var down bool
	return func() bool {
		once.Do(func() {
			done := make(chan error, 1)
			go func() { done <- p.client.RefreshMetadata() }()
			t := time.NewTimer(probeTimeout)
			defer t.Stop()
			select {
			case err := <-done:
				down = err != nil
			case <-t.C:
				down = true
			}
		})
		return down
	}
}

// lostContact reports whether err says the producer lost contact with the cluster rather than
// that the broker refused the message: a dropped connection (netfail.Dropped), a broker
// Sarama is not connected to (ErrNotConnected), or Sarama's circuit breaker, which opens for
// 10 s after three failed metadata requests for a topic or partition (ErrBreakerOpen; nothing
// was sent). Unavailable only when the cluster does not answer either.
func lostContact(err error) bool {
	return netfail.Dropped(err) || errors.Is(err, sarama.ErrNotConnected) || errors.Is(err, breaker.ErrBreakerOpen)
}

// staleBreaker returns the indexes of the messages of one SendMessages call that Sarama's
// circuit breaker refused (nothing was sent) and that can be sent again in order: no later
// message with the same Kafka key in the call was acknowledged.
func staleBreaker(pms []*sarama.ProducerMessage, res []error) []int {
	return resendable(pms, res, func(err error) bool { return errors.Is(err, breaker.ErrBreakerOpen) })
}

// resendable returns the indexes of the messages of one SendMessages call whose error matches
// and that can be sent again in order: no later message with the same Kafka key in the call
// was acknowledged. So each key is resent from its first unacknowledged message.
func resendable(pms []*sarama.ProducerMessage, res []error, match func(error) bool) []int {
	var out []int
	for i, err := range res {
		if err == nil || !match(err) {
			continue
		}
		ok := true
		for j := i + 1; j < len(pms) && ok; j++ {
			ok = res[j] != nil || !sameKey(pms[i], pms[j])
		}
		if ok {
			out = append(out, i)
		}
	}
	return out
}

// sameKey reports whether a and b have the same Kafka key (both without one counts as the same).
func sameKey(a, b *sarama.ProducerMessage) bool {
	enc := func(m *sarama.ProducerMessage) ([]byte, bool) {
		if m.Key == nil {
			return nil, true
		}
		k, err := m.Key.Encode()
		return k, err == nil
	}
	ka, okA := enc(a)
	kb, okB := enc(b)
	return !okA || !okB || string(ka) == string(kb)
}

// metadataState is what a metadata request for a topic found.
type metadataState int

const (
	clusterDown  metadataState = iota // no answer within probeTimeout, or the request failed (but for an unknown topic)
	topicUnknown                      // the cluster answered; the topic has no partitions
	topicKnown                        // the cluster answered with the topic's partitions
)

// topicState asks the cluster for topic's metadata, waiting at most probeTimeout.
func (p *Publisher) topicState(topic string) metadataState {
	done := make(chan metadataState, 1)
	go func() {
		if err := p.client.RefreshMetadata(topic); err != nil && !errors.Is(err, sarama.ErrUnknownTopicOrPartition) {
			done <- clusterDown
			return
		}
		if ps, err := p.client.Partitions(topic); err != nil || len(ps) == 0 {
			done <- topicUnknown
			return
		}
		done <- topicKnown
	}()
	t := time.NewTimer(probeTimeout)
	defer t.Stop()
	select {
	case st := <-done:
		return st
	case <-t.C:
		return clusterDown
	}
}

// breakerOpen handles the messages at idx of one SendMessages call on prod that Sarama's
// circuit breaker refused (nothing was sent; see staleBreaker). Sarama opens a topic's or a
// partition's breaker for 10 s after three failed metadata requests, offers no way to reset
// it, and keeps it open after the cluster is back. So, per topic: when the cluster does not
// answer a metadata request, the messages are unavailable; when it answers and knows the
// topic, the breaker is an echo of an outage that has ended: the producer is renewed (see
// renewProducer) and the messages are sent once more on the new one (still refused by a
// breaker, or not renewed: unavailable); when the topic is unknown, the error stays as it is
// (an ordinary failure). res is updated in place.
func (p *Publisher) breakerOpen(ctx context.Context, prod sarama.SyncProducer, pms []*sarama.ProducerMessage, res []error, idx []int) {
	states := map[string]metadataState{}
	var resend []int
	for _, i := range idx {
		t := pms[i].Topic
		st, ok := states[t]
		if !ok {
			st = p.topicState(t)
			states[t] = st
		}
		switch st {
		case clusterDown:
			res[i] = &outbox.UnavailableError{Destination: p.name, Err: res[i]}
		case topicKnown:
			resend = append(resend, i)
		}
	}
	if len(resend) == 0 {
		return
	}
	if !p.renewProducer(prod, "its circuit breaker was still open after the cluster answered again") {
		for _, i := range resend {
			res[i] = &outbox.UnavailableError{Destination: p.name, Err: res[i]}
		}
		return
	}
	out, _ := p.sendOnce(ctx, fresh(pms, resend))
	for j, err := range out {
		if errors.Is(err, breaker.ErrBreakerOpen) {
			err = &outbox.UnavailableError{Destination: p.name, Err: err}
		}
		res[resend[j]] = err
	}
}

// producerLost handles the messages at idx of one SendMessages call on prod that the broker
// refused for the producer's state (producerStateErrors; see resendable): the producer is
// recreated (renewProducer: a new producer id) and the messages are sent once more on the new
// one, each key from its first unacknowledged message, so no key is reordered on the topic.
// res is updated in place; what still fails is classified as usual (not attempted).
func (p *Publisher) producerLost(ctx context.Context, prod sarama.SyncProducer, pms []*sarama.ProducerMessage, res []error, idx []int) {
	if !p.renewProducer(prod, "the broker lost or refused its state: "+res[idx[0]].Error()) {
		return
	}
	out, _ := p.sendOnce(ctx, fresh(pms, idx))
	for j, err := range out {
		res[idx[j]] = err
	}
}

// fresh copies the messages at idx for another send. The old producer's goroutines may still
// read the refused ones after returning them (Sarama's partitionProducer reads msg.retries
// after returnError), and the new producer writes their internal state, so sending the same
// values again is a data race.
func fresh(pms []*sarama.ProducerMessage, idx []int) []*sarama.ProducerMessage {
	again := make([]*sarama.ProducerMessage, len(idx))
	for j, i := range idx {
		m := pms[i]
		again[j] = &sarama.ProducerMessage{Topic: m.Topic, Key: m.Key, Value: m.Value, Headers: m.Headers, Metadata: m.Metadata, Partition: m.Partition, Timestamp: m.Timestamp}
	}
	return again
}

// renewProducer replaces the producer old with a new one on the same client (its breakers
// closed), unless another call did so meanwhile or the Publisher is closed. Reports whether
// messages can be sent on a producer that is not old. Waits for the sends in flight on old.
func (p *Publisher) renewProducer(old sarama.SyncProducer, why string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.closed:
		return false
	case p.producer != old:
		return true
	}
	prod, err := sarama.NewSyncProducerFromClient(p.client)
	if err != nil {
		p.logger.Debug("outbox kafkasarama: producer not renewed", watermill.LogFields{"error": err.Error()})
		return false
	}
	if err := old.Close(); err != nil {
		p.logger.Debug("outbox kafkasarama: closing the replaced producer", watermill.LogFields{"error": err.Error()})
	}
	p.producer = prod
	p.logger.Info("outbox kafkasarama: producer renewed", watermill.LogFields{"reason": why})
	return true
}
