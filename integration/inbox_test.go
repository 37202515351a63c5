package integration_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	wmamqp "github.com/ThreeDotsLabs/watermill-amqp/v2/pkg/amqp"
	wmkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/inbox"
	"github.com/watermill-outbox/outbox/inbox/kafkakey"
	"github.com/watermill-outbox/outbox/internal/brokertest"
	"github.com/watermill-outbox/outbox/internal/pgtest"
)

// inboxBroker is one broker the inbox test consumes from.
type inboxBroker struct {
	topic string
	// pub publishes to topic.
	pub message.Publisher
	// newSub returns a fresh subscriber (a consumer restart builds a new one).
	newSub func(t *testing.T) message.Subscriber
}

// inboxTables creates a business table, an outbox table and an inbox table of fresh names.
func inboxTables(t *testing.T) (biz string, out outbox.SchemaConfig, in inbox.SchemaConfig) {
	t.Helper()
	pool := pgtest.Require(t)
	biz = pgx.Identifier{pgtest.Table(t)}.Sanitize()
	out, in = outbox.SchemaConfig{Table: pgtest.Table(t)}, inbox.SchemaConfig{Table: pgtest.Table(t)}
	if _, err := pool.Exec(context.Background(), `CREATE TABLE `+biz+` (id UUID PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	if err := outbox.Migrate(context.Background(), pool, out); err != nil {
		t.Fatal(err)
	}
	if err := inbox.Migrate(context.Background(), pool, in); err != nil {
		t.Fatal(err)
	}
	return biz, out, in
}

func inboxCountRows(t *testing.T, table string) int {
	t.Helper()
	var n int
	if err := pgtest.Require(t).QueryRow(context.Background(), `SELECT count(*) FROM `+table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

var inboxErrCrash = errors.New("simulated crash after commit, before ack")

// testInboxExactlyOnce runs consume → process → produce through the broker: 2,000 messages,
// each published twice (a producer's redelivery). Every message's first delivery writes its
// business row and its follow-up event, then fails inside the transaction (rolled back);
// its first committed delivery "crashes" between commit and ack (the router nacks, the broker
// redelivers); the consumer is restarted midway (a new router and subscribers on the same
// group/queue). Each message thus arrives four or more times, and in the end there are
// exactly 2,000 business rows, 2,000 outbox events and 2,000 inbox rows. A rolled-back
// delivery that left any of its three rows would show: an extra outbox event (each attempt
// has a fresh event id; the failing delivery writes its event too), or a later delivery
// skipped as a duplicate with no business row.
func testInboxExactlyOnce[T any](t *testing.T, b inboxBroker, db inbox.DB[T], exec func(T, string, ...any) error) {
	const n = 2000
	biz, outCfg, inCfg := inboxTables(t)
	cfg := inbox.Config{Schema: inCfg, Consumer: "inbox-it", PublishTopic: "followups", Outbox: outbox.PublisherConfig{Schema: outCfg}}

	var (
		mu         sync.Mutex
		deliveries = map[string]int{}
		rolledBack = map[string]bool{}
		crashed    = map[string]bool{}
	)
	handler := func(msg *message.Message, tx T) ([]*message.Message, error) {
		if err := exec(tx, `INSERT INTO `+biz+` (id) VALUES ($1)`, msg.UUID); err != nil {
			return nil, err
		}
		mu.Lock()
		first := !rolledBack[msg.UUID]
		rolledBack[msg.UUID] = true
		mu.Unlock()
		followUp := outbox.NewMessage([]byte(fmt.Sprintf(`{"processed":%q}`, msg.UUID)))
		if first {
			// The failing delivery also writes its follow-up event into the outbox table
			// before failing, so that all three tables have a row to roll back.
			pub, err := outbox.NewPublisher(tx, outbox.PublisherConfig{Schema: outCfg}, nil)
			if err != nil {
				return nil, err
			}
			if err := pub.Publish("followups", followUp); err != nil {
				return nil, err
			}
			return nil, errors.New("simulated handler failure after its writes")
		}
		return []*message.Message{followUp}, nil
	}
	// outer counts deliveries and fails a message's first committed delivery after the commit.
	outer := func(in *inbox.Inbox[T]) message.NoPublishHandlerFunc {
		return func(msg *message.Message) error {
			mu.Lock()
			deliveries[msg.UUID]++
			mu.Unlock()
			res, err := in.Process(msg, handler) // in.Handler(handler) without the Result
			if err != nil {
				return err
			}
			mu.Lock()
			defer mu.Unlock()
			if res == inbox.ResultProcessed && !crashed[msg.UUID] {
				crashed[msg.UUID] = true
				return inboxErrCrash
			}
			return nil
		}
	}

	msgs := make([]*message.Message, n)
	for i := range msgs {
		msgs[i] = outbox.NewMessage([]byte(fmt.Sprintf(`{"i":%d}`, i)))
	}
	for copyNo := range 2 {
		for i := 0; i < n; i += 100 {
			batch := make([]*message.Message, 0, 100)
			for _, m := range msgs[i : i+100] {
				batch = append(batch, m.Copy())
			}
			if err := b.pub.Publish(b.topic, batch...); err != nil {
				t.Fatalf("publish copy %d: %v", copyNo, err)
			}
		}
	}

	var inboxes []*inbox.Inbox[T]
	// runConsumer starts a router with four handlers (consumers) on fresh subscribers and
	// returns its stop function.
	runConsumer := func() func() {
		in, err := inbox.New(db, cfg, nil)
		if err != nil {
			t.Fatal(err)
		}
		inboxes = append(inboxes, in)
		r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 20 * time.Second}, watermill.NopLogger{})
		if err != nil {
			t.Fatal(err)
		}
		var subs []message.Subscriber
		for i := range 4 {
			sub := b.newSub(t)
			subs = append(subs, sub)
			r.AddConsumerHandler(fmt.Sprintf("inbox-%d", i), b.topic, sub, outer(in))
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			if err := r.Run(context.Background()); err != nil {
				t.Errorf("router: %v", err)
			}
		}()
		<-r.Running()
		return func() {
			if err := r.Close(); err != nil {
				t.Errorf("router close: %v", err)
			}
			<-done
			for _, s := range subs {
				_ = s.Close()
			}
		}
	}
	total := func() (s inbox.Stats) {
		for _, in := range inboxes {
			x := in.Stats()
			s.Processed += x.Processed
			s.Duplicates += x.Duplicates
			s.Failed += x.Failed
		}
		return s
	}

	stop := runConsumer()
	pgtest.Eventually(t, 2*time.Minute, "first consumer processes 700 messages", func() bool { return total().Processed >= 700 })
	stop() // consumer restart
	stop = runConsumer()
	defer func() { stop() }()
	// Every copy ends with an ack and every message failed twice (the rollback, the crash
	// after commit): four deliveries or more each.
	done := func() (int, int) {
		mu.Lock()
		defer mu.Unlock()
		short := 0
		for _, m := range msgs {
			if deliveries[m.UUID] < 4 {
				short++
			}
		}
		return short, inboxCountRows(t, biz)
	}
	for deadline := time.Now().Add(3 * time.Minute); ; time.Sleep(20 * time.Millisecond) {
		short, rows := done()
		if short == 0 && rows == n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("within 3m: %d messages delivered fewer than 4 times, %d business rows; stats %+v", short, rows, total())
		}
	}
	stop()
	stop = func() {}

	s := total()
	if got := [3]int{inboxCountRows(t, biz), inboxCountRows(t, pgx.Identifier{outCfg.Table}.Sanitize()), inboxCountRows(t, pgx.Identifier{inCfg.Table}.Sanitize())}; got != [3]int{n, n, n} {
		t.Fatalf("business, outbox, inbox rows = %v, want [%d %d %d] (stats %+v)", got, n, n, n, s)
	}
	mu.Lock()
	defer mu.Unlock()
	minD := n
	for _, m := range msgs {
		d := deliveries[m.UUID]
		minD = min(minD, d)
		if d < 4 || !rolledBack[m.UUID] || !crashed[m.UUID] {
			t.Fatalf("message %s: %d deliveries, rolled back %v, crashed after commit %v; want ≥4, true, true", m.UUID, d, rolledBack[m.UUID], crashed[m.UUID])
		}
	}
	t.Logf("stats %+v; fewest deliveries of a message: %d", s, minD)
}

// TestInboxKafka: the exactly-once test through kfake with the real watermill-kafka client
// (Sarama consumer group, 8 partitions, four consumers, a restart).
func TestInboxKafka(t *testing.T) {
	pool := pgtest.Require(t)
	topic := fwdName("inbox-kafka")
	c := brokertest.Kafka(t, kfake.SeedTopics(8, topic))
	pub, err := wmkafka.NewPublisher(wmkafka.PublisherConfig{Brokers: c.ListenAddrs(), Marshaler: wmkafka.DefaultMarshaler{}}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	b := inboxBroker{topic: topic, pub: pub, newSub: func(t *testing.T) message.Subscriber {
		return inboxKafkaSubscriber(t, c, "inbox-it")
	}}
	testInboxExactlyOnce(t, b, inbox.FromPgx(pool, pgx.TxOptions{}), func(tx pgx.Tx, q string, args ...any) error {
		_, err := tx.Exec(context.Background(), q, args...)
		return err
	})
}

func inboxKafkaSubscriber(t *testing.T, c *kfake.Cluster, group string) message.Subscriber {
	t.Helper()
	sc := wmkafka.DefaultSaramaSubscriberConfig()
	sc.Consumer.Offsets.Initial = sarama.OffsetOldest
	sub, err := wmkafka.NewSubscriber(wmkafka.SubscriberConfig{
		Brokers: c.ListenAddrs(), Unmarshaler: wmkafka.DefaultMarshaler{}, OverwriteSaramaConfig: sc,
		ConsumerGroup: group, NackResendSleep: time.Millisecond,
	}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Close() })
	return sub
}

// TestInboxRabbitMQ: the exactly-once test through RabbitMQ (durable queue, four consumers, a
// restart; a nack requeues), with the database/sql adapter.
func TestInboxRabbitMQ(t *testing.T) {
	url := brokertest.RequireRabbitMQ(t)
	db := pgtest.StdDB(t)
	topic := fwdName("inbox-amqp")
	fwdAMQPQueues(t, url, topic)
	amqpCfg := wmamqp.NewDurableQueueConfig(url)
	pub, err := wmamqp.NewPublisher(amqpCfg, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	b := inboxBroker{topic: topic, pub: pub, newSub: func(t *testing.T) message.Subscriber {
		cfg := wmamqp.NewDurableQueueConfig(url)
		cfg.Consume.Qos.PrefetchCount = 10
		sub, err := wmamqp.NewSubscriber(cfg, watermill.NopLogger{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sub.Close() })
		return sub
	}}
	testInboxExactlyOnce(t, b, inbox.FromSQL(db, nil), func(tx *sql.Tx, q string, args ...any) error {
		_, err := tx.ExecContext(context.Background(), q, args...)
		return err
	})
}

// TestInboxKafkaPositionKey: inbox keyed by the record's position (package kafkakey): a record
// nacked after its commit is redelivered at the same position and skipped.
func TestInboxKafkaPositionKey(t *testing.T) {
	const n = 100
	pool := pgtest.Require(t)
	topic := fwdName("inbox-kafkakey")
	c := brokertest.Kafka(t, kfake.SeedTopics(2, topic))
	pub, err := wmkafka.NewPublisher(wmkafka.PublisherConfig{Brokers: c.ListenAddrs(), Marshaler: wmkafka.DefaultMarshaler{}}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	for i := range n {
		if err := pub.Publish(topic, message.NewMessage(watermill.NewUUID(), []byte(fmt.Sprint(i)))); err != nil {
			t.Fatal(err)
		}
	}
	_, outCfg, inCfg := inboxTables(t)
	in, err := inbox.New(inbox.FromPgx(pool, pgx.TxOptions{}), inbox.Config{Schema: inCfg, Consumer: "pos", Key: kafkakey.Key, Outbox: outbox.PublisherConfig{Schema: outCfg}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var crashes atomic.Int64
	h := in.Handler(func(*message.Message, pgx.Tx) ([]*message.Message, error) { return nil, nil })
	r, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	seen := sync.Map{}
	r.AddConsumerHandler("pos", topic, inboxKafkaSubscriber(t, c, "pos"), func(msg *message.Message) error {
		if err := h(msg); err != nil {
			return err
		}
		if _, again := seen.LoadOrStore(msg.UUID, true); !again {
			crashes.Add(1)
			return inboxErrCrash
		}
		return nil
	})
	go func() { _ = r.Run(context.Background()) }()
	defer r.Close()
	pgtest.Eventually(t, time.Minute, "100 records processed and redelivered once", func() bool {
		s := in.Stats()
		return s.Processed == n && s.Duplicates >= n
	})
	var bad int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM `+pgx.Identifier{inCfg.Table}.Sanitize()+` WHERE message_id NOT LIKE $1`, topic+"/%/%").Scan(&bad); err != nil || bad != 0 {
		t.Fatalf("%d inbox keys not of the form topic/partition/offset (%v)", bad, err)
	}
	if got := inboxCountRows(t, pgx.Identifier{inCfg.Table}.Sanitize()); got != n || crashes.Load() != n {
		t.Fatalf("%d inbox rows, %d crashes; want %d each", got, crashes.Load(), n)
	}
}
