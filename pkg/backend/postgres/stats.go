package postgres

import "github.com/ratelimitd/ratelimitd/pkg/backend/stats"

// Stats are the Store's figures for metrics (stats.RegisterDurable).
func (s *Store) Stats() stats.Stats {
	return stats.Stats{
		Has:          stats.Durable,
		BreakerState: s.BreakerState(), Healthy: s.Healthy(),
		Swept: s.Swept(), SweepErrors: s.SweepErrors(),
	}
}
