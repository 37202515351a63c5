package outbox

import (
	"fmt"
	"strings"

	"github.com/watermill-outbox/outbox/internal/dialect"
)

// The simulation's checker: the invariants a run must keep, read from the world's log and the
// table's final rows. Each problem names its invariant: (a) nothing lost, (b) per-key order,
// (c) duplicates only after a kill, a lost lease or a failed mark, (d) attempts counted from
// failure answers only, (e) dead letters only at MaxAttempts, a permanent answer or
// MaxDeliveryStarts, (f) a killed relay's leases taken back by its successor, (g) with an
// event that kills every relay delivering it, only that event dead-lettered as poison.

// simCheck returns the run's problems (none: it passed).
func simCheck(w *simWorld, runErr error) []string {
	var out []string
	bad := func(format string, args ...any) { out = append(out, fmt.Sprintf(format, args...)) }
	if runErr != nil {
		bad("run: %v", runErr)
	}
	cfg := w.p.cfg
	rows := w.db.Rows()
	w.mu.Lock()
	log := append([]simEntry(nil), w.log...)
	gens := append([]*simGen(nil), w.gens...)
	held := append([]*simHeld(nil), w.held...)
	w.mu.Unlock()

	// (a) Every event ends published or dead-lettered (or waits behind its key's dead letter).
	inserted := 0
	for _, e := range log {
		if e.kind == simInsert {
			inserted++
		}
	}
	if inserted != len(rows) {
		bad("(a) %d events inserted, %d rows in the table", inserted, len(rows))
	}
	for _, s := range simUnsettled(rows) {
		bad("(a) event %d ends neither published nor dead-lettered", s)
	}

	claims := map[string]simEntry{} // token/seq → the claim
	claimsBySeq := map[int64][]simEntry{}
	emits := map[int64][]simEntry{}
	answers := map[int64][]simEntry{}
	attempts := map[int64]int{}
	for _, e := range log {
		switch e.kind {
		case simClaim:
			claims[e.token+"/"+fmt.Sprint(e.seq)] = e
			claimsBySeq[e.seq] = append(claimsBySeq[e.seq], e)
		case simEmit:
			emits[e.seq] = append(emits[e.seq], e)
		case simAnswer:
			answers[e.seq] = append(answers[e.seq], e)
		}
	}
	// lastBefore returns the last entry of es by gen g strictly between from and to.
	lastBefore := func(es []simEntry, g, from, to int) (simEntry, bool) {
		var found simEntry
		ok := false
		for _, e := range es {
			if e.gen == g && e.i > from && e.i < to {
				found, ok = e, true
			}
		}
		return found, ok
	}

	// lastOfLease returns the last entry of es of the lease claimed by c, before to.
	lastOfLease := func(es []simEntry, c simEntry, to int) (simEntry, bool) {
		var found simEntry
		ok := false
		for _, e := range es {
			if e.token == c.token && e.i > c.i && e.i < to {
				found, ok = e, true
			}
		}
		return found, ok
	}

	// (d) Each mark writes what its delivery's answer called for; attempts count the failure
	// answers (ordinary, permanent, DeliveryTimeout) whose marks were written, and the
	// poison dead letters (MaxDeliveryStarts), and nothing else.
	for _, m := range log {
		if m.kind != simMark {
			continue
		}
		c, ok := claims[m.token+"/"+fmt.Sprint(m.seq)]
		if !ok {
			bad("(d) mark without a claim: %v", m)
			continue
		}
		// The delivery of this lease, by its token (a relay whose lease was lost may still
		// deliver its older copy beside a newer lease of the same event).
		ans, answered := lastOfLease(answers[m.seq], c, m.i)
		_, emitted := lastOfLease(emits[m.seq], c, m.i)
		poison := c.ds > cfg.MaxDeliveryStarts
		var want []string
		switch {
		case answered:
			want = map[string][]string{simAck: {markAcked, markReleased}, simFail: {markFailed}, simSilent: {markFailed},
				simPerm: {markPerm}, simUnavailable: {markUnavailable, markHeld}, simNotAttempted: {markNotAttempt}}[ans.what]
		case emitted:
			want = []string{markReleased}
		case poison:
			// Dead-lettered, or released behind its key's earlier poison event.
			want = []string{markPerm, markReleased}
		default:
			// Not emitted: released, or held for its destination (an outage, a rate limit).
			want = []string{markReleased, markHeld}
		}
		if !contains(want, m.what) {
			what := "no answer"
			if answered {
				what = "answer " + ans.what
			}
			bad("(d) mark %s after %s (want %s): %v", m.what, what, strings.Join(want, " or "), m)
		}
		if m.what == markFailed || m.what == markPerm {
			attempts[m.seq]++
		}
		// (g) In a seed with a poison event, only it is dead-lettered as poison: the events
		// that were out with it when it killed their relay are not.
		if w.p.poison != 0 && m.what == markPerm && !answered && m.seq != w.p.poison {
			bad("(g) event %d dead-lettered as poison, but only event %d kills its relay: %v", m.seq, w.p.poison, m)
		}
	}
	for _, r := range rows {
		if r.Attempts != attempts[r.Sequence] {
			bad("(d) event %d: attempts %d in the table, %d failures marked from the answers", r.Sequence, r.Attempts, attempts[r.Sequence])
		}
		// (e) Dead letters only at MaxAttempts, a permanent answer or poison (checked by (d)).
		dead := !r.DeadLetteredAt.IsZero()
		switch {
		case dead && r.LastErrorClass == dialect.ClassPermanent:
		case dead && r.LastErrorClass == dialect.ClassFailure && r.Attempts >= cfg.MaxAttempts:
		case dead:
			bad("(e) event %d dead-lettered with %d attempts of %d, class %q", r.Sequence, r.Attempts, cfg.MaxAttempts, r.LastErrorClass)
		case r.Attempts >= cfg.MaxAttempts:
			bad("(e) event %d has %d attempts of %d and is not dead-lettered", r.Sequence, r.Attempts, cfg.MaxAttempts)
		}
	}

	// (b) A keyed event is first delivered only after every earlier event of its key was
	// acked (so first deliveries come in sequence order).
	byKey := map[string][]int64{}
	keyOf := map[int64]string{}
	for _, r := range rows {
		if r.OrderingKey != nil {
			byKey[*r.OrderingKey] = append(byKey[*r.OrderingKey], r.Sequence)
			keyOf[r.Sequence] = *r.OrderingKey
		}
	}
	firstAck := func(seq int64) int {
		for _, a := range answers[seq] {
			if a.what == simAck {
				return a.i
			}
		}
		return len(log)
	}
	for k, seqs := range byKey {
		for i := 1; i < len(seqs); i++ {
			if es := emits[seqs[i]]; len(es) > 0 && firstAck(seqs[i-1]) > es[0].i {
				bad("(b) key %s: event %d first delivered (%v) before event %d was acked", k, seqs[i], es[0], seqs[i-1])
			}
		}
	}

	// (c) An acked event is delivered again only when the relay that had it acked, or the
	// one delivering it again, was disturbed: killed, a lease lost, a failed mark (at any
	// time in that relay's life: a mark that failed before the claim leaves the continuation
	// acks of its keys unconfirmed, and a lease is found lost only at the next renewal or
	// mark), a failed renewal after its claim, or its leases taken back by a relay of its
	// name after its claim (two live relays sharing a RelayName).
	disturbed := func(g, claimed int) bool {
		for _, e := range log {
			switch {
			case e.gen == g && (e.kind == simKill || e.kind == simLeaseLost || e.kind == simFault && strings.HasPrefix(e.what, "mark")):
				return true
			case e.gen == g && e.i > claimed && e.kind == simFault && strings.HasPrefix(e.what, "renew"):
				return true
			case e.kind == simTakeBack && e.i > claimed && e.gen != g && gens[e.gen].name == gens[g].name:
				return true
			}
		}
		return false
	}
	for seq, es := range emits {
		var acks []simEntry
		for _, e := range es {
			for _, a := range acks {
				ca, _ := lastBefore(claimsBySeq[seq], a.gen, -1, a.i)
				ce, _ := lastBefore(claimsBySeq[seq], e.gen, -1, e.i)
				if !disturbed(a.gen, ca.i) && !disturbed(e.gen, ce.i) {
					bad("(c) event %d delivered again (%v) after an ack (%v) with no kill, lost lease or failed mark", seq, e, a)
				}
			}
			for _, a := range answers[seq] {
				if a.what == simAck && a.i < e.i && !containsEntry(acks, a) {
					acks = append(acks, a)
				}
			}
		}
	}

	// (f) A killed relay's successor (the same RelayName) takes its leases back when it
	// starts: simRetakeBound after that, none of the events the killed relay held is still
	// leased under its tokens (they would otherwise wait for LeaseDuration).
	for _, h := range held {
		if h.checked && len(h.stuck) > 0 {
			bad("(f) events %v, held by gen %d when it was killed at %s, were still leased under its tokens %s after its successor started",
				h.stuck, h.killed.id, h.at.Format("15:04:05.000"), simRetakeBound(cfg))
		}
	}
	return out
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

func containsEntry(es []simEntry, x simEntry) bool {
	for _, e := range es {
		if e.i == x.i {
			return true
		}
	}
	return false
}

// simReport formats the first problems of a run.
func simReport(problems []string) string {
	if len(problems) > 12 {
		problems = append(problems[:12:12], fmt.Sprintf("… and %d more", len(problems)-12))
	}
	return strings.Join(problems, "\n")
}
