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
