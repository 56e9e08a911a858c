package redis

import (
	"context"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// Reset deletes the state key of every hit (service.Resetter) with
// UNLINK, and its over-limit cache entry: the next Take on it starts from
// a full quota. Standalone and Sentinel: one UNLINK for all keys; Cluster:
// one per key (keys of one request may lie in different slots). Each call
// runs under the circuit breaker (Cluster: the key's master's) and
// Options.Timeout; errors are
// classified (*Error with a Cause). Cluster calls before a failed one
// stay done.
func (s *Store) Reset(ctx context.Context, hits []algo.Hit) error {
	if len(hits) == 0 {
		return nil
	}
	keys := make([]string, len(hits))
	for i, h := range hits {
		keys[i] = h.Key
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
	for _, k := range keys { // a denial cached meanwhile
		s.cache.Remove(k)
	}
	s.publishCredits(hits, func(algo.Hit) bool { return true })
	return err
}
