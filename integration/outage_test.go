package integration_test

// Destination outages at the scale of issue 13, "Done when" 1: a backlog over 1,000 ordering
// keys relayed with the default SubscriberConfig (BatchSize and PollInterval at the relay
// command's defaults) while the destination goes away and comes back. Short by default (5 s
// outage, 5,000 events); OUTBOX_CHAOS=full runs the 30 s outage over 20,000 events:
//
//	OUTBOX_CHAOS=full go test ./integration -run 'Outage$' -v -count=1

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/watermill-outbox/outbox"
	"github.com/watermill-outbox/outbox/forwarder"
	"github.com/watermill-outbox/outbox/forwarder/amqp"
	"github.com/watermill-outbox/outbox/forwarder/kafka"
	"github.com/watermill-outbox/outbox/internal/brokertest"
	"github.com/watermill-outbox/outbox/internal/pgtest"
)

// outageScale is one run's size: events over keys, the destination down for down.
type outageScale struct {
	events, keys int
	down         time.Duration
}

// outageScaleFromEnv is the scale with OUTBOX_CHAOS=full, a short form otherwise.
func outageScaleFromEnv() outageScale {
	if os.Getenv("OUTBOX_CHAOS") == "full" {
		return outageScale{events: 20000, keys: 1000, down: 30 * time.Second}
	}
	return outageScale{events: 5000, keys: 1000, down: 5 * time.Second}
}

// outageLog records the subscriber's log lines with their levels (it implements
// outbox.WarnLogger); safe for concurrent use.
type outageLog struct {
	mu    sync.Mutex
	lines []string // "LEVEL msg fields"
	at    []time.Time
}

func (l *outageLog) add(level, msg string, err error, fields watermill.LogFields) {
	l.mu.Lock()
	defer l.mu.Unlock()
	line := level + " " + msg
	if err != nil {
		line += fmt.Sprintf(" error=%q", err.Error())
	}
	l.lines = append(l.lines, fmt.Sprintf("%s %v", line, fields))
	l.at = append(l.at, time.Now())
}
func (l *outageLog) Error(msg string, err error, f watermill.LogFields) { l.add("ERROR", msg, err, f) }
func (l *outageLog) Warn(msg string, err error, f watermill.LogFields)  { l.add("WARN", msg, err, f) }
func (l *outageLog) Info(msg string, f watermill.LogFields)             { l.add("INFO", msg, nil, f) }
func (l *outageLog) Debug(msg string, f watermill.LogFields)            { l.add("DEBUG", msg, nil, f) }
func (l *outageLog) Trace(string, watermill.LogFields)                  {}
func (l *outageLog) With(watermill.LogFields) watermill.LoggerAdapter   { return l }

// matching returns the lines that start with prefix ("LEVEL msg") and when the first was
// logged (zero: none).
func (l *outageLog) matching(prefix string) ([]string, time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	var first time.Time
	for i, s := range l.lines {
		if strings.HasPrefix(s, prefix) {
			if out == nil {
				first = l.at[i]
			}
			out = append(out, s)
		}
	}
	return out, first
}

// outageDest is a destination that can be taken away and brought back.
type outageDest struct {
	pub     message.Publisher
	cut     func()
	restore func()
	// firstAfter returns when the broker got its first message after t (zero: none yet).
	firstAfter func(t time.Time) time.Time
	// readBack returns the message ids the broker holds once n distinct ones are in,
	// in an order that keeps each ordering key's order (one queue, or partitions read in order).
	readBack func(n int) []string
	// ridesOut is the longest outage the destination's client absorbs by itself (kgo keeps
	// retrying a record until its delivery timeout): a shorter one is never answered as
	// unavailable, so the relay releases nothing and logs no outage.
	ridesOut time.Duration
}

// outageWarn and outageInfo are the subscriber's log lines that open and close an outage.
const (
	outageWarn = "WARN outbox: destination unavailable"
	outageInfo = "INFO outbox: destination available again"
)

