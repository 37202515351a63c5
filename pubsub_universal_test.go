package outbox_test

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/tests"

	"github.com/watermill-outbox/outbox"
)

// topicTables gives each topic of the universal suite its own outbox table. The outbox keeps
// one row per event id (id UNIQUE, receivers dedupe by it), while the suite publishes
// the same message ids to 20 topics; one table per topic keeps both true. Everything else —
// publishing, claiming, ordering, acks — is the real Publisher and Subscriber.
type topicTables struct {
	t      *testing.T
	b      *backend
	mu     sync.Mutex
	tables map[string]outbox.SchemaConfig
}

func (tt *topicTables) schema(topic string) (outbox.SchemaConfig, error) {
	tt.mu.Lock()
	defer tt.mu.Unlock()
	if cfg, ok := tt.tables[topic]; ok {
		return cfg, nil
	}
	h := sha1.Sum([]byte(topic))
	cfg := outbox.SchemaConfig{Table: fmt.Sprintf("u_%d_%s", os.Getpid(), hex.EncodeToString(h[:8])), PayloadType: outbox.PayloadBytea, Dialect: tt.b.dialect}
	if err := outbox.Migrate(context.Background(), tt.b.db, cfg); err != nil {
		return cfg, err
	}
	tt.tables[topic] = cfg
	return cfg, nil
}

func (tt *topicTables) dropAll() {
	for _, cfg := range tt.tables {
		tt.b.raw.ExecContext(context.Background(), fmt.Sprintf(`DROP TABLE IF EXISTS %q`, cfg.Table))
		if tt.b.dialect == outbox.DialectMySQL { // and its key-lock table
			tt.b.raw.ExecContext(context.Background(), fmt.Sprintf(`DROP TABLE IF EXISTS %q`, cfg.Table+"_keys"))
		}
	}
}

type suitePublisher struct{ tt *topicTables }

func (p suitePublisher) Publish(topic string, msgs ...*message.Message) error {
	cfg, err := p.tt.schema(topic)
	if err != nil {
		return err
	}
	pub, err := outbox.NewPublisher(p.tt.b.db, outbox.PublisherConfig{Schema: cfg}, nil)
	if err != nil {
		return err
	}
	return pub.Publish(topic, msgs...)
}

func (p suitePublisher) Close() error { return nil }

type suiteSubscriber struct {
	tt   *topicTables
	mu   sync.Mutex
	subs []*outbox.Subscriber
}

func (s *suiteSubscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	cfg, err := s.tt.schema(topic)
	if err != nil {
		return nil, err
	}
	sub, err := outbox.NewSubscriber(s.tt.b.db, outbox.SubscriberConfig{
		Schema:          cfg,
		PollInterval:    20 * time.Millisecond,
		BatchSize:       100,
		RetryBase:       10 * time.Millisecond,
		RetryMax:        50 * time.Millisecond,
		MaxAttempts:     1000,
		LeaseDuration:   5 * time.Second,
		DeliveryTimeout: 4 * time.Second,
	}, watermill.NopLogger{})
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.subs = append(s.subs, sub)
	s.mu.Unlock()
	return sub.Subscribe(ctx, topic)
}

func (s *suiteSubscriber) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, sub := range s.subs {
		sub.Close()
	}
	return nil
}

// TestPubSubUniversal runs Watermill's universal Pub/Sub suite against PostgreSQL and SQLite.
// Features are honest: persistent, no exactly-once claim, no global order (order is kept per
// ordering key only, and the suite's messages have none), no consumer groups. The suite's
// payloads are not JSON, so the tables use a BYTEA/BLOB payload.
func TestPubSubUniversal(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *backend) {
		tt := &topicTables{t: t, b: b, tables: map[string]outbox.SchemaConfig{}}
		t.Cleanup(tt.dropAll)
		constructor := func(t *testing.T) (message.Publisher, message.Subscriber) {
			return suitePublisher{tt}, &suiteSubscriber{tt: tt}
		}
		tests.TestPubSub(t, tests.Features{
			ConsumerGroups:                   false,
			ExactlyOnceDelivery:              false,
			GuaranteedOrder:                  false,
			Persistent:                       true,
			NewSubscriberReceivesOldMessages: false,
		}, constructor, nil)
	})
}
