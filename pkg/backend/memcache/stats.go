package memcache

import "github.com/ratelimitd/ratelimitd/pkg/backend/stats"

// Stats are the Store's figures for metrics (stats.RegisterBackend).
func (s *Store) Stats() stats.Stats {
	return stats.Stats{
		Has:          stats.Breaker | stats.Cache | stats.RefundFailures,
		BreakerState: s.BreakerState(),
		CacheEnabled: s.CacheEnabled(), CacheHits: s.CacheHits(), CacheMisses: s.CacheMisses(),
		RefundFailures: s.RefundFailures(),
	}
}