// runOutage relays a seeded backlog through dest, takes the destination away once a quarter
// of it is published, brings it back after sc.down and checks issue 13's "Done when" 1: no
// event dead-lettered, no attempt counted, none lost or reordered per key on the broker,
// delivery resumed within 2 s of the destination being back, one WARN and one INFO line.
func runOutage(t *testing.T, name string, e *fwdEnv, evs []*fwdEvent, dest outageDest, sc outageScale) {
	t.Helper()
	log := &outageLog{}
	e.logger = log
	sub := e.subscriber(outbox.SubscriberConfig{Schema: e.schema,
		BatchSize: outbox.DefaultBatchSize, PollInterval: outbox.DefaultPollInterval})
	e.run(sub, dest.pub, forwarder.Config{})

	pgtest.Eventually(t, 2*time.Minute, "a quarter of the backlog published", func() bool {
		return e.count("published_at IS NOT NULL") >= len(evs)/4
	})
	cutAt := time.Now()
	dest.cut()
	atCut := e.count("published_at IS NOT NULL")
	time.Sleep(time.Until(cutAt.Add(sc.down))) // the outage itself, not a wait for a condition
	atRestore := e.count("published_at IS NOT NULL")
	restoreAt := time.Now()
	dest.restore()
	var first time.Time
	pgtest.Eventually(t, time.Minute, "a message on the broker after the restore", func() bool {
		first = dest.firstAfter(restoreAt)
		return !first.IsZero()
	})
	resume := first.Sub(restoreAt)
	// Settled: every event published or dead-lettered (a failing run still reports its figures).
	settleBy := time.Now().Add(3 * time.Minute)
	for e.count("published_at IS NULL AND dead_lettered_at IS NULL") > 0 && time.Now().Before(settleBy) {
		time.Sleep(20 * time.Millisecond)
	}
	drained := time.Since(restoreAt)
	pending, published := e.count("published_at IS NULL AND dead_lettered_at IS NULL"), e.count("published_at IS NOT NULL")

	var attempts int
	if err := e.pool.QueryRow(context.Background(), fmt.Sprintf(`SELECT coalesce(sum(attempts), 0) FROM %q`, e.schema.Table)).Scan(&attempts); err != nil {
		t.Fatal(err)
	}
	lost, reordered, dups, late := outageCheckBroker(e, dest.readBack(published), evs)
	e.mu.Lock()
	failed, dead, released := len(e.failed), len(e.dead), e.released
	e.mu.Unlock()
	warns, opened := log.matching(outageWarn)
	infos, closed := log.matching(outageInfo)
	t.Logf("outage %s events=%d keys=%d down=%s marked_before_cut=%d marked_after_cut_before_restore=%d: pending=%d dead=%d attempts=%d failed=%d lost=%d reordered=%d duplicates=%d late_repeats=%d released=%d resume=%s drain_after_restore=%s warn=%d (at cut%+v) info=%d (at restore%+v)",
		name, len(evs), sc.keys, sc.down, atCut, atRestore-atCut, pending, dead, attempts, failed, lost, reordered, dups, late, released,
		resume.Round(time.Millisecond), drained.Round(time.Millisecond), len(warns), opened.Sub(cutAt).Round(time.Millisecond), len(infos), closed.Sub(restoreAt).Round(time.Millisecond))
	for _, l := range append(warns, infos...) {
		t.Logf("log: %.400s", l)
	}

	if pending != 0 {
		t.Errorf("%d events neither published nor dead-lettered 3 minutes after the restore", pending)
	}
	if dead != 0 || attempts != 0 || failed != 0 {
		e.mu.Lock()
		for i, f := range e.failed {
			if i < 10 {
				t.Logf("failed: event %s attempt %d: %v", f.EventID, f.Attempts, f.Err)
			}
		}
		e.mu.Unlock()
		t.Errorf("dead-lettered %d, attempts counted %d, failures reported %d; want 0 each", dead, attempts, failed)
	}
	if lost != 0 || reordered != 0 {
		t.Errorf("on the broker: lost %d, reordered %d; want 0", lost, reordered)
	}
	if resume > 2*time.Second {
		t.Errorf("delivery resumed %s after the destination was back, want ≤ 2s", resume)
	}
	if sc.down <= dest.ridesOut {
		// The client rode the outage out: nothing was answered unavailable.
		if released != 0 || len(warns) != 0 || len(infos) != 0 {
			t.Errorf("a %s outage within the client's %s: %d released, %d WARN and %d INFO outage lines, want none", sc.down, dest.ridesOut, released, len(warns), len(infos))
		}
	} else {
		if released == 0 {
			t.Error("no event was released as unavailable: the outage was not seen")
		}
		if len(warns) != 1 || len(infos) != 1 {
			t.Errorf("%d WARN %q and %d INFO %q lines, want one each", len(warns), outageWarn, len(infos), outageInfo)
		}
	}
	e.checkMarkedOnce(fwdIDs(evs))
}

