// Command capture shows change capture end to end: capture triggers on a loans table turn
// every raw SQL write into an outbox event in the writing transaction (one multi-row INSERT of
// 20 loans, five UPDATE statements of all of them, a no-op UPDATE that writes nothing, a
// DELETE of every second loan), the relay forwards the events to Kafka with the loan's
// ordering key as message key, and the stock watermill-kafka subscriber reads them back and
// decodes them with capture.Decode. Kafka is kfake, run in-process on loopback; PostgreSQL
// comes from OUTBOX_EXAMPLE_POSTGRES_DSN.
//
//	go run ./examples/capture
//
// It prints every envelope, then one line, "captured=130 inserted=20 updated=100 deleted=10
// reordered=0", and exits non-zero when the numbers differ or it does not finish within 25
// seconds.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	wmkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/watermill-outbox/outbox/capture"
	"github.com/watermill-outbox/outbox/examples/internal/demo"
	"github.com/watermill-outbox/outbox/forwarder/kafka"
)

const (
	topic = "loans.changes"
	loans = 20
	want  = "captured=130 inserted=20 updated=100 deleted=10 reordered=0"
)

func main() { demo.Main(run) }

func run(ctx context.Context) (string, bool, error) {
	r, err := demo.Setup(ctx, "capture")
	if err != nil {
		return "", false, err
	}
	defer r.Close()
	table := fmt.Sprintf("example_capture_loans_%d", os.Getpid())
	if _, err := r.Pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE %s (id int PRIMARY KEY, status text NOT NULL, version int NOT NULL)`, table)); err != nil {
		return "", false, err
	}
	defer r.Pool.Exec(context.Background(), fmt.Sprintf(`DROP TABLE IF EXISTS %s`, table))
	// One topic for every operation, so one Kafka partition per loan keeps its order.
	if err := capture.Install(ctx, r.Pool, r.Schema, capture.Table{Name: table, Topic: topic, Payload: capture.PayloadBeforeAndAfter}); err != nil {
		return "", false, err
	}

	cluster, err := kfake.NewCluster(kfake.SeedTopics(4, topic))
	if err != nil {
		return "", false, err
	}
	defer cluster.Close()
	pub, err := kafka.NewPublisher(kafka.Config{Brokers: cluster.ListenAddrs()}, nil)
	if err != nil {
		return "", false, err
	}
	defer pub.Close()
	stop, err := r.Relay(ctx, pub)
	if err != nil {
		return "", false, err
	}
	defer stop()

	// Raw SQL: no Publish call anywhere.
	writes := []string{fmt.Sprintf(`INSERT INTO %s SELECT g, 'applied', 1 FROM generate_series(1, %d) g`, table, loans)}
	for _, status := range []string{"approved", "funded", "repaying", "late", "repaying"} {
		writes = append(writes, fmt.Sprintf(`UPDATE %s SET status = '%s', version = version + 1`, table, status))
	}
	writes = append(writes, fmt.Sprintf(`UPDATE %s SET status = status`, table), fmt.Sprintf(`DELETE FROM %s WHERE id %% 2 = 0`, table))
	for _, w := range writes {
		if _, err := r.Pool.Exec(ctx, w); err != nil {
			return "", false, err
		}
	}

	sc := wmkafka.DefaultSaramaSubscriberConfig()
	sc.Consumer.Offsets.Initial = sarama.OffsetOldest
	ksub, err := wmkafka.NewSubscriber(wmkafka.SubscriberConfig{
		Brokers: cluster.ListenAddrs(), Unmarshaler: wmkafka.DefaultMarshaler{}, OverwriteSaramaConfig: sc,
	}, watermill.NopLogger{})
	if err != nil {
		return "", false, err
	}
	defer ksub.Close()
	msgs, err := ksub.Subscribe(ctx, topic)
	if err != nil {
		return "", false, err
	}
	type loan struct {
		Version int `json:"version"`
	}
	counts := map[capture.Operation]int{}
	last := map[string]int{} // loan pk -> last version seen
	total, reordered := 0, 0
	line := func() string {
		return fmt.Sprintf("captured=%d inserted=%d updated=%d deleted=%d reordered=%d", total, counts[capture.Inserted], counts[capture.Updated], counts[capture.Deleted], reordered)
	}
	for total < 130 {
		select {
		case msg := <-msgs:
			ch, err := capture.Decode(msg)
			if err != nil {
				return "", false, err
			}
			fmt.Printf("%s %s pk=%s changed=%v before=%s after=%s\n", ch.Table, ch.Operation, ch.PK, ch.Changed, ch.Before, ch.After)
			image := ch.After
			if ch.Operation == capture.Deleted {
				image = ch.Before
			}
			l, err := capture.Row[loan](image)
			if err != nil {
				return "", false, err
			}
			// A delete carries the last version again; anything else must move forward.
			if l.Version < last[string(ch.PK)] || l.Version == last[string(ch.PK)] && ch.Operation != capture.Deleted {
				reordered++
			}
			last[string(ch.PK)] = l.Version
			counts[ch.Operation]++
			total++
			msg.Ack()
		case <-ctx.Done():
			return line(), false, nil
		}
	}
	return line(), line() == want, nil
}
