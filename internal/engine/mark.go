package engine

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/watermill-outbox/outbox/internal/dialect"
)

// markSets is one mark statement's input: the sequences of each outcome, in parallel with
// their per-event values (failed: errs, perm, jitters; unavailable: notes).
type markSets struct {
	acked, released, unavailable, failed []int64
	abandoned                            []int64 // unanswered at a stop: released, the start uncounted
	held                                 []int64 // held before emission (see destinations.go)
	heldFor                              []int64 // per held: µs until due
	heldNotes                            []string
	notes, errs                          []string
	keep                                 []bool // per unavailable: keep delivery_starts (not attempted)
	perm                                 []bool
	jitters                              []float64
	eager                                bool // the batch was claimed eagerly (see eagerClaim)
}

// errText is the last_error form of err: valid UTF-8 without NUL (PostgreSQL text refuses it).
func errText(err error) string {
	return strings.ToValidUTF8(strings.ReplaceAll(err.Error(), "\x00", "\uFFFD"), "\uFFFD")
}

// mark writes the batch's outcome in one statement, conditioned on the fencing token: acks
// become published, failures a retry with backoff or a dead letter, releases give the lease
// back, unavailable events are released with last_error noted and no attempt counted. Acks
// already written by the flusher (see flushAcks) are skipped. It runs even while the
// subscriber is closing. unconfirmed holds the ordering keys of acks that were not written.
func (sub *subscription) mark(token string, items []*item) (unconfirmed map[string]bool, err error) {
	defer sub.lostReported.Delete(token) // the batch's last report
	var (
		m     markSets
		byseq = map[int64]*item{}
	)
	m.eager = len(items) > 0 && items[0].eager
	for _, it := range items {
		seq := it.ev.Sequence
		switch it.state {
		case stateAcked:
			if it.flushed == flushWritten {
				continue
			}
			if it.flushed == flushRefused {
				if k := it.ev.OrderingKey; k != "" {
					if unconfirmed == nil {
						unconfirmed = map[string]bool{}
					}
					unconfirmed[k] = true
				}
				continue
			}
			m.acked = append(m.acked, seq)
		case stateReleased:
			if it.notAttempted && it.err != nil && sub.ctx.Err() == nil {
				// Not attempted outside a stop (a dropped connection): released with
				// last_error noted and its start kept, so an event that always ends so (it
				// kills its connection) is dead-lettered by MaxDeliveryStarts instead of
				// being sent again without end and without backoff.
				m.unavailable = append(m.unavailable, seq)
				m.notes = append(m.notes, errText(it.err))
				m.keep = append(m.keep, true)
				break
			}
			m.released = append(m.released, seq)
		case stateUnavailable:
			m.unavailable = append(m.unavailable, seq)
			m.notes = append(m.notes, errText(it.err))
			m.keep = append(m.keep, false)
		case stateFailed:
			m.failed = append(m.failed, seq)
			m.errs = append(m.errs, errText(it.err))
			m.perm = append(m.perm, it.perm)
			m.jitters = append(m.jitters, 0.9+0.2*rand.Float64())
		case stateHeld:
			m.held = append(m.held, seq)
			m.heldFor = append(m.heldFor, it.holdFor.Microseconds())
			m.heldNotes = append(m.heldNotes, errText(it.err))
		case stateAbandoned:
			m.abandoned = append(m.abandoned, seq)
			continue
		default:
			continue
		}
		byseq[seq] = it
	}
	if len(byseq) == 0 && len(m.abandoned) == 0 {
		return unconfirmed, nil
	}
	results, err := sub.writeMarks(token, m)
	// The keys whose acks were not written: every key of the batch when the statement failed.
	written := make(map[int64]bool, len(results))
	if err == nil {
		for _, r := range results {
			written[r.Seq] = true
		}
	}
	for _, seq := range m.acked {
		if k := byseq[seq].ev.OrderingKey; k != "" && !written[seq] {
			if unconfirmed == nil {
				unconfirmed = map[string]bool{}
			}
			unconfirmed[k] = true
		}
	}
	if err != nil {
		return unconfirmed, fmt.Errorf("outbox: mark batch %s: %w", token, err)
	}
	if sub.lows != nil {
		sub.lows.noteWritten(items, func(it *item) bool {
			return it.state == stateAcked && (it.flushed == flushWritten || written[it.ev.Sequence])
		})
	}
	sub.leaseLost(token, len(byseq)-len(results))
	sub.reportMarks(results, byseq, false)
	return unconfirmed, nil
}

