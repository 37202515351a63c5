// Package kafkasignal is the Kafka wakeup: writers produce each committed topic as a record of
// a signal topic after COMMIT (coalesced: at most one batch per window, one record per distinct
// topic); each relay process reads the signal topic from its end, outside any consumer group
// (no offsets are committed, no rebalances), and its subscriptions poll when a record names a
// topic they serve.
//
// The signal topic must exist (one partition is plenty; a short retention such as an hour
// keeps it small): this package does not create it. Records carry the topic as their value
// and no key. A listener that reconnects starts again from the end and makes every
// subscription poll once.
package kafkasignal

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/wakeup"
)

// DefaultTopic is Config.Topic's default.
const DefaultTopic = "watermill-outbox-wakeup"

// Config configures a Wakeup. Zero fields mean their defaults; Brokers is required.
type Config struct {
	// Brokers are the seed brokers ("host:port"). Required.
	Brokers []string
	// Topic is the signal topic; it must exist. Default DefaultTopic.
	Topic string
	// ClientOptions are extra franz-go options (TLS, SASL, client id…) for both clients;
	// the package adds its own seed brokers, producer and consumer options after them.
	ClientOptions []kgo.Opt
	// Window is the writer side's coalescing window (see wakeup.Coalescer). Default
	// wakeup.DefaultWindow (5ms); negative is a configuration error.
	Window time.Duration
	// Reconnect shapes the listener's restart backoff and the writer's backoff after a failed
	// produce.
	Reconnect wakeup.Reconnect
}

// Validate returns a *outbox.ConfigError naming the first invalid field, or nil.
func (c Config) Validate() error {
	switch {
	case len(c.Brokers) == 0:
		return &outbox.ConfigError{Field: "kafkasignal.Config.Brokers", Reason: "at least one seed broker is required"}
	case c.Window < 0:
		return &outbox.ConfigError{Field: "kafkasignal.Config.Window", Reason: "must not be negative"}
	}
	return c.Reconnect.Validate("kafkasignal.Config.Reconnect")
}

// Wakeup is the Kafka signal-topic wakeup (a wakeup.Wakeup). Safe for concurrent use.
type Wakeup struct {
	*wakeup.TransportWakeup
	cfg      Config
	producer *kgo.Client
}

// New returns a Wakeup. It creates the producing client (franz-go connects lazily: New does
// no I/O); the listener's client is created on the first Listen call. A nil logger means
// watermill.NopLogger. Errors: a *outbox.ConfigError for an invalid config, or franz-go's
// error for invalid client options.
func New(cfg Config, logger watermill.LoggerAdapter) (*Wakeup, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Topic == "" {
		cfg.Topic = DefaultTopic
	}
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	opts := append(append([]kgo.Opt(nil), cfg.ClientOptions...),
		kgo.SeedBrokers(cfg.Brokers...),
		kgo.DefaultProduceTopic(cfg.Topic),
		// A lost signal is harmless: no idempotent producer, leader ack, no linger.
		kgo.DisableIdempotentWrite(),
		kgo.RequiredAcks(kgo.LeaderAck()),
		kgo.ProducerLinger(0),
	)
	producer, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("kafkasignal: producer client: %w", err)
	}
	w := &Wakeup{cfg: cfg, producer: producer}
	w.TransportWakeup = wakeup.FromTransport(wakeup.Transport{
		Name:      "kafka",
		Send:      w.send,
		Listen:    w.listen,
		Window:    cfg.Window,
		Reconnect: cfg.Reconnect,
		Logger:    logger.With(watermill.LogFields{"kafka_signal_topic": cfg.Topic}),
		Close: func() error {
			producer.Close()
			return nil
		},
	})
	return w, nil
}

// Topic returns the signal topic.
func (w *Wakeup) Topic() string { return w.cfg.Topic }

func (w *Wakeup) send(ctx context.Context, topics []string) error {
	recs := make([]*kgo.Record, len(topics))
	for i, t := range topics {
		recs[i] = &kgo.Record{Value: []byte(t)}
	}
	if err := w.producer.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		return fmt.Errorf("kafkasignal: produce: %w", err)
	}
	return nil
}

