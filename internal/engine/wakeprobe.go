package engine

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/watermill-outbox/outbox/internal/dialect"
)

// wakeProbe is a Subscriber's wake probe (SubscriberConfig.WakeProbeInterval), shared by its
// subscriptions: every interval it reads the identity sequence behind "sequence" and, while it
// watches writers, the database's snapshot (one statement that reads no table rows, so its cost
// does not grow with the table, its dead row versions or a snapshot held open elsewhere), and
// wakes the subscriptions when events may have been committed (see probeTracker). After
// idleAfter without writes it probes every WakeProbeIdleFactor intervals instead, until the next
// write: each probe wakes an idle database backend, whatever the statement. It runs while at
// least one subscription listens.
type wakeProbe struct {
	s        *Relay
	p        dialect.WakeProber
	ex       dialect.Executor // the handle itself: one plain statement per probe, no relay transaction
	interval time.Duration

	mu      sync.Mutex
	subs    map[chan struct{}]struct{}
	running bool

	// empty counts the polls in a row that a probe's wake-up started and that leased nothing
	// (the new events were for other topics, or still uncommitted); written by the
	// subscriptions' goroutines (emptyWake, workedWake), read by the probe's goroutine.
	empty atomic.Int32
}

// emptyWakeSlack is how many empty woken polls in a row cost nothing: one claim right after a
// sequence move often runs before its writer commits, and the next one finds the event.
const emptyWakeSlack = 2

// maxEmptyWakeShift bounds the probe's slow-down after empty woken polls: at most 8 × the
// interval.
const maxEmptyWakeShift = 3

// emptyWake records a poll that a probe's wake-up started and that leased nothing.
func (w *wakeProbe) emptyWake() { w.empty.Add(1) }

// workedWake records a poll that a probe's wake-up started and that leased events.
func (w *wakeProbe) workedWake() { w.empty.Store(0) }

// wait returns the wait before the next probe while writes go on: the interval, doubled for
// each empty woken poll in a row beyond emptyWakeSlack, up to maxEmptyWakeShift doublings (8×,
// below the idle interval's WakeProbeIdleFactor). A relay whose topics the writers do not write otherwise claimed on every
// probe while they wrote: with 8 writers saturating PostgreSQL on 2 cores, such a relay cut
// their throughput to 0.63-0.72x.
func (w *wakeProbe) wait() time.Duration {
	n := min(max(int(w.empty.Load())-emptyWakeSlack, 0), maxEmptyWakeShift)
	return w.interval << n
}

// maxProbeBackoff bounds the wait between probes after failures.
const maxProbeBackoff = 5 * time.Second

// The probe slows to WakeProbeIdleFactor × interval once the sequence has not moved for
// idleAfter and no writer is watched.
const idleAfter = time.Second

// listen returns a channel that receives a value (coalescing) whenever the probe finds that
// events may have been committed; it stops receiving when ctx ends. The first listener starts
// the probe's goroutine (part of the Subscriber's WaitGroup); it ends when no one listens or
// the Subscriber closes.
func (w *wakeProbe) listen(ctx context.Context) <-chan struct{} {
	ch := make(chan struct{}, 1)
	w.mu.Lock()
	w.subs[ch] = struct{}{}
	start := !w.running
	w.running = true
	w.mu.Unlock()
	context.AfterFunc(ctx, func() {
		w.mu.Lock()
		delete(w.subs, ch)
		w.mu.Unlock()
	})
	if start {
		// Called from a subscription's goroutine, itself in the WaitGroup: Add is safe here.
		w.s.wg.Add(1)
		go w.run()
	}
	return ch
}

// idle reports whether no one listens, and if so marks the probe stopped.
func (w *wakeProbe) idle() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.subs) == 0 {
		w.running = false
		return true
	}
	return false
}

// busy reports whether every listener still holds an unread wake-up: each subscription is
// claiming or delivering and polls again as soon as it would wait, so a probe now could change
// nothing. The probe skips it; its next reading compares with the last one, so a move meanwhile
// still wakes them.
func (w *wakeProbe) busy() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for ch := range w.subs {
		if len(ch) == 0 {
			return false
		}
	}
	return true
}

