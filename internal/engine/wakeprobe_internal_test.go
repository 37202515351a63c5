package engine

import (
	"testing"
	"time"

	"github.com/watermill-outbox/outbox/internal/dialect"
)

// TestProbeTracker: when the probe's readings wake the relay, and when it asks for the list of
// transactions in progress.
func TestProbeTracker(t *testing.T) {
	t0 := time.Unix(1000, 0)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	p := newProbeTrackerT(5 * time.Second)
	steps := []struct {
		counter    int64
		xmax       uint32
		inProgress []uint32
		running    []uint32 // what the probe listed (it lists when the counter moved or WantRunning)
		at         time.Time
		want       bool
		why        string
	}{
		{10, 100, []uint32{50}, nil, ms(0), false, "baseline"},
		{10, 100, []uint32{50}, nil, ms(5), false, "nothing changed"},
		// Writer 100 is above every completed transaction: the snapshot does not list it.
		{11, 100, []uint32{50}, []uint32{50, 100}, ms(10), true, "sequence moved"},
		{11, 101, []uint32{50, 100}, []uint32{50, 100, 101}, ms(15), true, "the probe after a change (101 started since: watched)"},
		{11, 102, []uint32{50, 100, 101}, nil, ms(20), false, "everyone still in progress"},
		{11, 102, []uint32{50, 101}, nil, ms(25), true, "writer 100 ended"},
		{11, 102, []uint32{50}, nil, ms(30), true, "101 ended"},
		{11, 102, []uint32{50}, nil, ms(35), false, "only 50 left, still in progress"},
		{11, 102, []uint32{50}, nil, ms(6000), false, "50 no longer watched after expire"},
		{11, 0, nil, nil, ms(6005), false, "50 ended, but it was dropped (no snapshot read)"},
		{12, 103, nil, []uint32{103}, ms(6010), true, "moved again, 103 in progress at or above xmax"},
		{12, 103, nil, []uint32{103}, ms(6015), true, "the probe after a change"},
		{12, 103, nil, nil, ms(6020), false, "103 still at or above xmax: in progress"},
		{12, 104, nil, nil, ms(6025), true, "103 below xmax and not listed: ended"},
		{12, 104, nil, nil, ms(6030), false, "idle"},
		// Transaction ids wrap around modulo 2^32.
		{13, 4294967295, nil, []uint32{4294967295}, ms(6035), true, "moved, writer at the top of the id space"},
		{13, 4294967295, nil, nil, ms(6040), true, "the probe after a change"},
		{13, 4294967295, nil, nil, ms(6045), false, "still in progress"},
		{13, 2, []uint32{1}, nil, ms(6050), true, "xmax wrapped past it: ended"},
	}
	for _, s := range steps {
		if got := p.Observe(s.counter, s.xmax, s.inProgress, s.running, s.at); got != s.want {
			t.Fatalf("%s: woke %v, want %v", s.why, got, s.want)
		}
		if s.why == "sequence moved" && !p.WantSnapshot() {
			t.Fatalf("after a change the next probe must read the snapshot")
		}
		if s.why == "idle" && (p.WantSnapshot() || p.Quiet(s.at, time.Second) || !p.Quiet(s.at.Add(time.Second), time.Second)) {
			t.Fatalf("idle: the next probe reads only the sequence; quiet a second after the last move")
		}
	}
}

// TestProbeSlowsAfterEmptyWakes: polls the probe starts that lease nothing (the writers write
// other topics) slow the probe down, doubling per empty poll beyond the first two, up to 8×
// the interval and never beyond the idle interval; one poll that leases resets it.
func TestProbeSlowsAfterEmptyWakes(t *testing.T) {
	const ms = time.Millisecond
	for _, c := range []struct {
		interval time.Duration
		leased   []bool
		want     time.Duration
	}{
		{5 * ms, nil, 5 * ms},
		{5 * ms, []bool{false, false}, 5 * ms},
		{5 * ms, []bool{false, true, false, true, false}, 5 * ms},
		{5 * ms, []bool{false, false, false}, 10 * ms},
		{5 * ms, []bool{false, false, false, false}, 20 * ms},
		{5 * ms, []bool{false, false, false, false, false, false, false, false, false}, 40 * ms},
		{5 * ms, []bool{false, false, false, false, false, true}, 5 * ms},
		{20 * ms, []bool{false, false, false, false, false, false}, 160 * ms},
		{40 * ms, []bool{false, false, false, false, false, false}, 320 * ms},
		{80 * ms, []bool{false, false, false, false, false, false}, 640 * ms},
		{100 * ms, []bool{false, false, false, false, false, false}, 800 * ms},
	} {
		if got := probeWaitT(c.interval, c.leased...); got != c.want {
			t.Errorf("interval %v after %v: wait %v, want %v", c.interval, c.leased, got, c.want)
		}
	}
}

// probeTrackerT is probeTracker with the test's Observe of one reading.
type probeTrackerT struct{ t probeTracker }

func newProbeTrackerT(expire time.Duration) *probeTrackerT {
	return &probeTrackerT{t: probeTracker{expire: expire}}
}

func (p *probeTrackerT) WantSnapshot() bool                        { return p.t.wantSnapshot() }
func (p *probeTrackerT) Quiet(now time.Time, d time.Duration) bool { return p.t.quiet(now, d) }

// Observe feeds a reading of the counter, the snapshot's xmax and list, and the backends'
// transactions (nil: not listed).
func (p *probeTrackerT) Observe(counter int64, xmax uint32, inProgress, running []uint32, now time.Time) bool {
	return p.t.observe(dialect.ProbeState{Counter: counter, Xmax: xmax, InProgress: inProgress, Running: running}, now)
}

// probeWaitT returns the wake probe's wait for interval after polls woken by it: each entry of
// leased says whether that poll leased events.
func probeWaitT(interval time.Duration, leased ...bool) time.Duration {
	w := &wakeProbe{interval: interval}
	for _, l := range leased {
		if l {
			w.workedWake()
		} else {
			w.emptyWake()
		}
	}
	return w.wait()
}
