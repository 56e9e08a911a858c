package postgres

import (
	"context"
	"time"
)

// UnhealthyProbeInterval is the period of the health probe and the
// connect loop while the Store is not healthy.
const UnhealthyProbeInterval = unhealthyProbeInterval

// SetNow makes every decision of s happen at now() instead of the
// server's clock (the conformance tables move the time).
func (s *Store) SetNow(now func() time.Time) { s.now = now }

// Setting is the value of the run-time parameter name in a session of
// s's pool (SHOW).
func (s *Store) Setting(ctx context.Context, name string) (string, error) {
	var v string
	err := s.pool.QueryRow(ctx, "SHOW "+name).Scan(&v)
	return v, err
}

// SetBeforeCommit makes f run before every batch's COMMIT.
func (s *Store) SetBeforeCommit(f func()) { s.beforeCommit = f }

// Reconciling is how many transactions of s whose COMMIT's reply did not
// come are still being reconciled.
func (s *Store) Reconciling() int64 { return s.reconciling.Load() }

// Refunded is how many takes s refunded after their transaction
// committed while their callers were answered with a timeout.
func (s *Store) Refunded() uint64 { return s.refunded.Load() }

// InLanes is how many calls of s are in a batch in flight or queued
// behind one.
func (s *Store) InLanes() int {
	s.lanesMu.Lock()
	defer s.lanesMu.Unlock()
	n := 0
	for _, l := range s.lanes {
		n += len(l.queue) + l.inFlight
	}
	return n
}
