package outbox

import (
	"context"
	"flag"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"

	"github.com/ThreeDotsLabs/watermill/message"
	"time"

	"github.com/watermill-outbox/outbox/internal/dialect"
	"github.com/watermill-outbox/outbox/internal/dialect/memory"
)

// The relay simulation: the real Subscriber (newSubscriberOn) over the in-memory table, under
// testing/synctest's virtual clock. Each seed plans writers, one to three relays that are
// killed and restarted, destinations that ack, fail, refuse, go unavailable, drop the
// connection, answer slowly or never, and faults in the relays' claims, renewals and marks;
// it runs until every event is published or dead-lettered, then checks the invariants of
// simtest_check_test.go against the log. A seed's plan (what is written when, the answers, the
// kills, the faults) is a function of the seed; the interleaving of goroutines within one
// virtual instant is the scheduler's, so a failing seed reproduces most but not necessarily all
// of the time.

var (
	simSeed  = flag.Int64("sim.seed", -1, "run only this seed of TestSimulation")
	simSeeds = flag.Int("sim.seeds", 200, "how many seeds TestSimulation runs (env OUTBOX_SIM_SEEDS overrides)")
	simLog   = flag.Bool("sim.log", false, "print the log of the seeds that fail (with -sim.seed)")
)

// simDeadline is the virtual time a seed may take to publish or dead-letter every event.
const simDeadline = 30 * time.Minute

// simPlan is everything a seed decides.
type simPlan struct {
	seed      int64
	cfg       SubscriberConfig
	caps      dialect.Capabilities
	writes    []simWrite
	slots     []simSlot
	faultRate int // per million operations
	slowPct   int
	weights   [6]int // per mille: ack, fail, perm, unavailable, not attempted, silent
	// poison is the sequence of the event that kills the relay delivering it, every time (0:
	// none). A seed with one has no planned kills, faults or slow answers, no relays sharing a
	// name, no "not attempted"
	// answers (each keeps its delivery start) and MaxDeliveryStarts ≥ 3: every delivery start
	// without an outcome is then the poison event's doing, and (g) holds that only it is
	// dead-lettered as poison.
	poison int64
	// dests: messages are bound for destinations d0, d1, d2 (sequence mod 3) named by
	// SubscriberConfig.Destination, so outages hold per destination; limited: d0 is limited to
	// 5 events/s.
	dests, limited bool
}

// simWrite is one insert at a virtual time after the start.
type simWrite struct {
	at   time.Duration
	rows []dialect.InsertRow
}

// simSlot is one relay: its name and the times it is killed (restarted after restart).
type simSlot struct {
	name    string
	kills   []time.Duration
	restart time.Duration
}

var simOutcomes = [6]string{simAck, simFail, simPerm, simUnavailable, simNotAttempted, simSilent}

// outcome returns the answer of a draw in [0, 1000).
func (p *simPlan) outcome(draw uint64) string {
	for i, w := range p.weights {
		if draw < uint64(w) {
			return simOutcomes[i]
		}
		draw -= uint64(w)
	}
	return simAck
}