// endOffsets returns the current end offset of every partition of the signal topic.
func (w *Wakeup) endOffsets(ctx context.Context, cl *kgo.Client) (map[int32]kgo.Offset, error) {
	mreq := kmsg.NewPtrMetadataRequest()
	mt := kmsg.NewMetadataRequestTopic()
	mt.Topic = kmsg.StringPtr(w.cfg.Topic)
	mreq.Topics = append(mreq.Topics, mt)
	mresp, err := mreq.RequestWith(ctx, cl)
	if err != nil {
		return nil, fmt.Errorf("kafkasignal: metadata: %w", err)
	}
	if len(mresp.Topics) != 1 {
		return nil, fmt.Errorf("kafkasignal: metadata of %q: %d topics", w.cfg.Topic, len(mresp.Topics))
	}
	if err := kerr.ErrorForCode(mresp.Topics[0].ErrorCode); err != nil {
		return nil, fmt.Errorf("kafkasignal: signal topic %q: %w", w.cfg.Topic, err)
	}
	lreq := kmsg.NewPtrListOffsetsRequest()
	lt := kmsg.NewListOffsetsRequestTopic()
	lt.Topic = w.cfg.Topic
	for _, p := range mresp.Topics[0].Partitions {
		lp := kmsg.NewListOffsetsRequestTopicPartition()
		lp.Partition = p.Partition
		lp.Timestamp = -1 // latest
		lt.Partitions = append(lt.Partitions, lp)
	}
	lreq.Topics = append(lreq.Topics, lt)
	lresp, err := lreq.RequestWith(ctx, cl)
	if err != nil {
		return nil, fmt.Errorf("kafkasignal: list offsets: %w", err)
	}
	offsets := map[int32]kgo.Offset{}
	for _, t := range lresp.Topics {
		for _, p := range t.Partitions {
			if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
				return nil, fmt.Errorf("kafkasignal: end offset of %s/%d: %w", t.Topic, p.Partition, err)
			}
			offsets[p.Partition] = kgo.NewOffset().At(p.Offset)
		}
	}
	if len(offsets) == 0 {
		return nil, fmt.Errorf("kafkasignal: signal topic %q has no partitions", w.cfg.Topic)
	}
	return offsets, nil
}

func (w *Wakeup) listen(ctx context.Context, hub *wakeup.Hub, subscribed func()) error {
	// Offsets first, with a plain client; then the consuming client starts exactly there, so
	// no signal produced after subscribed() is missed.
	meta, err := kgo.NewClient(append(append([]kgo.Opt(nil), w.cfg.ClientOptions...), kgo.SeedBrokers(w.cfg.Brokers...))...)
	if err != nil {
		return fmt.Errorf("kafkasignal: client: %w", err)
	}
	offsets, err := w.endOffsets(ctx, meta)
	meta.Close()
	if err != nil {
		return err
	}
	cl, err := kgo.NewClient(append(append([]kgo.Opt(nil), w.cfg.ClientOptions...),
		kgo.SeedBrokers(w.cfg.Brokers...),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{w.cfg.Topic: offsets}),
		kgo.FetchMaxWait(time.Second),
	)...)
	if err != nil {
		return fmt.Errorf("kafkasignal: consumer client: %w", err)
	}
	defer cl.Close()
	subscribed()
	for {
		fetches := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		var fatal error
		fetches.EachError(func(topic string, p int32, err error) {
			if !errors.Is(err, context.Canceled) && !kerr.IsRetriable(err) && fatal == nil {
				fatal = fmt.Errorf("kafkasignal: fetch %s/%d: %w", topic, p, err)
			}
		})
		fetches.EachRecord(func(r *kgo.Record) { hub.Dispatch(string(r.Value)) })
		if fatal != nil {
			return fatal
		}
	}
}

var _ wakeup.Wakeup = (*Wakeup)(nil)
