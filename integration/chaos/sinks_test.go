package chaos

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/watermill-outbox/outbox/webhook"
)

// delivery is one event arriving at the destination.
type delivery struct {
	id string
	at time.Time
}

// deliveryLog is what a destination received, in arrival order. Safe for concurrent use.
type deliveryLog struct {
	mu   sync.Mutex
	list []delivery
	seen map[string]time.Time
}

func newDeliveryLog() *deliveryLog { return &deliveryLog{seen: map[string]time.Time{}} }

func (l *deliveryLog) add(id string, at time.Time) {
	l.mu.Lock()
	l.list = append(l.list, delivery{id: id, at: at})
	if _, ok := l.seen[id]; !ok {
		l.seen[id] = at
	}
	l.mu.Unlock()
}

// distinct is the number of distinct events received.
func (l *deliveryLog) distinct() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.seen)
}

// has reports whether id was received.
func (l *deliveryLog) has(id string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, ok := l.seen[id]
	return ok
}

// all returns a copy of the deliveries in arrival order.
func (l *deliveryLog) all() []delivery {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]delivery(nil), l.list...)
}

// firstAfter is the arrival time of the first delivery at or after t (zero if none).
func (l *deliveryLog) firstAfter(t time.Time) time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, d := range l.list {
		if !d.at.Before(t) {
			return d.at
		}
	}
	return time.Time{}
}

// lastNew is the arrival time of the last event received for the first time.
func (l *deliveryLog) lastNew() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	var last time.Time
	for _, at := range l.seen {
		if at.After(last) {
			last = at
		}
	}
	return last
}

// receiver is a webhook endpoint on 127.0.0.1 that answers every POST after delay with 204,
// except for the event ids refuse names, answered 500. Deliveries are logged on arrival.
type receiver struct {
	url   string
	log   *deliveryLog
	delay time.Duration

	mu      sync.Mutex
	refuse  map[string]bool
	refused map[string]int
}

// startReceiver serves until tb ends.
func startReceiver(tb testing.TB, delay time.Duration, refuse ...string) *receiver {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	r := &receiver{url: "http://" + l.Addr().String() + "/hook", log: newDeliveryLog(), delay: delay,
		refuse: map[string]bool{}, refused: map[string]int{}}
	for _, id := range refuse {
		r.refuse[id] = true
	}
	srv := &http.Server{Handler: r, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(l) }()
	tb.Cleanup(func() { _ = srv.Close() })
	return r
}

func (r *receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	at := time.Now()
	_, _ = io.Copy(io.Discard, req.Body)
	id := req.Header.Get(webhook.HeaderEventID)
	r.mu.Lock()
	refuse := r.refuse[id]
	if refuse {
		r.refused[id]++
	}
	r.mu.Unlock()
	if refuse {
		http.Error(w, "poison", http.StatusInternalServerError)
		return
	}
	r.log.add(id, at)
	time.Sleep(r.delay)
	w.WriteHeader(http.StatusNoContent)
}

// refusals is how many times id was answered 500.
func (r *receiver) refusals(id string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.refused[id]
}

// streamReader follows a Redis stream from its start, logging each entry's event id
// ("_watermill_message_uuid") at the entry id's time (Redis's clock, milliseconds).
type streamReader struct {
	rdb    *redis.Client
	stream string
	log    *deliveryLog
	last   string
	stop   context.CancelFunc
	done   chan struct{}
}

// followStream reads stream every 20 ms until tb ends or close is called; read errors (the
// server is down) are retried.
func followStream(tb testing.TB, addr, stream string) *streamReader {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s := &streamReader{rdb: redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: time.Second, ReadTimeout: 2 * time.Second}),
		stream: stream, log: newDeliveryLog(), last: "-", stop: cancel, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		for ctx.Err() == nil {
			_ = s.poll(ctx)
			select {
			case <-ctx.Done():
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	tb.Cleanup(s.close)
	return s
}

// poll reads the entries after the last one read.
func (s *streamReader) poll(ctx context.Context) error {
	for {
		start := s.last
		if start != "-" {
			start = "(" + start
		}
		msgs, err := s.rdb.XRangeN(ctx, s.stream, start, "+", 5000).Result()
		if err != nil {
			return err
		}
		for _, m := range msgs {
			id, _ := m.Values["_watermill_message_uuid"].(string)
			s.log.add(id, entryTime(m.ID))
			s.last = m.ID
		}
		if len(msgs) < 5000 {
			return nil
		}
	}
}

// drain stops following after a last complete read (retried for up to 30 s while Redis is
// unreachable).
func (s *streamReader) drain() error {
	s.stop()
	<-s.done
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := s.poll(ctx)
		cancel()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (s *streamReader) close() {
	s.stop()
	<-s.done
	_ = s.rdb.Close()
}

// entryTime is the time part of a stream entry id "<ms>-<seq>".
func entryTime(id string) time.Time {
	ms, _ := strconv.ParseInt(strings.SplitN(id, "-", 2)[0], 10, 64)
	return time.UnixMilli(ms)
}

// waitFor polls cond every 20 ms until it returns true or timeout passes.
func waitFor(timeout time.Duration, what string, cond func() (bool, string)) error {
	deadline := time.Now().Add(timeout)
	for {
		ok, state := cond()
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: not within %s (%s)", what, timeout, state)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