// writeMarks runs the dialect's mark statement with a 30 s bound, also while closing.
func (sub *subscription) writeMarks(token string, m markSets) (results []markResult, err error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(sub.ctx), 30*time.Second)
	defer cancel()
	began := time.Now()
	results, err = sub.relay.Mark(ctx, sub.s.db, &dialect.MarkParams{Token: token, Acked: m.acked, Released: m.released,
		Unavailable: m.unavailable, Failed: m.failed, Abandoned: m.abandoned, Notes: m.notes, Errs: m.errs, Keep: m.keep,
		Perm: m.perm, Jitters: m.jitters, Eager: m.eager, Held: m.held, HeldFor: m.heldFor, HeldNotes: m.heldNotes})
	if h := sub.s.hooks.OnMark; h != nil {
		h(MarkInfo{Events: len(m.acked) + len(m.released) + len(m.unavailable) + len(m.failed) + len(m.held), Duration: time.Since(began), Err: err})
	}
	return results, err
}

// leaseLost reports, once per batch, events whose marks the fencing refused: their lease had
// passed to another relay (it expired while they were out), which delivers them again.
func (sub *subscription) leaseLost(token string, n int) {
	if _, reported := sub.lostReported.Load(token); n == 0 || reported {
		return
	}
	sub.s.logWarn(fmt.Sprintf("outbox: lease lost: %d events were taken over by another relay; their outcome here was not recorded", n), ErrLeaseLost,
		watermill.LogFields{"token": token, "events": n})
	if h := sub.s.hooks.OnLeaseLost; h != nil {
		h(LeaseLostInfo{Token: token, Events: n})
	}
}

// reportMarks logs and calls the hooks for the rows a mark wrote; it runs after the
// connection went back to the pool. ackOnly: the rows are a flush's acks (whose items' state
// belongs to the delivering goroutines until the batch is over).
func (sub *subscription) reportMarks(results []markResult, byseq map[int64]*item, ackOnly bool) {
	s := sub.s
	for _, r := range results {
		it := byseq[r.Seq]
		ev := it.ev
		state := stateAcked
		if !ackOnly {
			state = it.state
		}
		switch state {
		case stateAcked:
			s.logger.Debug("outbox: delivered", watermill.LogFields{"event_id": it.id, "topic": ev.Topic})
			if h := s.hooks.OnDelivered; h != nil {
				h(DeliveredInfo{EventID: it.id, Topic: ev.Topic, Attempts: r.Attempts + 1, Delay: r.Now.Sub(ev.CreatedAt)})
			}
		case stateFailed:
			derr := s.host.DeliveryError(it.id, ev.Topic, it.err)
			info := FailedInfo{EventID: it.id, Topic: ev.Topic, Attempts: r.Attempts, Err: derr, At: r.Now}
			fields := watermill.LogFields{"event_id": it.id, "topic": ev.Topic, "attempts": r.Attempts}
			// The log line gives the event and topic as fields: its error is the cause alone
			// (derr would repeat them).
			logErr := derr
			if it.err != nil {
				logErr = it.err
			}
			if r.Dead {
				if it.perm {
					fields["permanent"] = true
				}
				s.logger.Error("outbox: dead-lettered", logErr, fields)
				if h := s.hooks.OnDeadLettered; h != nil {
					h(info)
				}
				continue
			}
			if r.Next != nil {
				info.NextAttemptAt = *r.Next
				fields["next_attempt_at"] = *r.Next
				sub.noteRetry(r.Now, *r.Next)
			}
			s.logWarn("outbox: delivery failed, will retry", logErr, fields)
			if h := s.hooks.OnFailed; h != nil {
				h(info)
			}
		case stateHeld:
			if r.Next != nil {
				sub.noteRetry(r.Now, *r.Next)
				if h := s.hooks.OnHeld; h != nil {
					h(HeldInfo{EventID: it.id, Topic: ev.Topic, Destination: it.dest, Reason: it.holdReason, Until: *r.Next})
				}
			}
		}
	}
}

// markResult is one row a mark wrote: the event's attempts and, for a failure, when it is tried
// next or whether it was dead-lettered, with the clock the mark used.
type markResult = dialect.MarkResult
