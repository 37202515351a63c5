package dialect

import (
	"slices"
	"time"
)

// FloorTracker keeps where a PostgreSQL claim's scans start (Capabilities.Floors): below the keyed
// floor every keyed event of the subscription's topics is published, dead-lettered, retrying
// (it has a next_attempt_at, and the claim's retry scans find it when due), or waiting behind a
// dead-lettered or retrying event of its key; the same for unordered events below the
// unordered floor. A claim then never steps over the index entries of the events published
// before the floors, which a long-open snapshot keeps from being removed.
//
// A floor moves up to the first event that holds it (ClaimResult.Floors: NextKeyed,
// NextUnordered), but never past a sequence a writer may still commit: the claim reports its
// snapshot's xmin, its own transaction id and the highest sequence it sees. Every event at or
// below that sequence that the snapshot does not see was written by a transaction whose id is
// lower than the claim's (the Publisher takes its transaction id before its identity values;
// the one that wrote the seen sequence committed before the snapshot), so once a later claim's
// snapshot has an xmin at or above the claim's id, every such writer has ended and that
// sequence is settled.
//
// The snapshot's xmin is the cluster's oldest running transaction, which may have nothing to do
// with the outbox (a long batch job, another database). When the oldest claim waiting to settle
// is older than SettleWait, the relay looks at the transactions holding a lock on the outbox
// table instead (CheckLocks): every writer of an unsettled sequence holds its table lock from
// before it drew the sequence until it ends, so once none of the transactions that held one at a
// first look is left at a later look, the claims recorded before the first look are settled.
type FloorTracker struct {
	Keyed, Unordered int64
	settled          int64 // every event up to this sequence is committed or rolled back
	points           []settlePoint
	// holders are the holders of the round's first look still there at the last look (nil: no
	// round started); the round covers the first covers points. looked is when the last look
	// was taken.
	holders []string
	covers  int
	looked  time.Time
}

// SettleWait is how long the oldest claim may wait to settle by xmin before the table's lock
// holders are looked at (see FloorTracker).
const SettleWait = 250 * time.Millisecond

// settlePoint is a claim's transaction id and the highest sequence its snapshot saw, and when.
type settlePoint struct {
	xid, maxSeq int64
	at          time.Time
}

// maxSettlePoints bounds the claims waiting to settle (while a writing transaction stays open,
// xmin does not move): the newest replaces the last, which only delays the floors.
const maxSettlePoints = 256

// Update moves the floors after a claim that reported r, at now.
func (f *FloorTracker) Update(r *FloorReport, now time.Time) {
	n := 0
	for n < len(f.points) && f.points[n].xid <= r.Xmin {
		n++
	}
	f.settle(n)
	if r.Xid > 0 && r.MaxSeq > f.settled {
		p := settlePoint{xid: r.Xid, maxSeq: r.MaxSeq, at: now}
		if len(f.points) >= maxSettlePoints {
			f.points[len(f.points)-1] = p
		} else {
			f.points = append(f.points, p)
		}
	}
	next := func(held int64) int64 {
		n := f.settled + 1
		if held > 0 && held < n {
			n = held
		}
		return n
	}
	f.Keyed, f.Unordered = next(r.NextKeyed), next(r.NextUnordered)
}

// settle marks the first n points settled.
func (f *FloorTracker) settle(n int) {
	for _, p := range f.points[:n] {
		f.settled = max(f.settled, p.maxSeq)
	}
	f.points = f.points[n:]
	f.covers = max(f.covers-n, 0)
}

// LookAtLocks reports whether the table's lock holders should be looked at now: the oldest
// claim waiting to settle is older than SettleWait, and the last look is too.
func (f *FloorTracker) LookAtLocks(now time.Time) bool {
	return len(f.points) > 0 && now.Sub(f.points[0].at) >= SettleWait && now.Sub(f.looked) >= SettleWait
}

// CheckLocks takes a look at the outbox table's lock holders (PostgreSQL virtual transaction
// ids), taken at now. The holders of the first look are waited for: once none of them is among
// a later look's holders, the claims recorded before that first look are settled, and the later
// look becomes the first of the next round (each transaction ends at some point, so every round
// ends, however many writers come and go meanwhile). The floors move at the next Update.
func (f *FloorTracker) CheckLocks(holders []string, now time.Time) {
	f.looked = now
	if f.holders != nil {
		var left []string
		for _, h := range f.holders {
			if slices.Contains(holders, h) {
				left = append(left, h)
			}
		}
		if len(left) > 0 {
			f.holders = left
			return
		}
		f.settle(min(f.covers, len(f.points)))
	}
	f.holders, f.covers = holders, len(f.points)
	if f.holders == nil {
		f.holders = []string{}
	}
}

// Lower sets the floors at most at keyed and unordered (0: unchanged).
func (f *FloorTracker) Lower(keyed, unordered int64) {
	if keyed > 0 && keyed < f.Keyed {
		f.Keyed = keyed
	}
	if unordered > 0 && unordered < f.Unordered {
		f.Unordered = unordered
	}
}
