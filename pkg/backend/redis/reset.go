package redis

import (
	"context"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// Reset deletes the state key of every hit (service.Resetter) with UNLINK,
// with its window keys when Options.WindowKeys, and drops its over-limit
// cache entry: the next Take on it starts from a full quota. Standalone
// and Sentinel send one UNLINK; Cluster one per key, since keys may lie in
// different slots, and calls before a failed one stay done. Each call runs
// under the circuit breaker and Options.Timeout; errors are classified.
func (s *Store) Reset(ctx context.Context, hits []algo.Hit) error {
	if len(hits) == 0 {
		return nil
	}
	keys := make([]string, 0, len(hits))
	for _, h := range hits {
		keys = append(keys, h.Key)
		if s.windowKeys && windowKind(&h) {
			// Window keys: the window of the server's now (as estimated)
			// and its neighbours, so that an estimate off by up to a
			// window still finds the one being counted.
			at := s.nowUS()
			if at < 0 {
				at = s.masterFor(ctx, h.Key).clock.estimate()
			}
			p := h.Limit.Period.Microseconds()
			ws := at - (at%p+p)%p
			keys = append(keys, windowKey(h.Key, ws-p), windowKey(h.Key, ws), windowKey(h.Key, ws+p))
		}
		if s.windowKeys && leanKind(&h) {
			// Lean keys: a token bucket's key; a sliding window's keys of
			// the windows around the server's now (as estimated), the
			// previous one included, which the current one reads.
			at := s.nowUS()
			if at < 0 {
				at = s.masterFor(ctx, h.Key).clock.estimate()
			}
			p := h.Limit.Period.Microseconds()
			keys = append(keys, leanKeys(&h, at)...)
			if h.Limit.Kind == algo.SlidingWindow {
				keys = append(keys, leanKeys(&h, at-p)[1], leanKeys(&h, at+p)[0])
			}
		}
		s.cache.Remove(h.Key)
	}
	unlink := func(b *Breaker, ks ...string) error {
		return b.Do(ctx, s.timeout, func(ctx context.Context) error {
			return s.client.Unlink(ctx, ks...).Err()
		})
	}
	var err error
	if !s.cluster {
		err = unlink(s.breaker, keys...)
	} else {
		for _, k := range keys {
			if err = unlink(s.masterFor(ctx, k).breaker, k); err != nil {
				break
			}
		}
	}
	for _, h := range hits { // a denial cached meanwhile
		s.cache.Remove(h.Key)
	}
	s.publishCredits(hits, func(algo.Hit) bool { return true })
	return err
}
