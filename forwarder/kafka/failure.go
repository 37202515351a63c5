package kafka

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/forwarder"
	"github.com/watermill-outbox/outbox/internal/netfail"
)

// unavailableErrors are the Kafka and kgo errors that say the cluster (or the partition's
// leader) cannot take writes right now, whatever the message: no leader, too few in-sync
// replicas for acks = all, a request timeout, a broker-side network or storage failure, or
// records that used up kgo's RecordRetries or RecordDeliveryTimeout. kgo has already retried
// the retryable ones when they surface.
var unavailableErrors = []error{
	kerr.BrokerNotAvailable, kerr.LeaderNotAvailable, kerr.NotLeaderForPartition,
	kerr.NotEnoughReplicas, kerr.NotEnoughReplicasAfterAppend, kerr.RequestTimedOut,
	kerr.NetworkException, kerr.KafkaStorageError, kgo.ErrRecordTimeout, kgo.ErrRecordRetries,
}

// producerStateErrors say that the broker lost or refuses the idempotent producer's state, not
// the message. kgo recovers from them itself (a new epoch, the batch sent again in order);
// when one still surfaces the record was not appended, and it is not attempted.
var producerStateErrors = []error{
	kerr.OutOfOrderSequenceNumber, kerr.UnknownProducerID, kerr.InvalidProducerEpoch,
	kerr.InvalidProducerIDMapping, kerr.ProducerFenced,
}

func isAny(err error, targets []error) bool {
	for _, t := range targets {
		if errors.Is(err, t) {
			return true
		}
	}
	return false
}

// classify maps a message's send error to the outbox's failure classes: too large for the
// producer or the broker (MESSAGE_TOO_LARGE, also when refused before sending) is permanent;
// unreachable brokers, an unavailableErrors answer, or a connection that broke or a record
// kgo did not answer in time (errNoAnswer) while the cluster does not answer a ping either
// (down is called at most once per batch) is unavailable; an idempotent producer state error,
// a connection that broke or a record not answered while the cluster answers, or a context error while ctx (this call's) is live — kgo fails a partition's
// records with the context of the batch's first record, which may be another call's — is not
// attempted (released, sent again at the next claim); the client closed is ErrClosed; anything
// else (an unknown topic, an authorization error) stays an ordinary failure.
func (p *Publisher) classify(ctx context.Context, err error, down func() bool) error {
	switch {
	case err == nil, errors.Is(err, forwarder.ErrHeldBack), errors.Is(err, ErrClosed),
		errors.Is(err, outbox.ErrPermanent), errors.Is(err, outbox.ErrUnavailable):
		return err
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		if ctx.Err() == nil {
			return outbox.NotAttempted(err)
		}
		return err
	case errors.Is(err, kgo.ErrClientClosed):
		return fmt.Errorf("%w: %w", ErrClosed, err)
	case errors.Is(err, kerr.MessageTooLarge):
		return outbox.Permanent(err)
	case isAny(err, producerStateErrors):
		return outbox.NotAttempted(err)
	case netfail.Unreachable(err), isAny(err, unavailableErrors), (netfail.Dropped(err) || errors.Is(err, errNoAnswer)) && down():
		return &outbox.UnavailableError{Destination: p.name, Err: err}
	case netfail.Dropped(err), errors.Is(err, errNoAnswer):
		return outbox.NotAttempted(err)
	}
	return err
}

// downCheck returns a function that reports, once per batch, whether the cluster was down:
// another message of the batch (errs) found no broker reachable, or the cluster fails to
// answer a ping within probeTimeout.
func (p *Publisher) downCheck(errs []error) func() bool {
	for _, err := range errs {
		if err != nil && netfail.Unreachable(err) {
			return func() bool { return true }
		}
	}
	return sync.OnceValue(func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
		defer cancel()
		return p.client.Ping(ctx) != nil
	})
}
