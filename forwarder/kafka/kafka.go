// Package kafka is the Kafka destination of the outbox forwarder: a Watermill publisher on
// franz-go's kgo producer that hands a whole batch to the client at once (kgo groups it into
// record batches per partition and produce requests per broker), with a result per message,
// so the forwarder marks published only the events that Kafka acknowledged.
//
// Guarantees: the ordering key is the record key, and keys are partitioned as the Java client
// does (murmur2 of the key, sign bit masked, modulo the partition count), so the events of one
// key land in one partition, the same one any Java or franz-go producer picks for that key;
// acks = all; idempotent producer. kgo keeps a partition's records in order through its own
// retries (up to 5 produce requests in flight per broker, sequence numbers per partition) and
// recovers the idempotent producer's lost state itself (OUT_OF_ORDER_SEQUENCE_NUMBER,
// UNKNOWN_PRODUCER_ID, INVALID_PRODUCER_EPOCH: a new epoch, the batch sent again in order).
// When it gives up on a record batch (retries or delivery timeout used up, or a refusal) it
// fails every record buffered behind it in the partition too, so no later record of the
// partition reaches Kafka after a failed one. Unordered events have no key (kgo's uniform
// sticky partitioner spreads them, like the Java client's).
//
// What lands on Kafka is readable by the stock watermill-kafka subscriber with its
// DefaultMarshaler: the event id is the message UUID (header _watermill_message_uuid), the
// headers and outbox-* values are the metadata (record headers), the payload is the value.
//
// Per-key order on the wire: a message refused before sending (marshal error, too large)
// holds back its key's later messages of the batch (forwarder.ErrHeldBack); a message that
// fails in Kafka makes kgo fail its partition's later records, and the key's later messages of
// the batch are reported as held back as well. When the broker refuses a whole record batch as
// too large (the topic's max.message.bytes unknown, see Config.DisableTopicLimits), the refused
// messages are sent again one per call, in batch order, so only the oversized one fails.
//
// Failure classes (outbox.ErrUnavailable, outbox.ErrPermanent, outbox.ErrNotAttempted):
// unreachable brokers (refused, DNS), a leader not available, not enough replicas, a request
// timeout, a broker network or storage error, records that ran out of kgo's retries or
// delivery timeout, or a connection that broke while the cluster does not answer a metadata
// request either, are unavailable (the relay pauses and probes instead of counting attempts).
// A connection that broke while the cluster answers, an idempotent producer state error that
// kgo did not recover from, and a record failed by another call's cancelled context are not
// attempted (released with no attempt and sent again at the next claim). A message above the
// producer's or the topic's limit (refused before sending, or MESSAGE_TOO_LARGE from the broker
// for that message alone) or one the marshaler refuses is permanent; anything else (an unknown
// topic, an authorization error) is an ordinary failure.
//
// Users who must stay on IBM/sarama use forwarder/kafkasarama, the previous Sarama-based
// publisher with the same record layout (note that Sarama partitions keys with FNV-1a, not
// murmur2, so the two put a key in different partitions), or watermill-kafka's own publisher
// through the forwarder's per-message path.
package kafka

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kbin"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/forwarder"
)

// ErrClosed is returned for a publish after Close.
var ErrClosed = errors.New("outbox kafka: publisher closed")

// ErrMessageTooLarge is the cause of a message larger than Config.MaxMessageBytes or the topic's
// max.message.bytes, refused before sending (it also matches kerr.MessageTooLarge with
// errors.Is). The ordering key's later messages of the batch are held back
// (forwarder.ErrHeldBack).
var ErrMessageTooLarge = fmt.Errorf("outbox kafka: message larger than MaxMessageBytes or the topic's max.message.bytes: %w", kerr.MessageTooLarge)

// DefaultMaxMessageBytes is the default Config.MaxMessageBytes: kgo's default record batch cap,
// Kafka's default max.message.bytes.
const DefaultMaxMessageBytes = 1000012

// RecordMarshaler turns a message for topic into a Kafka record. Implementations must be safe
// for concurrent use.
type RecordMarshaler interface {
	Marshal(topic string, msg *message.Message) (*kgo.Record, error)
}

// Marshaler is watermill-kafka's DefaultMarshaler format on kgo records, with the event's
// ordering key (metadata outbox-ordering-key) as the record key; an event without one has no
// key. Value = payload; headers = _watermill_message_uuid (the message UUID) followed by the
// metadata. It is safe for concurrent use.
type Marshaler struct{}

