package main

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// demoPayload is the body of every demo event.
type demoPayload struct {
	Order    string `json:"order"`
	Customer string `json:"customer"`
	// Seq counts the committed events of the customer (the ordering key): 1, 2, 3 …
	Seq         int    `json:"seq"`
	Event       string `json:"event"`
	AmountCents int    `json:"amount_cents"`
}

// committedEvent is what the tracker knows about a committed event.
type committedEvent struct {
	key      string
	seq      int
	commitAt time.Time
}

// tracker records what the writers committed and rolled back and what arrived at the sink,
// and turns it into the demo's report. Safe for concurrent use.
type tracker struct {
	mu         sync.Mutex
	committed  map[string]committedEvent
	rolledBack map[string]struct{}
	// received holds the first receipt time of each event id.
	received map[string]time.Time
	// lastSeq is the highest Seq received per ordering key.
	lastSeq    map[string]int
	duplicates int
	reordered  int
	malformed  int
	firstWrite time.Time
	lastWrite  time.Time
	// started is when the writers started (the origin of --rate's schedule); lastTx is when
	// the last transaction ended (committed or rolled back).
	started, lastTx time.Time

	// Counters read by the progress bar without the lock.
	nCommitted atomic.Int64
	nReceived  atomic.Int64
	nTx        atomic.Int64
	nTxRolled  atomic.Int64
	verified   atomic.Int64
	rejected   atomic.Int64
	refused    atomic.Int64
	marked     atomic.Int64
	// writing is true while the writers run.
	writing atomic.Bool
}

func newTracker() *tracker {
	return &tracker{
		committed:  map[string]committedEvent{},
		rolledBack: map[string]struct{}{},
		received:   map[string]time.Time{},
		lastSeq:    map[string]int{},
	}
}

// start records when the writers started.
func (t *tracker) start(at time.Time) {
	t.mu.Lock()
	t.started = at
	t.mu.Unlock()
}

// wrote records the start of a write.
func (t *tracker) wrote(start time.Time) {
	t.mu.Lock()
	if t.firstWrite.IsZero() || start.Before(t.firstWrite) {
		t.firstWrite = start
	}
	t.mu.Unlock()
}

// commit records the events of a committed transaction.
func (t *tracker) commit(ids []string, evs []demoPayload, at time.Time) {
	t.mu.Lock()
	for i, id := range ids {
		t.committed[id] = committedEvent{key: evs[i].Customer, seq: evs[i].Seq, commitAt: at}
	}
	if at.After(t.lastWrite) {
		t.lastWrite = at
	}
	t.endTx(at)
	t.mu.Unlock()
	t.nTx.Add(1)
	t.nCommitted.Add(int64(len(ids)))
}

// endTx records a transaction that ended at at; t.mu must be held.
func (t *tracker) endTx(at time.Time) {
	if at.After(t.lastTx) {
		t.lastTx = at
	}
}

// rollback records the events of a transaction rolled back at at.
func (t *tracker) rollback(ids []string, at time.Time) {
	t.mu.Lock()
	for _, id := range ids {
		t.rolledBack[id] = struct{}{}
	}
	t.endTx(at)
	t.mu.Unlock()
	t.nTx.Add(1)
	t.nTxRolled.Add(1)
}

// receive records one arrival of event id with its payload. A repeat is a duplicate; a first
// arrival whose Seq is not above the key's highest so far is an order violation.
func (t *tracker) receive(id string, payload []byte, at time.Time) {
	var p demoPayload
	ok := json.Unmarshal(payload, &p) == nil && p.Customer != "" && p.Seq > 0
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, seen := t.received[id]; seen {
		t.duplicates++
		return
	}
	t.received[id] = at
	t.nReceived.Add(1)
	if !ok {
		t.malformed++
		return
	}
	if p.Seq <= t.lastSeq[p.Customer] {
		t.reordered++
	} else {
		t.lastSeq[p.Customer] = p.Seq
	}
}

// lastReceipt is when the last first receipt of an event happened (zero before any).
func (t *tracker) lastReceipt() time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	var last time.Time
	for _, at := range t.received {
		if at.After(last) {
			last = at
		}
	}
	return last
}

// missing counts committed events not received yet.
func (t *tracker) missing() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for id := range t.committed {
		if _, ok := t.received[id]; !ok {
			n++
		}
	}
	return n
}

// demoReport is the outcome of a demo run.
type demoReport struct {
	Transactions, TxRolledBack          int
	Committed, RolledBack               int
	Delivered, Duplicates, Reordered    int
	Missing, RolledBackDelivered, Other int
	Keys                                int
	P50, P99, Max                       time.Duration
	WriteRate, Throughput               float64
	// TxRate is the transactions (committed and rolled back) per second from the writers'
	// start to the last transaction's end: the rate --rate asks for.
	TxRate  float64
	Elapsed time.Duration
	// Drain is how long after the last commit the last event arrived (0 when it arrived before).
	Drain time.Duration
}

