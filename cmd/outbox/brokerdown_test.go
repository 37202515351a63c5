package main

import (
	"context"
	"fmt"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/watermill-outbox/outbox/internal/brokertest"
	"github.com/watermill-outbox/outbox/internal/pgtest"
)

// uuidHeader is the header in which Watermill's default marshalers of Kafka and RabbitMQ
// carry the message UUID (the event id).
const uuidHeader = "_watermill_message_uuid"

// brokerDown is one broker for TestRelayStartsWithBrokerDown: the --to URL of a broker that
// is not up yet, the destination name the relay reports, up (brings it up), and read (the
// event ids it holds).
type brokerDown struct {
	to, dest string
	topic    string // the events' topic when not the test's default
	args     []string
	up       func()
	read     func(t *testing.T, n int) []string
}

// TestRelayStartsWithBrokerDown: a relay started while its broker is down keeps running (it
// used to exit with status 1), logs one WARN line, sets outbox_destination_unavailable, answers
// /readyz 503 naming the destination, charges no attempt, and once the broker is up delivers every event exactly
// once, /readyz turns 200, and SIGTERM ends it with status 0. For Redis (a private
// redis-server started after the relay; also behind asynq), RabbitMQ (a closed port that then
// forwards to the shared broker) and Kafka (a kfake cluster started after the relay on the port it was given).
func TestRelayStartsWithBrokerDown(t *testing.T) {
	pgtest.Require(t)
	topic := fmt.Sprintf("outbox-brokerdown-%d", time.Now().UnixNano())
	for name, mk := range map[string]func(t *testing.T) brokerDown{
		"redis": func(t *testing.T) brokerDown {
			addr, start := brokertest.PrivateRedis(t)
			return brokerDown{to: "redis://" + addr, dest: "redis " + addr, up: func() { start() },
				read: func(t *testing.T, _ int) []string { return redisStreamIDs(t, addr, topic) }}
		},
		"rabbitmq": func(t *testing.T) brokerDown {
			url := brokertest.RequireRabbitMQ(t)
			declareQueue(t, url, topic)
			addr := brokertest.ClosedPort(t)
			broker := strings.TrimSuffix(strings.SplitN(url, "@", 2)[1], "/")
			return brokerDown{to: "amqp://guest:guest@" + addr + "/", dest: "amqp " + addr, up: func() { brokertest.Forward(t, addr, broker) },
				read: func(t *testing.T, n int) []string { return amqpQueueIDs(t, url, topic, n) }}
		},
		"asynq": func(t *testing.T) brokerDown {
			addr, start := brokertest.PrivateRedis(t)
			return brokerDown{to: "asynq+redis://" + addr + "/0?queue=brokerdown", dest: "asynq", topic: "task.work", up: func() { start() },
				read: func(t *testing.T, _ int) []string { return asynqQueueIDs(t, addr, "brokerdown") }}
		},
		"kafka": func(t *testing.T) brokerDown {
			addr := brokertest.ClosedPort(t)
			_, p, _ := net.SplitHostPort(addr)
			port, _ := strconv.Atoi(p)
			return brokerDown{to: "kafka://" + addr, dest: "kafka " + addr,
				up:   func() { brokertest.Kafka(t, kfake.Ports(port), kfake.SeedTopics(1, topic)) },
				read: func(t *testing.T, n int) []string { return kafkaTopicIDs(t, addr, topic, n) }}
		},
	} {
		t.Run(name, func(t *testing.T) {
			relayWithBrokerDown(t, topic, mk(t))
		})
	}
}

