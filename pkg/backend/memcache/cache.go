// The local over-limit cache's counters and reset (overlimit.Cache).

package memcache

// CacheHits is the number of local over-limit cache lookups that found a
// denial since the Store was created (envoyproxy/ratelimit's
// ratelimit.localcache.hitCount; 0 when the cache is disabled).
func (s *Store) CacheHits() uint64 { return s.cache.Hits() }

// CacheMisses is the number of local over-limit cache lookups that found
// no denial (envoyproxy/ratelimit's ratelimit.localcache.missCount; 0
// when the cache is disabled).
func (s *Store) CacheMisses() uint64 { return s.cache.Misses() }

// CacheEnabled reports whether the local over-limit cache is on
// (Options.LocalCacheSize > 0).
func (s *Store) CacheEnabled() bool { return s.cache != nil }

// ResetCache drops every entry of the local over-limit cache. Call it on a
// config reload so that no denial computed under an old limit survives.
func (s *Store) ResetCache() { s.cache.Reset() }