func (w *wakeProbe) dispatch() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for ch := range w.subs {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

func (w *wakeProbe) run() {
	defer w.s.wg.Done()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-w.s.closing:
			cancel()
		case <-ctx.Done():
		}
	}()
	log := w.s.logger
	fields := watermill.LogFields{"wake_probe_interval": w.interval.String(), "wake_probe_idle_interval": (WakeProbeIdleFactor * w.interval).String()}
	timer := time.NewTimer(w.interval)
	defer timer.Stop()
	var (
		target   int64
		resolved bool
		tr       = probeTracker{expire: w.s.cfg.PollInterval}
		failures int
		retryAt  time.Time
		wait     = w.interval
	)
	for {
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		if w.idle() {
			return
		}
		now := time.Now()
		wait = w.wait()
		if now.Before(retryAt) {
			wait = retryAt.Sub(now)
			continue
		}
		if resolved && w.busy() {
			continue
		}
		var err error
		if !resolved {
			var cache int64
			if target, cache, err = w.p.ProbeTarget(ctx, w.ex, w.s.t); err == nil {
				resolved = true
				log.Info("outbox: wake probe on: the relay claims within about one interval of any writer's commit (it probes the table's sequence; every idle interval after a second without writes)", fields)
				if cache > 1 {
					w.s.logWarn("outbox: the wake probe misses writes served from the sequence's cache (ALTER TABLE … ALTER COLUMN sequence SET CACHE 1); they wait for the next poll",
						fmt.Errorf("the table's sequence has CACHE %d", cache), nil)
				}
			}
		}
		var st dialect.ProbeState
		if err == nil {
			st, err = w.p.Probe(ctx, w.ex, target, tr.counter, tr.wantSnapshot())
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			failures++
			if failures == 1 {
				w.s.logWarn("outbox: wake probe failed; the relay polls every PollInterval until it works again", err, fields)
			}
			retryAt = now.Add(min(100*time.Millisecond<<min(failures-1, 10), maxProbeBackoff, w.s.cfg.PollInterval))
			wait = retryAt.Sub(now)
			tr.reset()
			continue
		}
		if failures > 0 {
			log.Info("outbox: wake probe works again", watermill.LogFields{"failed_probes": failures})
			failures = 0
			// Events may have been committed meanwhile: poll once.
			w.dispatch()
		}
		if tr.observe(st, now) {
			w.dispatch()
		}
		if tr.quiet(now, idleAfter) {
			wait = WakeProbeIdleFactor * w.interval
		}
	}
}

// maxPending caps how many transactions in progress a probeTracker watches.
const maxPending = 4096

// probeTracker decides from successive probes when the relay should claim. The sequence value
// is taken when a writer inserts, before it commits, so a new value alone is not enough: the
// events become claimable only when their transactions end. It therefore wakes the relay
//   - when the sequence moved (the writer may already have committed), and watches every
//     transaction in progress then (the backends' list, ProbeState.Running);
//   - on the probe after that (a writer that took its value but had no transaction id yet gets
//     one before its COMMIT: the transactions in progress then are watched too);
//   - whenever a watched transaction has ended (for a writer: its COMMIT or ROLLBACK; other
//     transactions' ends cost an empty claim), watching each for at most expire
//     (PollInterval: the poll covers it from then on).
//
// So an idle table costs one light probe per interval (the sequence only: no snapshot while no
// transaction is watched) and no claim, and a writer's commit is seen within about one interval
// however long its transaction stays open (up to expire).
type probeTracker struct {
	expire  time.Duration
	seen    bool
	counter int64
	after   bool // the last probe saw a change
	pending map[uint32]time.Time
	moved   time.Time // when the sequence last moved
}

func (t *probeTracker) reset() {
	t.seen, t.after = false, false
	clear(t.pending)
}

// wantSnapshot reports whether the next probe should read the snapshot and list the
// transactions in progress even if the sequence does not move: on the probe after a change, and
// while transactions are watched.
func (t *probeTracker) wantSnapshot() bool { return t.after || len(t.pending) > 0 }

// quiet reports whether the sequence has not moved for d and no transaction is watched.
func (t *probeTracker) quiet(now time.Time, d time.Duration) bool {
	return t.seen && !t.wantSnapshot() && now.Sub(t.moved) >= d
}

// ended reports whether transaction x has ended by the snapshot of st: it is below xmax
// (modulo 2^32) and not in progress.
func ended(x uint32, st *dialect.ProbeState) bool {
	if int32(x-st.Xmax) >= 0 {
		return false
	}
	_, inProgress := slices.BinarySearch(st.InProgress, x)
	return !inProgress
}

// observe takes one probe's reading at now and reports whether to wake the relay.
func (t *probeTracker) observe(st dialect.ProbeState, now time.Time) bool {
	if t.pending == nil {
		t.pending = map[uint32]time.Time{}
	}
	if !t.seen {
		// The first reading (or the first after a failure) is the baseline; the subscription
		// polls at its start (or after failed polls) anyway.
		t.seen, t.counter, t.moved = true, st.Counter, now
		return false
	}
	wake := false
	for x, since := range t.pending {
		if ended(x, &st) {
			delete(t.pending, x)
			wake = true
		} else if now.Sub(since) > t.expire {
			delete(t.pending, x)
		}
	}
	if t.after {
		t.after = false
		wake = true
		t.watch(st.Running, now)
	}
	if st.Counter != t.counter {
		t.counter, t.after, t.moved = st.Counter, true, now
		wake = true
		t.watch(st.Running, now)
	}
	return wake
}

func (t *probeTracker) watch(xids []uint32, now time.Time) {
	for _, x := range xids {
		if len(t.pending) >= maxPending {
			return
		}
		if _, ok := t.pending[x]; !ok {
			t.pending[x] = now
		}
	}
}

// announce advances the table's sequence after an operation made events claimable (a retry of
// dead letters, a purge that frees keys), so that probing relays claim at once. A failure only
// delays them until their next poll: it is logged at debug level.
func (s *Relay) announce(ctx context.Context) {
	p, ok := s.d.(dialect.WakeProber)
	if !ok {
		return
	}
	if err := p.Announce(ctx, s.db, s.t); err != nil {
		s.logger.Debug("outbox: could not wake the relays (they find the events at their next poll)", watermill.LogFields{"error": err.Error()})
	}
}

// WakeProbeIdleFactor: after a second without writes the wake probe runs every
// WakeProbeIdleFactor × Config.WakeProbeInterval until the next write.
const WakeProbeIdleFactor = 10
