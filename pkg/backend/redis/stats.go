package redis

import "github.com/ratelimitd/ratelimitd/pkg/backend/stats"

// Stats are the Store's figures for metrics (stats.RegisterBackend).
func (s *Store) Stats() stats.Stats {
	return stats.Stats{
		Has:          stats.Breaker | stats.Cache | stats.ClusterRefunds | stats.Credits | stats.MasterChanges,
		BreakerState: s.BreakerState(),
		CacheEnabled: s.CacheEnabled(), CacheHits: s.CacheHits(), CacheMisses: s.CacheMisses(),
		ClusterRefundErrors: s.RefundErrors(),
		CreditsLive:         s.CreditsLive(), CreditPublishErrors: s.CreditPublishErrors(),
		MasterChanges: s.MasterChanges(),
	}
}