// Marshal implements RecordMarshaler. Errors: metadata that sets _watermill_message_uuid
// itself (reserved, as in watermill-kafka).
func (Marshaler) Marshal(topic string, msg *message.Message) (*kgo.Record, error) {
	if msg.Metadata.Get(wmkafka.UUIDHeaderKey) != "" {
		return nil, fmt.Errorf("metadata %s is reserved by watermill for message UUID", wmkafka.UUIDHeaderKey)
	}
	key := msg.Metadata.Get(outbox.MetadataOrderingKey)
	// The header values and the key are copied into one buffer (one allocation per record
	// instead of one per value); each is a full slice expression of it, so no append to one
	// reaches the next.
	n := len(msg.UUID) + len(key)
	for _, v := range msg.Metadata {
		n += len(v)
	}
	buf := make([]byte, 0, n)
	cut := func(v string) []byte {
		from := len(buf)
		buf = append(buf, v...)
		return buf[from:len(buf):len(buf)]
	}
	headers := make([]kgo.RecordHeader, 1, 1+len(msg.Metadata))
	headers[0] = kgo.RecordHeader{Key: wmkafka.UUIDHeaderKey, Value: cut(msg.UUID)}
	for k, v := range msg.Metadata {
		headers = append(headers, kgo.RecordHeader{Key: k, Value: cut(v)})
	}
	r := &kgo.Record{Topic: topic, Value: msg.Payload, Headers: headers}
	if key != "" {
		r.Key = cut(key)
	}
	return r, nil
}

// Unmarshal is the inverse of Marshal (watermill-kafka's DefaultMarshaler.Unmarshal on a kgo
// record): header _watermill_message_uuid is the UUID, the other headers the metadata.
func (Marshaler) Unmarshal(r *kgo.Record) (*message.Message, error) {
	var id string
	md := make(message.Metadata, len(r.Headers))
	for _, h := range r.Headers {
		if h.Key == wmkafka.UUIDHeaderKey {
			id = string(h.Value)
		} else {
			md.Set(h.Key, string(h.Value))
		}
	}
	msg := message.NewMessage(id, r.Value)
	msg.Metadata = md
	return msg, nil
}

// Config configures a Publisher.
type Config struct {
	// Brokers are the seed brokers ("host:port"); required.
	Brokers []string

	// Marshaler turns a message into a record. Default Marshaler{} (watermill-kafka's format,
	// ordering key as record key). A custom one should keep the ordering key as the key, or
	// one key's events may land in different partitions.
	Marshaler RecordMarshaler

	// MaxMessageBytes caps a record batch (kgo's ProducerBatchMaxBytes) and so the largest
	// message, in bytes as the broker counts them (record batch header included). Default
	// DefaultMaxMessageBytes; must be in [512, 1<<30]. Set it at or below the brokers'
	// message.max.bytes; a message above it is refused before sending without affecting other
	// ordering keys.
	MaxMessageBytes int

	// DisableTopicLimits turns off the per-topic size limit lookup. By default the Publisher
	// asks the cluster once per topic, before its first message, for its max.message.bytes
	// (DescribeConfigs; a failure, such as an ACL that refuses it, leaves MaxMessageBytes in
	// force and is not asked again for a minute) and, where it is below MaxMessageBytes, caps
	// that topic's record batches at it and refuses larger messages before sending — otherwise
	// the broker refuses whole record batches, which are then sent again one message per call.
	DisableTopicLimits bool

	// ClientOptions are extra kgo options, applied after the Publisher's own (kgo's defaults
	// plus: client id "watermill-outbox", RecordRetries 5, RecordDeliveryTimeout 10s,
	// MetadataMinAge 500ms (kgo retries a refused batch after a metadata refresh, at most one
	// per MetadataMinAge), ProducerLinger 0, no compression (as Sarama's default; a codec
	// such as kgo.ProducerBatchCompression(kgo.SnappyCompression()) must be one every consumer
	// decodes), ProducerBatchMaxBytesFn from MaxMessageBytes and the topic limits). They
	// must keep the guarantees: idempotent writes and acks = all (kgo's defaults), no
	// transactional id, no manual flushing, and a partitioner that maps a key to one partition;
	// NewPublisher refuses options that break them (an *outbox.ConfigError). Keep
	// RecordDeliveryTimeout below the outbox SubscriberConfig.DeliveryTimeout.
	ClientOptions []kgo.Opt
}