// outageCheckBroker compares the ids a broker holds (in per-key order) with the events, as the
// chaos suite does: lost are events marked published but not on the broker; reordered are first arrivals of a key's
// event that are not its key's next position; duplicates are repeats. lateRepeats counts the
// repeats that come after a later event of their key (a run of a key sent again after its
// confirms were lost: a consumer sees the older event again, after the newer one; reported, not
// a reorder of first deliveries).
func outageCheckBroker(e *fwdEnv, ids []string, evs []*fwdEvent) (lost, reordered, duplicates, lateRepeats int) {
	e.t.Helper()
	seen := map[string]bool{}
	next := map[string]int{}
	for _, id := range ids {
		ev := e.byID[id]
		if ev == nil {
			e.t.Errorf("unexpected message %s on the broker", id)
			continue
		}
		if seen[id] {
			duplicates++
			if next[ev.key] > ev.pos+1 {
				lateRepeats++
			}
			continue
		}
		seen[id] = true
		if ev.pos != next[ev.key] {
			reordered++
		}
		next[ev.key] = ev.pos + 1
	}
	published := map[string]bool{}
	rows, err := e.pool.Query(context.Background(), fmt.Sprintf(`SELECT id::text FROM %q WHERE published_at IS NOT NULL`, e.schema.Table))
	if err != nil {
		e.t.Fatal(err)
	}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			e.t.Fatal(err)
		}
		published[id] = true
	}
	rows.Close()
	for _, ev := range evs {
		if !seen[ev.id] && published[ev.id] {
			lost++
		}
	}
	return lost, reordered, duplicates, lateRepeats
}

// TestKafkaOutage: kfake (one broker, data on disk) is closed while the relay drains the
// backlog, and after the outage a new cluster starts on the same loopback port from the same
// data directory (a broker restart). Read back from the restarted cluster.
func TestKafkaOutage(t *testing.T) {
	sc := outageScaleFromEnv()
	e := fwdNewEnv(t)
	const topic = "outage.kafka"
	dir := t.TempDir()
	c1 := brokertest.Kafka(t, kfake.NumBrokers(1), kfake.SeedTopics(8, topic), kfake.DataDir(dir))
	addr := c1.ListenAddrs()[0]
	_, portStr, _ := net.SplitHostPort(addr)
	var port int
	if _, err := fmt.Sscan(portStr, &port); err != nil {
		t.Fatal(err)
	}
	evs := e.seed(sc.events, sc.keys, func(int) string { return topic })

	var (
		mu       sync.Mutex
		c2       *kfake.Cluster
		produced []time.Time // produce requests the restarted cluster got
	)
	plog := &outageLog{}
	pub, err := kafka.NewPublisher(kafka.Config{Brokers: []string{addr}}, plog)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	t.Cleanup(func() {
		all, _ := plog.matching("")
		for _, l := range all {
			t.Logf("kafka: %.300s", l)
		}
	})
	dest := outageDest{
		pub: pub,
		cut: c1.Close,
		// kgo retries a record for its delivery timeout (the publisher's default 10 s) and the
		// publisher waits 2 s more before answering.
		ridesOut: 12 * time.Second,
		restore: func() {
			c, err := kfake.NewCluster(kfake.Ports(port), kfake.DataDir(dir))
			if err != nil {
				t.Fatalf("kfake restart on port %d: %v", port, err)
			}
			t.Cleanup(c.Close)
			c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
				c.KeepControl()
				mu.Lock()
				produced = append(produced, time.Now())
				mu.Unlock()
				return nil, nil, false // observed only: the broker handles it
			})
			mu.Lock()
			c2 = c
			mu.Unlock()
		},
		firstAfter: func(at time.Time) time.Time {
			mu.Lock()
			defer mu.Unlock()
			for _, p := range produced {
				if p.After(at) {
					return p
				}
			}
			return time.Time{}
		},
		readBack: func(n int) []string {
			mu.Lock()
			c := c2
			mu.Unlock()
			var col fwdCollector
			fwdKafkaConsume(t, c, &col, topic)
			distinct := func() int {
				m := map[string]bool{}
				for _, r := range col.all() {
					m[r.uuid] = true
				}
				return len(m)
			}
			pgtest.Eventually(t, 2*time.Minute, "every event read back from the restarted cluster", func() bool { return distinct() >= n })
			var ids []string
			for _, r := range col.all() {
				ids = append(ids, r.uuid)
			}
			return ids
		},
	}
	runOutage(t, "kafka", e, evs, dest, sc)
}

