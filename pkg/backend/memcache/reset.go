package memcache

import (
	"context"
	"errors"
	"fmt"

	gomemcache "github.com/bradfitz/gomemcache/memcache"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// Reset deletes, for every hit, the counter of the window in progress
// (CounterKey of the hit's Key and the window start at the Store's
// clock) with one DELETE each (service.Resetter): the next Take on it
// starts from a full quota; its local over-limit cache entry is dropped
// too. A counter that does not exist is skipped.
// Errors are classified (*Error with a Cause); deletes before a failed
// one stay done.
func (s *Store) Reset(ctx context.Context, hits []algo.Hit) error {
	nowUs := s.now().UnixMicro()
	for _, h := range hits {
		s.cache.Remove(h.Key)
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("memcache: reset: %w", err)
		}
		st, _ := algo.WindowBoundsUs(h.Limit, nowUs)
		err := s.client.Delete(CounterKey(h.Key, st))
		if err != nil && !errors.Is(err, gomemcache.ErrCacheMiss) {
			err = Classify(err)
			s.note(err)
			return err
		}
	}
	return nil
}
