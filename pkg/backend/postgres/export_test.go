package postgres

import "time"

// SetNow makes every decision of s happen at now() instead of the
// server's clock (the conformance tables move the time).
func (s *Store) SetNow(now func() time.Time) { s.now = now }
