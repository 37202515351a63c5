// Package kafkasarama is the outbox forwarder's Kafka destination on IBM/sarama, kept for
// users who must stay on Sarama (forwarder/kafka, on franz-go's kgo, is the default and keeps
// per-key order without per-key rounds): a Watermill publisher on watermill-kafka/v3's message
// format and IBM/sarama's producer that publishes a whole batch
// in one SendMessages call (one produce request per broker for many events), with a result per
// message, so the forwarder marks published only the events that Kafka acknowledged.
//
// Guarantees on top of watermill-kafka's own publisher: the ordering key is the Kafka message
// key (the events of one key land in one partition, in order); acks = all (RequiredAcks =
// WaitForAll); idempotent producer (no duplicates or reordering from the producer's own
// retries); unordered events have no key (Sarama spreads them over the partitions).
//
// What lands on Kafka is readable by the stock watermill-kafka subscriber with its
// DefaultMarshaler: the event id is the message UUID (header _watermill_message_uuid), the
// headers and outbox-* values are the metadata (record headers), the payload is the value.
//
// The partition of a key is Sarama's hash partitioner's choice (FNV-1a), not the Java client's
// murmur2: the events of one key share a partition, but another producer writing the same key
// may pick a different one. Sarama sends one call as one or more produce requests per broker;
// when the broker refuses a whole record batch (too large for the topic, see
// Config.DisableTopicLimits), a later request may already have written later events of the same
// keys: the outbox then does not mark those published and delivers them again after the failed
// one (receivers see a repeat, out of order once), so the outbox's own record stays in order.
//
// Per-key order on the wire: a message refused before sending (marshal error, too large) or
// failed in an earlier SendMessages call holds back its key's later messages of the batch
// (forwarder.ErrHeldBack), and within a call all of a key's messages go to one partition,
// where Sarama keeps one record batch in flight and holds the partition's later messages back
// while it retries a failed one. What no client can undo: when Sarama gives up on a record
// batch after Producer.Retry.Max retries and the partition recovers while a later request of
// the same call still carries that key's later messages, those are written after the failed
// one was not; the outbox does not mark them published and sends them again, in order, after
// it. Such failures are unavailable (below), so the relay pauses rather than retrying at once.
//
// Failure classes (outbox.ErrUnavailable, outbox.ErrPermanent, outbox.ErrNotAttempted):
// unreachable brokers (refused, DNS, out of brokers), a leader not available, not enough
// replicas, a request timeout, a broker network or storage error, or a connection that broke
// or a broker not connected while the cluster does not answer a metadata request either (or
// another message of the batch found no broker reachable), are unavailable (the relay pauses
// and probes instead of counting attempts). The idempotent producer's state lost or refused
// (OUT_OF_ORDER_SEQUENCE_NUMBER, UNKNOWN_PRODUCER_ID, INVALID_PRODUCER_EPOCH, PRODUCER_FENCED,
// e.g. after a broker bounce) makes the Publisher recreate its producer and send each key
// again from its first unacknowledged message at once; what still fails then, and a
// connection that broke while the cluster answers, is not attempted (released with no attempt
// and sent again at the next claim), so no key is reordered on the topic. Sarama's circuit breaker, which stays open for 10 s after failed metadata
// requests, is unavailable while the cluster does not answer; once it answers and knows the
// topic, the Publisher renews its producer and sends the refused messages again at once, so
// delivery resumes as soon as the cluster is back. A message above the producer's or the
// topic's limit (refused before sending, or MESSAGE_TOO_LARGE from the broker for that message
// alone) or one the marshaler refuses is permanent; anything else (an unknown topic, also
// behind an open circuit breaker, an authorization error) is an ordinary failure.
package kafkasarama

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	wmkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/forwarder"
	"github.com/watermill-outbox/outbox/internal/netfail"
)

// ErrClosed is returned for a publish after Close.
var ErrClosed = errors.New("outbox kafkasarama: publisher closed")