// newSimPlan draws seed's plan.
func newSimPlan(seed int64) simPlan {
	n := 0
	draw := func(k int) int { // in [0, k)
		n++
		return int(simHash(seed, 0, int64(n)) % uint64(k))
	}
	p := simPlan{seed: seed}
	switch draw(4) {
	case 0, 1: // PostgreSQL's
		p.caps = dialect.Capabilities{SkipLocked: true, Continuations: true, FlushAcks: true, DatabaseClock: true}
	case 2: // MariaDB's
		p.caps = dialect.Capabilities{SkipLocked: true, Continuations: true, FlushAcks: true, DatabaseClock: true}
	default: // SQLite's
		p.caps = dialect.Capabilities{ClaimAhead: true}
	}
	batch := []int{1, 2, 4, 8, 16}[draw(5)]
	p.cfg = SubscriberConfig{PollInterval: 500 * time.Millisecond, BatchSize: batch, MaxRunPerKey: min(batch, 1+draw(4)), KeyScan: 100,
		MaxAttempts: 2 + draw(3), RetryBase: 200 * time.Millisecond, RetryMax: 2 * time.Second, LeaseDuration: 20 * time.Second,
		DeliveryTimeout: 2 * time.Second, CloseTimeout: time.Second, Concurrency: 1 + draw(4), UnavailableBackoff: 100 * time.Millisecond,
		UnavailableBackoffMax: 2 * time.Second, MarkInterval: 50 * time.Millisecond, MaxDeliveryStarts: 2 + draw(3)}
	scale := draw(3) // 0: every answer an ack; 1, 2: more trouble
	p.weights = [6]int{1000, 0, 0, 0, 0, 0}
	if scale > 0 {
		p.weights = [6]int{1000 - 270*scale, 80 * scale, 15 * scale, 50 * scale, 80 * scale, 45 * scale}
	}
	p.slowPct = 10 * draw(5)
	p.faultRate = []int{0, 0, 5_000, 20_000}[draw(4)]
	events := 20 + draw(60)
	for seq := 0; seq < events; {
		w := simWrite{at: time.Duration(draw(20_000)) * time.Millisecond}
		for k := 1 + draw(3); k > 0 && seq < events; k-- {
			seq++
			r := dialect.InsertRow{ID: fmt.Sprintf("00000000-0000-4000-8000-%012d", seq), Topic: []string{"t.a", "t.b", "t.c"}[draw(3)],
				Payload: []byte("{}"), Headers: "{}"}
			if draw(10) < 7 {
				key := "k" + strconv.Itoa(draw(10))
				r.OrderingKey = &key
			}
			w.rows = append(w.rows, r)
		}
		p.writes = append(p.writes, w)
	}
	shared := draw(2) == 0
	for i := range 1 + draw(3) {
		s := simSlot{name: "relay" + strconv.Itoa(i), restart: time.Duration(draw(2000)) * time.Millisecond}
		if shared {
			s.name = "relay"
		}
		at := time.Duration(0)
		for range draw(3) {
			at += time.Second + time.Duration(draw(20_000))*time.Millisecond
			s.kills = append(s.kills, at)
		}
		p.slots = append(p.slots, s)
	}
	if draw(4) == 0 {
		p.poison = int64(1 + draw(events))
		for i := range p.slots {
			// A name of its own (a restart still takes back its predecessor's leases): a live
			// relay sharing it would lose its leases to the other's restart, a start counted
			// without a crash.
			p.slots[i].kills, p.slots[i].name = nil, "relay"+strconv.Itoa(i)
		}
		p.faultRate, p.slowPct = 0, 0
		p.weights[0], p.weights[4] = p.weights[0]+p.weights[4], 0
		p.cfg.MaxDeliveryStarts = max(p.cfg.MaxDeliveryStarts, 3)
	}
	if draw(3) == 0 && p.poison == 0 {
		p.dests, p.limited = true, draw(2) == 0
		p.cfg.Destination = func(_ string, msg *message.Message) string {
			seq, _ := strconv.ParseInt(msg.Metadata.Get(MetadataSequence), 10, 64)
			return "d" + strconv.FormatInt(seq%3, 10)
		}
		if p.limited {
			p.cfg.DestinationLimits = map[string]DestinationLimit{"d0": {Rate: 5, Burst: 1}}
		}
	}
	return p
}

// runSim runs seed's plan and returns the world for the checker, or an error when the run
// itself failed (a Subscriber refused its config, the deadline passed).
func runSim(seed int64) (*simWorld, error) {
	w := &simWorld{p: newSimPlan(seed), byEx: map[dialect.Executor]*simGen{}, nth: map[int64]int{}, faults: map[string]int{}}
	w.db = memory.New(memory.WithCapabilities(w.p.caps), memory.WithHook(w.hook))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var (
		mu   sync.Mutex
		live = map[int]*simGen{}
		errs []error
		jobs sync.WaitGroup
	)
	fail := func(err error) {
		mu.Lock()
		errs = append(errs, err)
		mu.Unlock()
	}
	crashDone := make(chan struct{}) // closed when the run is over: the crash loops end
	w.crash = make([]chan *simGen, len(w.p.slots))
	for i, s := range w.p.slots {
		w.crash[i] = make(chan *simGen, 1)
		g, err := w.start(ctx, i, s.name)
		if err != nil {
			return w, err
		}
		mu.Lock()
		live[i] = g
		mu.Unlock()
		jobs.Add(1)
		// restart kills slot i's live generation when it is dead (nil: any), and starts its
		// successor after the slot's delay; false when the successor did not start.
		restart := func(dead *simGen) bool {
			mu.Lock()
			g := live[i]
			mu.Unlock()
			if dead != nil && g != dead {
				return true // killed already
			}
			h := w.kill(g)
			time.Sleep(s.restart)
			g, err := w.start(ctx, i, s.name)
			if err != nil {
				fail(err)
				return false
			}
			jobs.Add(1)
			go func() {
				defer jobs.Done()
				w.retaken(h, g)
			}()
			mu.Lock()
			live[i] = g
			mu.Unlock()
			return true
		}
		go func() {
			defer jobs.Done()
			began := time.Now()
			for _, at := range s.kills {
				time.Sleep(time.Until(began.Add(at)))
				if !restart(nil) {
					return
				}
			}
		}()
		if w.p.poison == 0 {
			continue
		}
		// The poison event's deliveries kill the relay (asked by its destination), which
		// restarts after its slot's delay.
		jobs.Add(1)
		go func() {
			defer jobs.Done()
			for {
				select {
				case <-crashDone:
					return
				case dead := <-w.crash[i]:
					if !restart(dead) {
						return
					}
				}
			}
		}()
	}
	var written atomic.Int64
	jobs.Add(1)
	go func() {
		defer jobs.Done()
		began := time.Now()
		writer := &memory.Executor{}
		for _, wr := range sortedWrites(w.p.writes) {
			time.Sleep(time.Until(began.Add(wr.at)))
			st, err := w.db.Insert(ctx, writer, &dialect.InsertParams{Table: &dialect.Table{Parts: []string{DefaultTable}}, Rows: wr.rows})
			if err != nil {
				fail(err)
				return
			}
			for _, x := range st {
				w.record(simEntry{kind: simInsert, seq: x.Sequence})
			}
			written.Add(int64(len(st)))
		}
	}()
	total := 0
	for _, wr := range w.p.writes {
		total += len(wr.rows)
	}
	deadline := time.Now().Add(simDeadline)
	for written.Load() < int64(total) || !simSettled(w.db.Rows()) {
		if time.Now().After(deadline) {
			fail(fmt.Errorf("(a) not every event was published or dead-lettered within %s of virtual time", simDeadline))
			break
		}
		time.Sleep(time.Second)
	}
	close(crashDone)
	jobs.Wait()
	for _, g := range live {
		w.stop(g)
	}
	w.wg.Wait()
	if len(errs) > 0 {
		return w, errs[0]
	}
	return w, nil
}

