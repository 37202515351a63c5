package kafka

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/IBM/sarama"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/forwarder"
	"github.com/watermill-outbox/outbox/internal/netfail"
)

// unavailableErrors are the Kafka and Sarama errors that say the cluster (or the partition's
// leader) cannot take writes right now, whatever the message: no broker reachable, no leader,
// too few in-sync replicas for acks = all, a request timeout, a broker-side network or storage
// failure. Sarama has already retried them Producer.Retry.Max times when they surface. Also
// the idempotent producer's own state after such a failure: Sarama bumps its producer epoch
// when it gives up on a record batch, and a batch still in flight with the old epoch (or out
// of sequence) is refused with INVALID_PRODUCER_EPOCH or OUT_OF_ORDER_SEQUENCE_NUMBER — an
// echo of the outage, not a fault of the message; the next send goes through.
var unavailableErrors = []error{
	sarama.ErrOutOfBrokers, sarama.ErrBrokerNotAvailable, sarama.ErrLeaderNotAvailable,
	sarama.ErrNotLeaderForPartition, sarama.ErrNotEnoughReplicas, sarama.ErrNotEnoughReplicasAfterAppend,
	sarama.ErrRequestTimedOut, sarama.ErrNetworkException, sarama.ErrKafkaStorageError,
	sarama.ErrInvalidProducerEpoch, sarama.ErrOutOfOrderSequenceNumber,
}

// probeTimeout bounds the metadata request that tells a dropped connection from a cluster
// that is down.
const probeTimeout = 2 * time.Second

// classify maps a message's send error to the outbox's failure classes: too large for the
// producer or the broker (MESSAGE_TOO_LARGE, also when refused before sending) is permanent;
// unreachable brokers, an unavailableErrors answer, or a connection that broke while the
// cluster does not answer a metadata request either (down is called at most once per batch)
// is unavailable; anything else (an unknown topic, an open circuit breaker, an authorization
// error) stays an ordinary failure.
func (p *Publisher) classify(err error, down func() bool) error {
	switch {
	case err == nil, errors.Is(err, forwarder.ErrHeldBack), errors.Is(err, ErrClosed),
		errors.Is(err, outbox.ErrPermanent), errors.Is(err, outbox.ErrUnavailable),
		errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return err
	case errors.Is(err, sarama.ErrMessageSizeTooLarge):
		return outbox.Permanent(err)
	case netfail.Unreachable(err), isUnavailable(err), netfail.Dropped(err) && down():
		return &outbox.UnavailableError{Destination: p.name, Err: err}
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

// downCheck returns a function that reports, once per batch, whether the cluster fails to
// answer a metadata request within probeTimeout.
func (p *Publisher) downCheck() func() bool {
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