// ErrMessageTooLarge is the cause of a message larger than the producer's
// Producer.MaxMessageBytes or the topic's max.message.bytes, refused before sending (it also matches
// sarama.ErrMessageSizeTooLarge with errors.Is). The ordering key's later messages of the
// batch are held back (forwarder.ErrHeldBack).
var ErrMessageTooLarge = fmt.Errorf("outbox kafkasarama: message larger than Producer.MaxMessageBytes or the topic's max.message.bytes: %w", sarama.ErrMessageSizeTooLarge)

// Marshaler is watermill-kafka's DefaultMarshaler with the event's ordering key (metadata
// outbox-ordering-key) as the Kafka message key; an event without one has no key. Unmarshal is
// the DefaultMarshaler's, so the stock subscriber reads the messages.
type Marshaler struct{}

// Marshal implements wmkafka.Marshaler.
func (Marshaler) Marshal(topic string, msg *message.Message) (*sarama.ProducerMessage, error) {
	pm, err := wmkafka.DefaultMarshaler{}.Marshal(topic, msg)
	if err != nil {
		return nil, err
	}
	if k := msg.Metadata.Get(outbox.MetadataOrderingKey); k != "" {
		pm.Key = sarama.StringEncoder(k)
	}
	return pm, nil
}

// Unmarshal implements wmkafka.Unmarshaler (watermill-kafka's DefaultMarshaler).
func (Marshaler) Unmarshal(m *sarama.ConsumerMessage) (*message.Message, error) {
	return wmkafka.DefaultMarshaler{}.Unmarshal(m)
}

// Config configures a Publisher.
type Config struct {
	// Brokers are the bootstrap brokers ("host:port"); required.
	Brokers []string

	// Marshaler turns a message into a Kafka message. Default Marshaler{} (watermill-kafka's
	// format, ordering key as message key). A custom one should keep the ordering key as the
	// key, or one key's events may land in different partitions.
	Marshaler wmkafka.Marshaler

	// SaramaConfig is the producer configuration; nil means DefaultSaramaConfig(). It must keep
	// the relay's guarantees: Producer.RequiredAcks = WaitForAll, Producer.Idempotent = true
	// (which Sarama ties to Net.MaxOpenRequests = 1, Producer.Retry.Max ≥ 1 and Version ≥
	// 0.11), Producer.Return.Successes and Return.Errors = true, and a Producer.Partitioner
	// that maps a key to one partition (RequiresConsistency: Sarama's default hash
	// partitioner does; a random or round-robin one would spread an ordering key over
	// partitions); otherwise it is a configuration error. Set
	// Producer.MaxMessageBytes at or below the broker's (topic's) max.message.bytes: it caps
	// each record batch, and a message above it is refused before sending without affecting
	// other ordering keys. Keep Producer.Timeout·(Retry.Max+1) below the outbox
	// SubscriberConfig.DeliveryTimeout. It is not modified.
	SaramaConfig *sarama.Config

	// DisableTopicLimits turns off the per-topic size limit lookup. By default the Publisher
	// asks the cluster once per topic for its max.message.bytes (DescribeConfigs; a failure,
	// such as an ACL that refuses it, leaves Producer.MaxMessageBytes in force and is not
	// asked again for a minute) and, where the topic's limit is below
	// Producer.MaxMessageBytes, refuses larger messages before sending and splits a batch
	// into SendMessages calls that each fit the limit — otherwise the broker would refuse
	// whole record batches, with the order of a key broken between a refused batch and a
	// later accepted one.
	DisableTopicLimits bool

	// KeyRunsInOneCall hands a batch's messages to Sarama in one SendMessages call even when
	// an ordering key has several of them. By default (false) a batch goes out in rounds, the
	// r-th message of every key in round r, each round after the previous one answered, so no
	// call carries two messages of one key: when Sarama gives up on a record batch after its
	// retries and then writes the partition's next one (it does, with a new producer epoch),
	// a key's later message can otherwise reach Kafka while an earlier one failed. Rounds cost
	// a produce round trip per message of the longest key run in the batch: draining to kfake
	// on 2 shared cores (BenchmarkForwarderKafka, batch 1000, MaxRunPerKey 100), rounds gave
	// 0.43–0.60× the events/s of one call at 1,000 keys (30 events each) and 0.23–0.52× at 10
	// keys (runs vary with the machine's load); with one event per key per batch they cost
	// nothing. Set this to trade the order guarantee during a partition's failure for
	// throughput with long runs.
	KeyRunsInOneCall bool
}