// Validate returns an *outbox.ConfigError (errors.Is(err, outbox.ErrConfig)) naming the first
// invalid field, or nil. ClientOptions are checked by NewPublisher.
func (c Config) Validate() error {
	bad := func(field, reason string) error {
		return &outbox.ConfigError{Field: "kafka.Config." + field, Reason: reason}
	}
	switch {
	case len(c.Brokers) == 0:
		return bad("Brokers", "at least one broker is required")
	case c.MaxMessageBytes != 0 && (c.MaxMessageBytes < 512 || c.MaxMessageBytes > 1<<30):
		return bad("MaxMessageBytes", "must be in [512, 1<<30]")
	}
	return nil
}

// checkOptions returns an *outbox.ConfigError when cl's options break the Publisher's
// guarantees (see Config.ClientOptions), or nil.
func checkOptions(cl *kgo.Client) error {
	bad := func(field, reason string) error {
		return &outbox.ConfigError{Field: "kafka.Config.ClientOptions", Reason: field + ": " + reason}
	}
	if v, _ := cl.OptValue(kgo.DisableIdempotentWrite).(bool); v {
		return bad("DisableIdempotentWrite", "the idempotent producer keeps each partition in order through retries")
	}
	if v, ok := cl.OptValue(kgo.RequiredAcks).(kgo.Acks); ok && v != kgo.AllISRAcks() {
		return bad("RequiredAcks", "must be AllISRAcks (acks = all)")
	}
	if vs := cl.OptValues(kgo.TransactionalID); len(vs) == 2 && vs[1] == true {
		return bad("TransactionalID", "the Publisher does not produce in transactions")
	}
	if v, _ := cl.OptValue(kgo.ManualFlushing).(bool); v {
		return bad("ManualFlushing", "the Publisher waits for each batch's results")
	}
	if part, ok := cl.OptValue(kgo.RecordPartitioner).(kgo.Partitioner); ok && !part.ForTopic("t").RequiresConsistency(&kgo.Record{Key: []byte("k")}) {
		return bad("RecordPartitioner", "must map a key to one partition (RequiresConsistency for keyed records)")
	}
	return nil
}

// Publisher publishes to Kafka. It implements message.Publisher and forwarder.BatchPublisher,
// and is safe for concurrent use.
type Publisher struct {
	client    *kgo.Client
	marshaler RecordMarshaler
	maxBytes  int
	limits    bool
	name      string // Destination of *outbox.UnavailableError
	logger    watermill.LoggerAdapter
	connected atomic.Bool // a broker answered once (see connect)
	// answerWait is how long produce waits for kgo's answers: the client's
	// RecordDeliveryTimeout plus probeTimeout (0: as long as ctx allows).
	answerWait time.Duration

	mu     sync.RWMutex
	closed bool

	lookupMu sync.Mutex // held by the topic limit lookup in progress
	limitMu  sync.Mutex
	limit    map[string]int       // topic → effective max bytes
	failed   map[string]time.Time // topic → when its lookup last failed
}

// limitRetry is how long a failed topic limit lookup is not repeated (see lookupFailed).
const limitRetry = time.Minute

// probeTimeout bounds a ping that tells whether the cluster answers.
const probeTimeout = 2 * time.Second

