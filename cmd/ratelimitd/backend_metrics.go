package main

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimitd/ratelimitd/pkg/backend/stats"
	"github.com/ratelimitd/ratelimitd/pkg/telemetry/statsd"
)

// statser is a store that reports its figures for metrics (stats.Stats).
type statser interface{ Stats() stats.Stats }

// registerBackendMetrics registers the backend store's metrics (none for
// a store without figures).
func registerBackendMetrics(reg prometheus.Registerer, store any) error {
	if s, ok := store.(statser); ok {
		return stats.RegisterBackend(reg, s.Stats)
	}
	return nil
}

// registerDurableMetrics registers the durable store's metrics.
func registerDurableMetrics(reg prometheus.Registerer, store any) error {
	if s, ok := store.(statser); ok {
		return stats.RegisterDurable(reg, s.Stats)
	}
	return nil
}

// registerMemoryMetrics registers the full-store hits of the in-memory
// stores: the backend's and the Redis or memcached fallback's.
func registerMemoryMetrics(reg prometheus.Registerer, backend, fallback any) error {
	for _, st := range []struct {
		name string
		s    any
	}{{"backend", backend}, {"fallback", fallback}} {
		if s, ok := st.s.(statser); ok {
			if err := stats.RegisterMemory(reg, st.name, s.Stats); err != nil {
				return err
			}
		}
	}
	return nil
}

// Gauge names of envoyproxy/ratelimit's local cache stats (its freecache's
// counters, under "ratelimit.localcache").
const (
	refLocalCacheHits    = "ratelimit.localcache.hitCount"
	refLocalCacheMisses  = "ratelimit.localcache.missCount"
	refLocalCacheLookups = "ratelimit.localcache.lookupCount"
)

// addLocalCacheStats sends the store's local over-limit cache lookups as
// envoyproxy/ratelimit's gauges when statsd is on and the cache is.
func addLocalCacheStats(sc *statsd.Client, store any) {
	s, ok := store.(statser)
	if sc == nil || !ok || s.Stats().Has&stats.Cache == 0 || !s.Stats().CacheEnabled {
		return
	}
	hits, misses, lookups := sc.Gauge(refLocalCacheHits), sc.Gauge(refLocalCacheMisses), sc.Gauge(refLocalCacheLookups)
	sc.AddGenerator(func() {
		st := s.Stats()
		hits.Set(st.CacheHits)
		misses.Set(st.CacheMisses)
		lookups.Set(st.CacheHits + st.CacheMisses)
	})
}