// DefaultSaramaConfig returns the producer configuration used when Config.SaramaConfig is nil:
// Sarama's defaults (MaxMessageBytes 1 MiB, below Kafka's default max.message.bytes) plus
// RequiredAcks = WaitForAll, Idempotent = true, Net.MaxOpenRequests = 1, Retry.Max = 5,
// Return.Successes = true and ClientID "watermill-outbox".
func DefaultSaramaConfig() *sarama.Config {
	c := sarama.NewConfig()
	c.ClientID = "watermill-outbox"
	c.Producer.RequiredAcks = sarama.WaitForAll
	c.Producer.Idempotent = true
	c.Net.MaxOpenRequests = 1
	c.Producer.Retry.Max = 5
	c.Producer.Return.Successes = true
	c.Producer.Return.Errors = true
	return c
}

// Validate returns an *outbox.ConfigError (errors.Is(err, outbox.ErrConfig)) naming the first
// invalid field, or nil.
func (c Config) Validate() error {
	bad := func(field, reason string, err error) error {
		return &outbox.ConfigError{Field: "kafka.Config." + field, Reason: reason, Err: err}
	}
	if len(c.Brokers) == 0 {
		return bad("Brokers", "at least one broker is required", nil)
	}
	sc := c.SaramaConfig
	if sc == nil {
		return nil
	}
	switch {
	case sc.Producer.RequiredAcks != sarama.WaitForAll:
		return bad("SaramaConfig.Producer.RequiredAcks", "must be WaitForAll (acks = all)", nil)
	case !sc.Producer.Idempotent:
		return bad("SaramaConfig.Producer.Idempotent", "must be true", nil)
	case !sc.Producer.Return.Successes:
		return bad("SaramaConfig.Producer.Return.Successes", "must be true", nil)
	case !sc.Producer.Return.Errors:
		return bad("SaramaConfig.Producer.Return.Errors", "must be true (a SyncProducer needs it)", nil)
	case sc.Producer.Partitioner != nil && !sc.Producer.Partitioner("").RequiresConsistency():
		return bad("SaramaConfig.Producer.Partitioner", "must map a key to one partition (RequiresConsistency); a random or round-robin partitioner spreads an ordering key over partitions", nil)
	}
	if err := sc.Validate(); err != nil {
		return bad("SaramaConfig", "rejected by Sarama", err)
	}
	return nil
}

// Publisher publishes to Kafka. It implements message.Publisher and forwarder.BatchPublisher,
// and is safe for concurrent use.
type Publisher struct {
	client    sarama.Client       // nil until connected (see connect)
	producer  sarama.SyncProducer // nil until connected
	brokers   []string
	sc        *sarama.Config
	marshaler wmkafka.Marshaler
	maxBytes  int
	version   int // record format version for size checks
	limits    bool
	oneCall   bool   // Config.KeyRunsInOneCall
	name      string // Destination of *outbox.UnavailableError
	logger    watermill.LoggerAdapter

	mu     sync.RWMutex // held for reading by every send, for writing by Close
	closed bool

	dialMu  sync.Mutex
	dialing *dialing // the dial in progress of a Publisher not connected yet (see connect)

	limitMu sync.Mutex
	admin   sarama.ClusterAdmin
	limit   map[string]int       // topic → effective max bytes
	failed  map[string]time.Time // topic → when its lookup last failed
}

// limitRetry is how long a failed topic limit lookup is not repeated (see lookupFailed).
const limitRetry = time.Minute

// recordBatchOverhead is the size of a Kafka v2 record batch header, which counts against
// max.message.bytes together with the records.
const recordBatchOverhead = 61

