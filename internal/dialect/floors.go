package dialect

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
type FloorTracker struct {
	Keyed, Unordered int64
	settled          int64 // every event up to this sequence is committed or rolled back
	points           []settlePoint
}

// settlePoint is a claim's transaction id and the highest sequence its snapshot saw.
type settlePoint struct{ xid, maxSeq int64 }

// maxSettlePoints bounds the claims waiting to settle (while a writing transaction stays open,
// xmin does not move): the newest replaces the last, which only delays the floors.
const maxSettlePoints = 256

// Update moves the floors after a claim that reported r.
func (f *FloorTracker) Update(r *FloorReport) {
	for len(f.points) > 0 && f.points[0].xid <= r.Xmin {
		f.settled = max(f.settled, f.points[0].maxSeq)
		f.points = f.points[1:]
	}
	if r.Xid > 0 && r.MaxSeq > f.settled {
		p := settlePoint{xid: r.Xid, maxSeq: r.MaxSeq}
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

// Lower sets the floors at most at keyed and unordered (0: unchanged).
func (f *FloorTracker) Lower(keyed, unordered int64) {
	if keyed > 0 && keyed < f.Keyed {
		f.Keyed = keyed
	}
	if unordered > 0 && unordered < f.Unordered {
		f.Unordered = unordered
	}
}