// outageProxy forwards a loopback port to a target; cut closes its connections and its
// listener (connections to the port are refused), restore listens on the same port again.
type outageProxy struct {
	t      *testing.T
	addr   string
	target string
	mu     sync.Mutex
	l      net.Listener
	conns  []net.Conn
}

func newOutageProxy(t *testing.T, target string) *outageProxy {
	t.Helper()
	p := &outageProxy{t: t, target: target}
	p.listen("127.0.0.1:0")
	t.Cleanup(p.cut)
	return p
}

func (p *outageProxy) listen(addr string) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		p.t.Fatalf("proxy listen %s: %v", addr, err)
	}
	p.mu.Lock()
	p.l, p.addr = l, l.Addr().String()
	p.mu.Unlock()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", p.target)
			if err != nil {
				_ = c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, up)
			p.mu.Unlock()
			go func() { _, _ = io.Copy(up, c); _ = up.Close() }()
			go func() { _, _ = io.Copy(c, up); _ = c.Close() }()
		}
	}()
}

func (p *outageProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	_ = p.l.Close()
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.conns = nil
}

func (p *outageProxy) restore() { p.listen(p.addr) }

// TestRabbitMQOutage: the relay publishes to RabbitMQ through a loopback proxy that is cut
// (connections closed, the port refusing) for the outage and then restored on the same port;
// a consumer connected to RabbitMQ directly reads the queue throughout.
func TestRabbitMQOutage(t *testing.T) {
	sc := outageScaleFromEnv()
	url := brokertest.RequireRabbitMQ(t)
	e := fwdNewEnv(t)
	q := fwdName("outage-amqp")
	fwdAMQPQueues(t, url, q)
	evs := e.seed(sc.events, sc.keys, func(int) string { return q })
	px := newOutageProxy(t, strings.TrimSuffix(strings.SplitN(url, "@", 2)[1], "/"))

	ch := fwdAMQPChannel(t, url)
	deliveries, err := ch.Consume(q, "", true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		ids   []string
		times []time.Time
	)
	go func() {
		for d := range deliveries {
			mu.Lock()
			ids, times = append(ids, d.MessageId), append(times, time.Now())
			mu.Unlock()
		}
	}()
	dest := outageDest{
		pub:     fwdAMQPPublisher(t, amqp.Config{URL: "amqp://guest:guest@" + px.addr + "/"}),
		cut:     px.cut,
		restore: px.restore,
		firstAfter: func(at time.Time) time.Time {
			mu.Lock()
			defer mu.Unlock()
			for _, tm := range times {
				if tm.After(at) {
					return tm
				}
			}
			return time.Time{}
		},
		readBack: func(n int) []string {
			distinct := func() int {
				mu.Lock()
				defer mu.Unlock()
				m := map[string]bool{}
				for _, id := range ids {
					m[id] = true
				}
				return len(m)
			}
			pgtest.Eventually(t, 2*time.Minute, "every event consumed from the queue", func() bool { return distinct() >= n })
			// Every publish was confirmed before its mark: the queue is empty once the consumer
			// has them all, so nothing (no late duplicate) is left behind.
			admin := fwdAMQPChannel(t, url)
			pgtest.Eventually(t, 30*time.Second, "the queue empty", func() bool {
				st, err := admin.QueueDeclarePassive(q, true, false, false, false, nil)
				return err == nil && st.Messages == 0
			})
			mu.Lock()
			defer mu.Unlock()
			return append([]string(nil), ids...)
		},
	}
	runOutage(t, "rabbitmq", e, evs, dest, sc)
}