// NewPublisher connects a Sarama sync producer to cfg.Brokers. When no broker can be reached
// (Sarama's ErrOutOfBrokers, a refused, dropped or timed-out connection) it logs that at INFO
// and returns a Publisher that connects at the next publish: until it does, each message fails
// with an *outbox.UnavailableError (the relay pauses and probes, no attempt is counted), so a
// relay started while Kafka is down delivers once it is up. A nil logger means
// watermill.NopLogger. Errors: an *outbox.ConfigError for an invalid cfg, or Sarama's error
// for anything else.
func NewPublisher(cfg Config, logger watermill.LoggerAdapter) (*Publisher, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	sc := cfg.SaramaConfig
	if sc == nil {
		sc = DefaultSaramaConfig()
	}
	m := cfg.Marshaler
	if m == nil {
		m = Marshaler{}
	}
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	version := 1
	if sc.Version.IsAtLeast(sarama.V0_11_0_0) {
		version = 2
	}
	p := &Publisher{brokers: cfg.Brokers, sc: sc, marshaler: m, maxBytes: sc.Producer.MaxMessageBytes, version: version,
		limits: !cfg.DisableTopicLimits, oneCall: cfg.KeyRunsInOneCall, name: "kafka " + strings.Join(cfg.Brokers, ","), logger: logger, limit: map[string]int{}}
	client, prod, err := p.dial()
	switch {
	case err != nil && brokersDown(err):
		logger.Info("outbox kafkasarama: no broker reachable yet; connecting at each publish", watermill.LogFields{"destination": p.name, "err": err.Error()})
	case err != nil:
		return nil, err
	default:
		p.client, p.producer = client, prod
	}
	return p, nil
}

// dial creates the Sarama client and sync producer of p's brokers.
func (p *Publisher) dial() (sarama.Client, sarama.SyncProducer, error) {
	client, err := sarama.NewClient(p.brokers, p.sc)
	if err != nil {
		return nil, nil, fmt.Errorf("outbox kafkasarama: create client: %w", err)
	}
	prod, err := sarama.NewSyncProducerFromClient(client)
	if err != nil {
		_ = client.Close()
		return nil, nil, fmt.Errorf("outbox kafkasarama: create producer: %w", err)
	}
	return client, prod, nil
}

// brokersDown reports whether a dial error says that no broker could be reached.
func brokersDown(err error) bool {
	return errors.Is(err, sarama.ErrOutOfBrokers) || netfail.Unreachable(err) || netfail.Dropped(err)
}

// connect connects a Publisher built while no broker could be reached. It returns nil once
// connected (or closed: the send reports ErrClosed), else an *outbox.UnavailableError: the
// dial's error, or ctx's when ctx ends first (the dial goes on; the next call waits for it).
// One dial runs at a time, outside p.mu, so Close does not wait for it.
func (p *Publisher) connect(ctx context.Context) error {
	p.mu.RLock()
	ok := p.client != nil || p.closed
	p.mu.RUnlock()
	if ok {
		return nil
	}
	p.dialMu.Lock()
	d := p.dialing
	if d == nil {
		d = &dialing{done: make(chan struct{})}
		p.dialing = d
		go p.dialInto(d)
	}
	p.dialMu.Unlock()
	select {
	case <-d.done:
		if d.err != nil {
			return &outbox.UnavailableError{Destination: p.name, Err: d.err}
		}
		return nil
	case <-ctx.Done():
		return &outbox.UnavailableError{Destination: p.name, Err: fmt.Errorf("outbox kafkasarama: connecting: %w", ctx.Err())}
	}
}

// dialing is one dial of connect; err is set before done is closed.
type dialing struct {
	done chan struct{}
	err  error
}

// dialInto dials, keeps the client and producer unless the Publisher closed meanwhile (then it
// closes them), and reports to d.
func (p *Publisher) dialInto(d *dialing) {
	client, prod, err := p.dial()
	p.mu.Lock()
	switch {
	case err != nil:
	case p.closed:
		_ = prod.Close()
		_ = client.Close()
	default:
		p.client, p.producer = client, prod
		p.logger.Info("outbox kafkasarama: connected", watermill.LogFields{"destination": p.name})
	}
	p.mu.Unlock()
	p.dialMu.Lock()
	p.dialing = nil
	p.dialMu.Unlock()
	d.err = err
	close(d.done)
}