// NewPublisher creates a kgo producer client for cfg.Brokers and pings them. When no broker
// answers it logs that at INFO and returns the Publisher anyway: until a broker answers a ping
// (tried at each publish), each message fails with an *outbox.UnavailableError (the relay
// pauses and probes, no attempt is counted), so a relay started while Kafka is down delivers
// once it is up. A nil logger means watermill.NopLogger. Errors: an *outbox.ConfigError for an
// invalid cfg, or for ClientOptions that kgo refuses or that break the guarantees.
func NewPublisher(cfg Config, logger watermill.LoggerAdapter) (*Publisher, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	m := cfg.Marshaler
	if m == nil {
		m = Marshaler{}
	}
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	maxBytes := cfg.MaxMessageBytes
	if maxBytes == 0 {
		maxBytes = DefaultMaxMessageBytes
	}
	p := &Publisher{marshaler: m, maxBytes: maxBytes, limits: !cfg.DisableTopicLimits,
		name: "kafka " + strings.Join(cfg.Brokers, ","), logger: logger, limit: map[string]int{}}
	opts := append([]kgo.Opt{
		kgo.SeedBrokers(cfg.Brokers...),
		kgo.ClientID("watermill-outbox"),
		kgo.RecordRetries(5),
		kgo.RecordDeliveryTimeout(10 * time.Second),
		kgo.MetadataMinAge(500 * time.Millisecond),
		kgo.ProducerLinger(0),
		kgo.ProducerBatchCompression(kgo.NoCompression()),
		kgo.ProducerBatchMaxBytesFn(p.batchMax),
	}, cfg.ClientOptions...)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		// kgo refuses only invalid options (it connects lazily).
		return nil, &outbox.ConfigError{Field: "kafka.Config.ClientOptions", Reason: "rejected by kgo", Err: err}
	}
	if err := checkOptions(cl); err != nil {
		cl.Close()
		return nil, err
	}
	p.client = cl
	if d, _ := cl.OptValue(kgo.RecordDeliveryTimeout).(time.Duration); d > 0 {
		p.answerWait = d + probeTimeout
	}
	ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
	defer cancel()
	if err := cl.Ping(ctx); err != nil {
		logger.Info("outbox kafka: no broker reachable yet; connecting at each publish", watermill.LogFields{"destination": p.name, "err": err.Error()})
	} else {
		p.connected.Store(true)
	}
	return p, nil
}

// connect pings the cluster while no broker has answered yet. It returns nil once one has,
// else an *outbox.UnavailableError with the ping's error (bounded by ctx and probeTimeout).
func (p *Publisher) connect(ctx context.Context) error {
	if p.connected.Load() {
		return nil
	}
	pctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	if err := p.client.Ping(pctx); err != nil {
		return &outbox.UnavailableError{Destination: p.name, Err: fmt.Errorf("outbox kafka: connecting: %w", err)}
	}
	if !p.connected.Swap(true) {
		p.logger.Info("outbox kafka: connected", watermill.LogFields{"destination": p.name})
	}
	return nil
}

// Publish sends msgs to topic as one batch and waits for Kafka's acknowledgements. It returns
// nil when every message was acknowledged, otherwise the per-message errors joined (each
// naming its message UUID); an ordering key's messages after a refused one are not sent.
func (p *Publisher) Publish(topic string, msgs ...*message.Message) error {
	return forwarder.PublishViaBatch(p.PublishBatch, topic, msgs...)
}