func relayWithBrokerDown(t *testing.T, topic string, bd brokerDown) {
	if bd.topic != "" {
		topic = bd.topic
	}
	pool := pgtest.Require(t)
	b := postgresBackend()
	db, table := b.fresh(t)
	mustRun(t, nil, "migrate", "--db", db, "--table", table)
	var evs []testEvent
	for i := range 12 {
		key := ""
		if i%3 != 0 {
			key = fmt.Sprintf("k%d", i%2)
		}
		evs = append(evs, testEvent{topic, key, i})
	}
	ids := b.publish(t, db, table, evs)
	p := start(t, nil, append([]string{"relay", "--db", db, "--table", table, "--to", bd.to, "--poll-interval", "50ms",
		"--unavailable-backoff", "100ms", "--unavailable-backoff-max", "300ms", "--http-addr", "127.0.0.1:0"}, bd.args...)...)
	base := httpBase(t, p)
	var code int
	var body string
	waitFor(t, 30*time.Second, "/readyz 503 naming the destination", func() bool {
		if !p.running() {
			t.Fatalf("relay exited with the broker down: %s", p.errb.String())
		}
		code, body = httpGet(t, base+"/readyz")
		return code == 503 && strings.Contains(body, "destinations: "+bd.dest+" unavailable for ")
	})
	gauge := `outbox_destination_unavailable{destination="` + bd.dest + `"}`
	if _, m := httpGet(t, base+"/metrics"); metricOf(m, gauge) != 1 {
		t.Errorf("%s = %v while the broker is down, want 1", gauge, metricOf(m, gauge))
	}
	charged := func() int {
		var n int
		if err := pool.QueryRow(context.Background(), fmt.Sprintf(`SELECT count(*) FROM %q WHERE attempts > 0 OR dead_lettered_at IS NOT NULL`, table)).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := charged(); n != 0 {
		t.Fatalf("%d events charged an attempt while the broker was down", n)
	}
	bd.up()
	p.runUntil(t, "every event delivered, /readyz 200 and the gauge 0", func() bool {
		if status(t, db, table).Pending != 0 {
			return false
		}
		code, body = httpGet(t, base+"/readyz")
		_, m := httpGet(t, base+"/metrics")
		return code == 200 && metricOf(m, gauge) == 0
	})
	if n := charged(); n != 0 {
		t.Fatalf("%d events charged an attempt", n)
	}

	if got := bd.read(t, len(ids)); !slices.Equal(sorted(got), sorted(ids)) {
		t.Fatalf("the broker holds %d events %v, want the %d written, once each", len(got), got, len(ids))
	}
	log := p.errb.String()
	if n := len(regexp.MustCompile(`(?m)^.* level=WARN .*$`).FindAllString(log, -1)); n != 1 ||
		!regexp.MustCompile(`level=WARN msg="outbox: destination unavailable`).MatchString(log) {
		t.Errorf("%d WARN lines, want the one outage line:\n%s", n, log)
	}
}

// declareQueue declares a durable queue named name on the broker at url (the relay's
// messages reach it through the default exchange) and deletes it when the test ends.
func declareQueue(t *testing.T, url, name string) {
	t.Helper()
	conn, err := amqp091.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(name, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = ch.QueueDelete(name, false, false, false)
		_ = conn.Close()
	})
}

// amqpQueueIDs reads the event ids of the messages in queue name: n of them, then any
// further one that arrives within a short grace (a duplicate), acknowledging each.
func amqpQueueIDs(t *testing.T, url, name string, n int) []string {
	t.Helper()
	conn, err := amqp091.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		m, ok, err := ch.Get(name, true)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			if len(ids) >= n {
				break
			}
			time.Sleep(20 * time.Millisecond)
			continue
		}
		id, _ := m.Headers[uuidHeader].(string)
		ids = append(ids, id)
	}
	return ids
}

// kafkaTopicIDs reads the event ids of the records of topic at broker addr: until n are read,
// then any further one that arrives within a second (a duplicate).
func kafkaTopicIDs(t *testing.T, addr, topic string, n int) []string {
	t.Helper()
	c, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var ids []string
	for {
		wait := 10 * time.Second
		if len(ids) >= n {
			wait = time.Second
		}
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		fs := c.PollFetches(ctx)
		timedOut := ctx.Err() != nil
		cancel()
		if timedOut {
			break
		}
		fs.EachRecord(func(r *kgo.Record) {
			for _, h := range r.Headers {
				if h.Key == uuidHeader {
					ids = append(ids, string(h.Value))
				}
			}
		})
	}
	return ids
}

// asynqQueueIDs returns the task ids (the event ids) of the pending tasks of queue in the
// Redis at addr.
func asynqQueueIDs(t *testing.T, addr, queue string) []string {
	t.Helper()
	ins := asynq.NewInspector(asynq.RedisClientOpt{Addr: addr})
	defer ins.Close()
	tasks, err := ins.ListPendingTasks(queue, asynq.PageSize(1000))
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, tk := range tasks {
		ids = append(ids, tk.ID)
	}
	return ids
}