// Publish sends msgs to topic in one SendMessages call and waits for Kafka's acknowledgements.
// It returns nil when every message was acknowledged, otherwise the per-message errors joined
// (each naming its message UUID); an ordering key's messages after a refused one are not sent.
func (p *Publisher) Publish(topic string, msgs ...*message.Message) error {
	return forwarder.PublishViaBatch(p.PublishBatch, topic, msgs...)
}

// PublishBatch implements forwarder.BatchPublisher: the messages go out in one SendMessages
// call (Sarama groups them into one produce request per broker), or in a few consecutive calls
// that each fit a topic limit below Producer.MaxMessageBytes (see Config.DisableTopicLimits),
// and each gets Kafka's own result. A message that cannot be marshaled or exceeds the limit
// fails without being sent, and its ordering key's later messages are held back
// (forwarder.ErrHeldBack), as they are after a failure in an earlier call. When the broker
// still refuses a record batch as too large (MESSAGE_TOO_LARGE covers every message of the
// partition's batch), those messages are sent again one per request, so only the oversized one
// fails and other keys are not charged an attempt. When ctx ends first, the messages not yet
// answered fail with ctx's error (Sarama may still deliver them: at least once).
func (p *Publisher) PublishBatch(ctx context.Context, batch []forwarder.Outgoing) []error {
	errs := make([]error, len(batch))
	if err := p.connect(ctx); err != nil {
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	held := map[string]int{} // ordering key → index of its first failure
	keyOf := func(i int) string { return batch[i].Message.Metadata.Get(outbox.MetadataOrderingKey) }
	hold := func(i int) {
		if k := keyOf(i); k != "" {
			if f, ok := held[k]; !ok || i < f {
				held[k] = i
			}
		}
	}
	isHeld := func(i int) bool {
		f, ok := held[keyOf(i)]
		return ok && i > f
	}
	type chunk struct {
		pms []*sarama.ProducerMessage
		idx []int
	}
	var chunks []*chunk
	cur, curBytes, chunkMax := &chunk{}, 0, p.maxBytes
	seq, round := p.rounds(batch, keyOf)
	curRound := 0
	for _, i := range seq {
		o := batch[i]
		if isHeld(i) {
			errs[i] = forwarder.ErrHeldBack
			continue
		}
		if round[i] != curRound && len(cur.pms) > 0 {
			// A new round: its messages go out only after the previous round's results.
			chunks = append(chunks, cur)
			cur, curBytes, chunkMax = &chunk{}, 0, p.maxBytes
		}
		curRound = round[i]
		limit := p.topicLimit(o.Topic)
		pm, size, err := p.marshal(o, limit)
		if err != nil {
			errs[i] = err
			hold(i)
			continue
		}
		if limit < p.maxBytes {
			// Cut so that no partition's record batch of one call can exceed the limit.
			if len(cur.pms) > 0 && (curBytes+size > min(chunkMax, limit)-recordBatchOverhead) {
				chunks = append(chunks, cur)
				cur, curBytes, chunkMax = &chunk{}, 0, p.maxBytes
			}
			chunkMax = min(chunkMax, limit)
		}
		cur.pms = append(cur.pms, pm)
		cur.idx = append(cur.idx, i)
		curBytes += size
	}
	if len(cur.pms) > 0 {
		chunks = append(chunks, cur)
	}
	tooLarge := 0
	for _, c := range chunks {
		pms, idx := c.pms, c.idx
		if len(held) > 0 { // drop the messages of keys that failed in an earlier call
			pms, idx = nil, nil
			for j, i := range c.idx {
				if isHeld(i) {
					errs[i] = forwarder.ErrHeldBack
					continue
				}
				pms, idx = append(pms, c.pms[j]), append(idx, i)
			}
		}
		if len(pms) == 0 {
			continue
		}
		var refused []int
		for j, err := range p.send(ctx, pms) {
			i := idx[j]
			errs[i] = err
			if err == nil {
				continue
			}
			if errors.Is(err, sarama.ErrMessageSizeTooLarge) {
				refused = append(refused, i)
			} else {
				hold(i)
			}
		}
		if len(refused) > 0 {
			tooLarge += len(refused)
			p.isolate(ctx, batch, errs, refused, hold, isHeld)
		}
	}
	p.logger.Trace("outbox kafkasarama: batch sent", watermill.LogFields{"messages": len(batch), "calls": len(chunks), "too_large": tooLarge})
	down := p.downCheck(errs)
	for i, err := range errs {
		errs[i] = p.classify(err, down)
	}
	return errs
}

// rounds returns the order in which batch's messages are handed to Sarama and the round of
// each: round r holds the r-th message of every ordering key (unordered messages are in round
// 0), and each round is its own SendMessages call (or calls), sent after the previous one has
// answered, so one call never carries two messages of one key. With
// Config.KeyRunsInOneCall everything is round 0, in batch order.
func (p *Publisher) rounds(batch []forwarder.Outgoing, keyOf func(int) string) (seq, round []int) {
	seq, round = make([]int, len(batch)), make([]int, len(batch))
	for i := range batch {
		seq[i] = i
	}
	if p.oneCall {
		return seq, round
	}
	n := map[string]int{}
	for i := range batch {
		if k := keyOf(i); k != "" {
			round[i] = n[k]
			n[k]++
		}
	}
	slices.SortStableFunc(seq, func(a, b int) int { return round[a] - round[b] })
	return seq, round
}

// lookupFailed notes that topic's limit could not be looked up: for limitRetry its messages are
// held to Producer.MaxMessageBytes without asking again (a cluster that refuses DescribeConfigs,
// a common ACL, was asked once per message, every call waiting on limitMu). Call with limitMu
// held.
func (p *Publisher) lookupFailed(topic string) {
	if p.failed == nil {
		p.failed = map[string]time.Time{}
	}
	p.failed[topic] = time.Now()
}

// topicLimit returns the largest message (and record batch) topic takes: Producer.MaxMessageBytes,
// or the topic's max.message.bytes when that is lower (looked up once per topic).
func (p *Publisher) topicLimit(topic string) int {
	if !p.limits {
		return p.maxBytes
	}
	p.limitMu.Lock()
	defer p.limitMu.Unlock()
	if l, ok := p.limit[topic]; ok {
		return l
	}
	if at, ok := p.failed[topic]; ok && time.Since(at) < limitRetry {
		return p.maxBytes
	}
	if p.admin == nil {
		admin, err := sarama.NewClusterAdminFromClient(nopCloseClient{p.client})
		if err != nil {
			p.logger.Debug("outbox kafkasarama: no cluster admin for topic limits", watermill.LogFields{"error": err.Error()})
			p.lookupFailed(topic)
			return p.maxBytes
		}
		p.admin = admin
	}
	entries, err := p.admin.DescribeConfig(sarama.ConfigResource{Type: sarama.TopicResource, Name: topic, ConfigNames: []string{"max.message.bytes"}})
	if err != nil {
		// Not cached: the topic may not exist yet, or the lookup is not allowed.
		p.logger.Debug("outbox kafkasarama: topic limit lookup failed", watermill.LogFields{"topic": topic, "error": err.Error()})
		p.lookupFailed(topic)
		return p.maxBytes
	}
	l := p.maxBytes
	for _, e := range entries {
		if n, err := strconv.Atoi(e.Value); e.Name == "max.message.bytes" && err == nil && n > 0 {
			l = min(l, n)
		}
	}
	p.limit[topic] = l
	return l
}

// nopCloseClient keeps the cluster admin from closing the shared client.
type nopCloseClient struct{ sarama.Client }

func (nopCloseClient) Close() error { return nil }

// isolate sends the messages at idx (refused in a record batch that was too large) one per
// request, in batch order, holding back a key after its first failure.
func (p *Publisher) isolate(ctx context.Context, batch []forwarder.Outgoing, errs []error, idx []int, hold func(int), isHeld func(int) bool) {
	for _, i := range idx {
		if isHeld(i) {
			errs[i] = forwarder.ErrHeldBack
			continue
		}
		pm, _, err := p.marshal(batch[i], p.topicLimit(batch[i].Topic))
		if err == nil {
			err = p.send(ctx, []*sarama.ProducerMessage{pm})[0]
		}
		errs[i] = err
		if err != nil {
			hold(i)
		}
	}
}

// marshal returns the Kafka message of o and its size, refusing one above limit.
func (p *Publisher) marshal(o forwarder.Outgoing, limit int) (*sarama.ProducerMessage, int, error) {
	pm, err := p.marshaler.Marshal(o.Topic, o.Message)
	if err != nil {
		return nil, 0, outbox.Permanent(fmt.Errorf("outbox kafkasarama: marshal: %w", err))
	}
	size := pm.ByteSize(p.version)
	if limit < p.maxBytes {
		limit -= recordBatchOverhead // the broker counts the batch header too
	}
	if size > limit {
		return nil, 0, fmt.Errorf("%w (%d > %d bytes)", ErrMessageTooLarge, size, limit)
	}
	return pm, size, nil
}

// send runs one SendMessages call and returns a result per message. The messages that
// Sarama's circuit breaker refused are handled by breakerOpen, those refused for the
// producer's state by producerLost.
func (p *Publisher) send(ctx context.Context, pms []*sarama.ProducerMessage) []error {
	res, prod := p.sendOnce(ctx, pms)
	if again := staleBreaker(pms, res); len(again) > 0 && prod != nil {
		p.breakerOpen(ctx, prod, pms, res, again)
	}
	if again := resendable(pms, res, producerStateLost); len(again) > 0 && prod != nil {
		p.producerLost(ctx, prod, pms, res, again)
	}
	return res
}

// sendOnce runs one SendMessages call and returns a result per message and the producer that
// sent them (nil when none did).
func (p *Publisher) sendOnce(ctx context.Context, pms []*sarama.ProducerMessage) ([]error, sarama.SyncProducer) {
	res := make([]error, len(pms))
	if err := ctx.Err(); err != nil {
		for i := range res {
			res[i] = err
		}
		return res, nil
	}
	done := make(chan struct{})
	var perrs sarama.ProducerErrors
	var sendErr error
	p.mu.RLock()
	if p.closed {
		p.mu.RUnlock()
		for i := range res {
			res[i] = ErrClosed
		}
		return res, nil
	}
	prod := p.producer
	go func() {
		defer close(done)
		defer p.mu.RUnlock()
		err := prod.SendMessages(pms)
		if !errors.As(err, &perrs) {
			sendErr = err
		}
	}()
	select {
	case <-done:
	case <-ctx.Done():
		for i := range res {
			res[i] = ctx.Err()
		}
		return res, nil
	}
	if sendErr != nil {
		for i := range res {
			res[i] = sendErr
		}
		return res, prod
	}
	if len(perrs) == 0 {
		return res, nil
	}
	pos := make(map[*sarama.ProducerMessage]int, len(pms))
	for i, pm := range pms {
		pos[pm] = i
	}
	for _, pe := range perrs {
		if i, ok := pos[pe.Msg]; ok {
			res[i] = pe.Err
		}
	}
	return res, prod
}

// Close closes the producer after the sends in flight have finished. Idempotent; later
// publishes fail with ErrClosed.
func (p *Publisher) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	if p.client == nil {
		return nil // never connected
	}
	err := p.producer.Close()
	p.limitMu.Lock()
	if p.admin != nil {
		_ = p.admin.Close() // the client is closed below
	}
	p.limitMu.Unlock()
	if cerr := p.client.Close(); err == nil && cerr != nil && !errors.Is(cerr, sarama.ErrClosedClient) {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("outbox kafkasarama: close producer: %w", err)
	}
	return nil
}
