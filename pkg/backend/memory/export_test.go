package memory

// Work returns the keys dropped by eviction or the sweep and the shard
// earliest expiries read to find expired keys, since New.
func (s *Store) Work() (evicted, scanned int64) { return s.evicted.Load(), s.scanned.Load() }