// sortedWrites returns the writes in time order (insertion order among equal times).
func sortedWrites(ws []simWrite) []simWrite {
	out := append([]simWrite(nil), ws...)
	for i := 1; i < len(out); i++ {
		for j := i; j > 0 && out[j].at < out[j-1].at; j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return out
}

// simSettled reports whether every row is published, dead-lettered, or waits behind a
// dead-lettered event of its key (which no relay may pass).
func simSettled(rows []memory.Row) bool {
	return len(simUnsettled(rows)) == 0
}

// simUnsettled returns the rows that are neither published, nor dead-lettered, nor behind a
// dead-lettered event of their key.
func simUnsettled(rows []memory.Row) []int64 {
	blocked := map[string]bool{}
	var out []int64
	for _, r := range rows {
		switch {
		case !r.PublishedAt.IsZero():
		case !r.DeadLetteredAt.IsZero():
			if r.OrderingKey != nil {
				blocked[*r.OrderingKey] = true
			}
		case r.OrderingKey != nil && blocked[*r.OrderingKey]:
		default:
			out = append(out, r.Sequence)
		}
	}
	return out
}

// simSeedCount is how many seeds to run: OUTBOX_SIM_SEEDS, else -sim.seeds.
func simSeedCount(t *testing.T) int {
	if v := os.Getenv("OUTBOX_SIM_SEEDS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			t.Fatalf("OUTBOX_SIM_SEEDS=%q: %v", v, err)
		}
		return n
	}
	return *simSeeds
}

// TestSimulation runs the seeds (in parallel, one worker per CPU) and reports each failing
// seed with the command that reruns it.
func TestSimulation(t *testing.T) {
	seeds := []int64{*simSeed}
	if *simSeed < 0 {
		seeds = nil
		for i := range simSeedCount(t) {
			seeds = append(seeds, int64(i))
		}
	}
	var next, failed atomic.Int64
	for w := range min(runtime.GOMAXPROCS(0), len(seeds)) {
		t.Run(fmt.Sprint("worker", w), func(t *testing.T) {
			t.Parallel()
			for {
				i := next.Add(1) - 1
				if i >= int64(len(seeds)) || failed.Load() >= 5 {
					return
				}
				seed := seeds[i]
				var problems []string
				synctest.Test(t, func(t *testing.T) {
					w, err := runSim(seed)
					problems = simCheck(w, err)
					if len(problems) > 0 && *simLog {
						w.mu.Lock()
						for _, e := range w.log {
							t.Log(e)
						}
						w.mu.Unlock()
					}
					if *simSeed >= 0 || testing.Verbose() && seed < 3 {
						t.Logf("seed %d: %s", seed, simStats(w))
					}
				})
				if len(problems) > 0 {
					failed.Add(1)
					t.Errorf("seed %d failed: go test -run TestSimulation -sim.seed=%d\n%s", seed, seed, simReport(problems))
				}
			}
		})
	}
}

// simStats summarises a run: its log's entries by kind and its virtual duration.
func simStats(w *simWorld) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := map[simKind]int{}
	for _, e := range w.log {
		n[e.kind]++
	}
	took := time.Duration(0)
	if len(w.log) > 0 {
		took = w.log[len(w.log)-1].at.Sub(w.log[0].at)
	}
	return fmt.Sprintf("%d inserts, %d claims, %d deliveries, %d answers, %d marks, %d relays started, %d kills, %d lost leases, %d faults, %d take-backs over %s (batch %d, run %d, caps %+v)",
		n[simInsert], n[simClaim], n[simEmit], n[simAnswer], n[simMark], n[simStart], n[simKill], n[simLeaseLost], n[simFault], n[simTakeBack], took,
		w.p.cfg.BatchSize, w.p.cfg.MaxRunPerKey, w.p.caps)
}
