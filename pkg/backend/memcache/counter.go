// The memcached operations on one counter: GET, INCR (ADD when absent), DECR.

package memcache

import (
	"errors"
	"strconv"
	"strings"

	gomemcache "github.com/bradfitz/gomemcache/memcache"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
)

// decr subtracts n from a counter (memcached floors it at 0) and returns
// its new value; an absent counter stays absent (0).
func (s *Store) decr(key string, n int64) (int64, error) {
	v, err := s.client.Decrement(key, uint64(n))
	if errors.Is(err, gomemcache.ErrCacheMiss) {
		return 0, nil
	}
	if err != nil {
		return 0, Classify(err)
	}
	return int64(min(v, uint64(algo.MaxExact))), nil
}

// get reads a counter (0 when absent).
func (s *Store) get(key string) (int64, error) {
	it, err := s.client.Get(key)
	if errors.Is(err, gomemcache.ErrCacheMiss) {
		return 0, nil
	}
	if err != nil {
		return 0, Classify(err)
	}
	n, err := strconv.ParseUint(strings.TrimSpace(string(it.Value)), 10, 64)
	if err != nil {
		return 0, newError(CauseOther, false, errors.New("counter value is not a number"))
	}
	return int64(min(n, uint64(algo.MaxExact))), nil
}

// incr adds cost to a counter atomically and returns its new value: INCR,
// or ADD with the expiration when the counter does not exist, or INCR
// again when another caller's ADD won the race.
func (s *Store) incr(key string, cost int64, exp int32) (int64, error) {
	for range 3 {
		v, err := s.client.Increment(key, uint64(cost))
		if err == nil {
			return int64(min(v, uint64(algo.MaxExact))), nil
		}
		if !errors.Is(err, gomemcache.ErrCacheMiss) {
			return 0, Classify(err)
		}
		err = s.client.Add(&gomemcache.Item{Key: key, Value: []byte(strconv.FormatInt(cost, 10)), Expiration: exp})
		if err == nil {
			return cost, nil
		}
		if !errors.Is(err, gomemcache.ErrNotStored) {
			return 0, Classify(err)
		}
		// Another caller created it first: INCR again.
	}
	return 0, newError(CauseOther, false, errors.New("counter vanished between ADD and INCR three times"))
}