// report computes the demo's report from what was recorded.
func (t *tracker) report() demoReport {
	t.mu.Lock()
	defer t.mu.Unlock()
	r := demoReport{
		Transactions: int(t.nTx.Load()), TxRolledBack: int(t.nTxRolled.Load()),
		Committed: len(t.committed), RolledBack: len(t.rolledBack),
		Duplicates: t.duplicates, Reordered: t.reordered, Keys: len(t.lastSeq),
	}
	var lat []time.Duration
	var last time.Time
	for id, at := range t.received {
		if at.After(last) {
			last = at
		}
		if c, ok := t.committed[id]; ok {
			r.Delivered++
			lat = append(lat, max(0, at.Sub(c.commitAt)))
			continue
		}
		if _, ok := t.rolledBack[id]; ok {
			r.RolledBackDelivered++
			continue
		}
		r.Other++
	}
	r.Missing = r.Committed - r.Delivered
	slices.Sort(lat)
	if n := len(lat); n > 0 {
		r.P50 = lat[n*50/100]
		r.P99 = lat[min(n-1, n*99/100)]
		r.Max = lat[n-1]
	}
	if w := t.lastWrite.Sub(t.firstWrite); w > 0 {
		r.WriteRate = float64(r.Committed) / w.Seconds()
	}
	if w := t.lastTx.Sub(t.started); w > 0 {
		r.TxRate = float64(r.Transactions) / w.Seconds()
	}
	if !last.IsZero() {
		r.Drain = max(0, last.Sub(t.lastWrite))
		r.Elapsed = last.Sub(t.firstWrite)
		if r.Elapsed > 0 {
			r.Throughput = float64(r.Delivered) / r.Elapsed.Seconds()
		}
	}
	return r
}

// ok reports whether the run met the outbox's guarantees.
func (r demoReport) ok() bool {
	return r.Missing == 0 && r.RolledBackDelivered == 0 && r.Reordered == 0
}

// failure is the one-line reason a run failed, "" when it did not.
func (r demoReport) failure(deadline time.Duration) string {
	switch {
	case r.RolledBackDelivered > 0:
		return fmt.Sprintf("demo failed: %d events of rolled-back transactions were delivered", r.RolledBackDelivered)
	case r.Reordered > 0:
		return fmt.Sprintf("demo failed: %d events arrived out of order for their ordering key", r.Reordered)
	case r.Missing > 0:
		return fmt.Sprintf("demo failed: %d of %d committed events were not delivered within --deadline %s", r.Missing, r.Committed, deadline)
	}
	return ""
}

// print writes the report: the counts, extra, latency and throughput, then after (notes and
// what --keep kept), and last the machine-checkable summary line.
func (r demoReport) print(w io.Writer, extra, after []string) {
	n := func(v int, one, many string) string { return plural(int64(v), one, many) }
	ms := func(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond)) }
	fmt.Fprintf(w, "  transactions        %d (%d committed, %d rolled back on purpose)\n", r.Transactions, r.Transactions-r.TxRolledBack, r.TxRolledBack)
	fmt.Fprintf(w, "  events written      %d committed, %d rolled back\n", r.Committed, r.RolledBack)
	fmt.Fprintf(w, "  delivered           %d unique of %d committed (%d missing), %s\n", r.Delivered, r.Committed, r.Missing, n(r.Duplicates, "duplicate", "duplicates"))
	fmt.Fprintf(w, "  order               %s over %s\n", n(r.Reordered, "violation", "violations"), n(r.Keys, "ordering key", "ordering keys"))
	fmt.Fprintf(w, "  rolled back         %d delivered (must be 0)\n", r.RolledBackDelivered)
	if r.Other > 0 {
		fmt.Fprintf(w, "  unexpected          %s neither written nor rolled back by this run\n", n(r.Other, "event", "events"))
	}
	for _, e := range extra {
		fmt.Fprintln(w, "  "+e)
	}
	fmt.Fprintf(w, "  latency             p50 %s, p99 %s, max %s (commit → receipt)\n", ms(r.P50), ms(r.P99), ms(r.Max))
	fmt.Fprintf(w, "  throughput          %.0f events/s delivered over %s (writers: %.0f events/s)\n", r.Throughput, r.Elapsed.Round(time.Millisecond), r.WriteRate)
	for _, a := range after {
		fmt.Fprintln(w, "  "+a)
	}
	fmt.Fprintf(w, "delivered=%d committed=%d duplicates=%d reordered=%d rolled_back_delivered=%d\n", r.Delivered, r.Committed, r.Duplicates, r.Reordered, r.RolledBackDelivered)
}