// PublishBatch implements forwarder.BatchPublisher: the messages are handed to kgo in one
// call and each gets Kafka's own result. A message that cannot be marshaled or exceeds the
// limit fails without being sent, and its ordering key's later messages are held back
// (forwarder.ErrHeldBack); so are a key's later messages after one that Kafka failed. When the
// broker refuses a record batch as too large (MESSAGE_TOO_LARGE covers every record of the
// partition's batch), those messages are sent again one per call, so only the oversized one
// fails and other keys are not charged an attempt. When ctx ends first, the messages not yet
// answered fail with ctx's error (kgo may still deliver them: at least once).
func (p *Publisher) PublishBatch(ctx context.Context, batch []forwarder.Outgoing) []error {
	errs := make([]error, len(batch))
	p.mu.RLock()
	closed := p.closed
	p.mu.RUnlock()
	if closed {
		for i := range errs {
			errs[i] = ErrClosed
		}
		return errs
	}
	if err := p.connect(ctx); err != nil {
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	h := newHolds(batch)
	recs := make([]*kgo.Record, 0, len(batch))
	idx := make([]int, 0, len(batch))
	for i, o := range batch {
		if h.held(i) {
			errs[i] = forwarder.ErrHeldBack
			continue
		}
		r, err := p.marshal(o)
		if err != nil {
			errs[i] = err
			h.hold(i)
			continue
		}
		recs, idx = append(recs, r), append(idx, i)
	}
	var tooLarge []int
	for j, err := range p.produce(ctx, recs) {
		i := idx[j]
		switch {
		case err == nil:
		case h.held(i):
			err = forwarder.ErrHeldBack // kgo failed it behind its key's earlier failure
		case errors.Is(err, kerr.MessageTooLarge):
			tooLarge = append(tooLarge, i) // its record batch was refused: sent again alone below
		default:
			h.hold(i)
		}
		errs[i] = err
	}
	for _, i := range tooLarge {
		if h.held(i) {
			errs[i] = forwarder.ErrHeldBack
			continue
		}
		r, err := p.marshal(batch[i])
		if err == nil {
			err = p.produce(ctx, []*kgo.Record{r})[0]
		}
		if errs[i] = err; err != nil {
			h.hold(i)
		}
	}
	p.logger.Trace("outbox kafka: batch sent", watermill.LogFields{"messages": len(batch), "too_large": len(tooLarge)})
	down := p.downCheck(errs)
	for i, err := range errs {
		errs[i] = p.classify(ctx, err, down)
	}
	return errs
}

// holds tracks the ordering keys of a batch that failed: a key's messages after its first
// failure are held back.
type holds struct {
	batch []forwarder.Outgoing
	first map[string]int // ordering key → index of its first failure
}

func newHolds(batch []forwarder.Outgoing) *holds {
	return &holds{batch: batch, first: map[string]int{}}
}

func (h *holds) key(i int) string {
	return h.batch[i].Message.Metadata.Get(outbox.MetadataOrderingKey)
}

// hold notes that message i failed.
func (h *holds) hold(i int) {
	if k := h.key(i); k != "" {
		if f, ok := h.first[k]; !ok || i < f {
			h.first[k] = i
		}
	}
}

// held reports whether an earlier message of i's ordering key failed.
func (h *holds) held(i int) bool {
	if len(h.first) == 0 {
		return false
	}
	f, ok := h.first[h.key(i)]
	return ok && i > f
}

// errNoAnswer is the result of a record that kgo neither acknowledged nor failed within
// Publisher.answerWait: kgo keeps an idempotent record whose request may have reached the
// broker until the broker answers (through an outage), so the Publisher stops waiting for it.
// The record stays buffered in the client and may still be written, ahead of anything later
// produced to its partition.
var errNoAnswer = errors.New("outbox kafka: no answer from Kafka within the record delivery timeout")

// produce hands recs to kgo in one ProduceSync call and returns a result per record, in
// order. Records not answered when ctx ends fail with ctx's error, those not answered within
// p.answerWait with errNoAnswer (the call goes on in the background; kgo may still deliver
// them).
func (p *Publisher) produce(ctx context.Context, recs []*kgo.Record) []error {
	res := make([]error, len(recs))
	if len(recs) == 0 {
		return res
	}
	done := make(chan kgo.ProduceResults, 1)
	go func() { done <- p.client.ProduceSync(ctx, recs...) }()
	var expired <-chan time.Time
	if p.answerWait > 0 {
		t := time.NewTimer(p.answerWait)
		defer t.Stop()
		expired = t.C
	}
	var results kgo.ProduceResults
	select {
	case results = <-done:
	case <-ctx.Done():
		for i := range res {
			res[i] = ctx.Err()
		}
		return res
	case <-expired:
		for i := range res {
			res[i] = errNoAnswer
		}
		return res
	}
	pos := make(map[*kgo.Record]int, len(recs))
	for i, r := range recs {
		pos[r] = i
	}
	for _, r := range results {
		if i, ok := pos[r.Record]; ok {
			res[i] = r.Err
		}
	}
	return res
}

// marshal returns the record of o, refusing one above the topic's limit.
func (p *Publisher) marshal(o forwarder.Outgoing) (*kgo.Record, error) {
	r, err := p.marshaler.Marshal(o.Topic, o.Message)
	if err != nil {
		return nil, outbox.Permanent(fmt.Errorf("outbox kafka: marshal: %w", err))
	}
	if r.Topic == "" {
		r.Topic = o.Topic
	}
	limit := p.topicLimit(o.Topic)
	if size := batchSize(r); size > limit {
		return nil, fmt.Errorf("%w (%d > %d bytes)", ErrMessageTooLarge, size, limit)
	}
	return r, nil
}

// recordBatchOverhead is what kgo counts for a record batch besides its records: the v2 batch
// header (61 bytes) plus the 4-byte length of the records field in a produce request.
const recordBatchOverhead = 65

// batchSize is the size kgo gives a record batch that holds r alone, which it compares with
// ProducerBatchMaxBytes: a record for which this exceeds the limit is failed by kgo on its own
// (kerr.MessageTooLarge) while its key's later records are still sent, so the Publisher refuses
// it first.
func batchSize(r *kgo.Record) int {
	l := 1 + // attributes
		kbin.VarlongLen(0) + // timestamp delta of the first record
		kbin.VarintLen(0) + // offset delta
		kbin.VarintLen(int32(len(r.Key))) + len(r.Key) +
		kbin.VarintLen(int32(len(r.Value))) + len(r.Value) +
		kbin.VarintLen(int32(len(r.Headers)))
	for _, h := range r.Headers {
		l += kbin.VarintLen(int32(len(h.Key))) + len(h.Key) + kbin.VarintLen(int32(len(h.Value))) + len(h.Value)
	}
	return recordBatchOverhead + kbin.VarintLen(int32(l)) + l
}

// batchMax is kgo's ProducerBatchMaxBytesFn: the topic's limit as looked up (topicLimit runs
// before a topic's first record is produced, so kgo sees it when it first meets the topic).
func (p *Publisher) batchMax(topic string) int32 {
	p.limitMu.Lock()
	defer p.limitMu.Unlock()
	if l, ok := p.limit[topic]; ok {
		return int32(l)
	}
	return int32(p.maxBytes)
}

// lookupFailed notes that topic's limit could not be looked up: for limitRetry its messages are
// held to MaxMessageBytes without asking again. Call with limitMu held.
func (p *Publisher) lookupFailed(topic string) {
	if p.failed == nil {
		p.failed = map[string]time.Time{}
	}
	p.failed[topic] = time.Now()
}

// topicLimit returns the largest record batch topic takes: MaxMessageBytes, or the topic's
// max.message.bytes when that is lower (looked up once per topic, waiting at most probeTimeout).
// Lookups run one at a time under lookupMu, without limitMu: kgo calls batchMax from its
// metadata updates, which a lookup may wait for.
func (p *Publisher) topicLimit(topic string) int {
	if !p.limits {
		return p.maxBytes
	}
	cached := func() (int, bool) {
		p.limitMu.Lock()
		defer p.limitMu.Unlock()
		if l, ok := p.limit[topic]; ok {
			return l, true
		}
		if at, ok := p.failed[topic]; ok && time.Since(at) < limitRetry {
			return p.maxBytes, true
		}
		return 0, false
	}
	if l, ok := cached(); ok {
		return l
	}
	p.lookupMu.Lock()
	defer p.lookupMu.Unlock()
	if l, ok := cached(); ok {
		return l
	}
	l, err := p.describeLimit(topic)
	p.limitMu.Lock()
	defer p.limitMu.Unlock()
	if err != nil {
		// Not cached: the topic may not exist yet, or the lookup is not allowed.
		p.logger.Debug("outbox kafka: topic limit lookup failed", watermill.LogFields{"topic": topic, "error": err.Error()})
		p.lookupFailed(topic)
		return p.maxBytes
	}
	p.limit[topic] = l
	return l
}

// describeLimit asks the cluster for topic's max.message.bytes (0 values are ignored: then
// MaxMessageBytes applies).
func (p *Publisher) describeLimit(topic string) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
	defer cancel()
	req := kmsg.NewPtrDescribeConfigsRequest()
	rr := kmsg.NewDescribeConfigsRequestResource()
	rr.ResourceType, rr.ResourceName = kmsg.ConfigResourceTypeTopic, topic
	rr.ConfigNames = []string{"max.message.bytes"}
	req.Resources = append(req.Resources, rr)
	resp, err := req.RequestWith(ctx, p.client)
	if err != nil {
		return 0, err
	}
	l := p.maxBytes
	for _, res := range resp.Resources {
		if err := kerr.ErrorForCode(res.ErrorCode); err != nil {
			return 0, err
		}
		for _, c := range res.Configs {
			var n int
			if c.Name == "max.message.bytes" && c.Value != nil {
				if _, err := fmt.Sscan(*c.Value, &n); err == nil && n > 0 {
					l = min(l, n)
				}
			}
		}
	}
	return l, nil
}

// Close closes the kgo client: records still buffered or in flight fail with
// kgo.ErrClientClosed (their events are released and sent again). Idempotent; later publishes
// fail with ErrClosed.
func (p *Publisher) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	p.mu.Unlock()
	p.client.Close()
	return nil
}
