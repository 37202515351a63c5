package wal

import (
	"context"
	"time"

	"github.com/ThreeDotsLabs/watermill"
)

// Stats is a Source's state: totals since New and the slot's last statistics (read every
// StatusInterval while a session runs).
type Stats struct {
	// Delivered, Parked and Retries count changes published to the destination, changes
	// parked in the outbox table, and failed Publish calls that were retried.
	Delivered, Parked, Retries uint64
	// ConfirmedLSN is the position confirmed to the server (delivered or parked up to it).
	ConfirmedLSN uint64
	// Slot is the slot's last status (LagBytes, RetainedBytes…).
	Slot SlotStatus
	// LagSeconds is the age of the oldest committed change not yet delivered or parked; 0
	// when none is pending.
	LagSeconds float64
	// OverBound: the retained WAL is over MaxRetainedWAL and changes are parked without trying
	// the destination.
	OverBound bool
	// Connected: a replication session is streaming.
	Connected bool
	// Fallbacks counts the lost slots after which an OutboxRelay delivered from the outbox
	// table by polling; FromTable is true while it does (0 and false for a Source of captured
	// tables).
	Fallbacks uint64
	FromTable bool
}

// Stats returns the source's current Stats.
func (s *Source) Stats() Stats {
	st := Stats{Delivered: s.delivered.Load(), Parked: s.parked.Load(), Retries: s.retries.Load(),
		ConfirmedLSN: s.confirmed.Load(), OverBound: s.overBound.Load(), Connected: s.connected.Load(),
		Fallbacks: s.fallbacks.Load(), FromTable: s.fromTable.Load()}
	s.mu.Lock()
	st.Slot = s.slot
	if len(s.pending) > 0 {
		st.LagSeconds = time.Since(s.pending[0]).Seconds()
	}
	s.mu.Unlock()
	return st
}

// watch reads the slot's statistics every StatusInterval, applies MaxRetainedWAL, and sends
// a heartbeat (pg_logical_emit_message, not transactional) every Heartbeat while nothing is in
// flight, so an idle captured table does not hold the slot back while other tables are
// written.
func (s *Source) watch(ctx context.Context) {
	tick := time.NewTicker(s.cfg.StatusInterval)
	defer tick.Stop()
	lastBeat := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if st, err := Status(ctx, s.pool, s.cfg.Slot); err == nil {
			s.mu.Lock()
			s.slot = st
			s.mu.Unlock()
			s.bound(st)
		}
		if s.cfg.Heartbeat > 0 && time.Since(lastBeat) >= s.cfg.Heartbeat && s.inflight.Load() == 0 {
			lastBeat = time.Now()
			if _, err := s.pool.Exec(ctx, `SELECT pg_logical_emit_message(false, 'outbox_wal_heartbeat', '')`); err != nil && ctx.Err() == nil {
				s.cfg.Logger.Error("wal: heartbeat", err, watermill.LogFields{"slot": s.cfg.Slot})
			}
		}
	}
}

// bound applies MaxRetainedWAL to a slot status.
func (s *Source) bound(st SlotStatus) {
	limit := s.cfg.MaxRetainedWAL
	if limit <= 0 {
		return
	}
	switch {
	case st.RetainedBytes > limit && !s.overBound.Load():
		s.overBound.Store(true)
		s.cfg.Logger.Error("wal: retained WAL over MaxRetainedWAL; parking every change in the outbox table until it is back under 3/4 of the bound", nil,
			watermill.LogFields{"slot": s.cfg.Slot, "retained_bytes": st.RetainedBytes, "bound": limit})
	case st.RetainedBytes <= limit*3/4 && s.overBound.Load():
		s.overBound.Store(false)
		s.cfg.Logger.Info("wal: retained WAL back under the bound; delivering to the destination again", watermill.LogFields{"slot": s.cfg.Slot, "retained_bytes": st.RetainedBytes})
	}
}
