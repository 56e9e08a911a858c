package memory

import "github.com/ratelimitd/ratelimitd/pkg/backend/stats"

// Stats are the Store's figures for metrics (stats.RegisterMemory).
func (s *Store) Stats() stats.Stats {
	sketched, refused := s.Approximated()
	return stats.Stats{Has: stats.FullHits, Sketched: sketched, Refused: refused}
}
