package redis_test

import (
	"context"
	"testing"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/algo/algotest"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
	"github.com/ratelimitd/ratelimitd/pkg/service"
)

var _ service.Resetter = (*redis.Store)(nil)

// Reset deletes the state key of every algorithm and the over-limit
// cache entry: the next take starts from a full quota; keys not reset
// keep their state.
func TestReset(t *testing.T) {
	srv := redistest.Standalone(t)
	clk := newPinnedClock(epoch0)
	testReset(t, srv, newTestStore(t, srv, clk.Now, 16))
}

// TestResetWindowKeys is TestReset with Options.WindowKeys and the
// server's clock: Reset deletes the window key being counted.
func TestResetWindowKeys(t *testing.T) {
	srv := redistest.Standalone(t)
	testReset(t, srv, windowStore(t, srv, nil))
}

func testReset(t *testing.T, srv *redistest.Server, s *redis.Store) {
	ctx := context.Background()
	for _, l := range allKinds() {
		t.Run(kindName(l), func(t *testing.T) {
			hit := algo.Hit{Key: "reset." + kindName(l), Limit: l, Cost: 3}
			other := algo.Hit{Key: "keep." + kindName(l), Limit: l, Cost: 3}
			for _, h := range []algo.Hit{hit, other} {
				if d, err := algotest.Take(ctx, s, []algo.Hit{h}); err != nil || !d[0].Allowed {
					t.Fatalf("first take %s: %+v, %v", h.Key, d, err)
				}
			}
			one := hit
			one.Cost = 1
			for range 2 { // denied: the second denial may come from the cache
				if d, err := algotest.Take(ctx, s, []algo.Hit{one}); err != nil || d[0].Allowed {
					t.Fatalf("take after exhausting: %+v, %v", d, err)
				}
			}
			if err := s.Reset(ctx, []algo.Hit{hit}); err != nil {
				t.Fatal(err)
			}
			if n := srv.Client().Exists(ctx, hit.Key).Val(); n != 0 {
				t.Errorf("key %s still exists after Reset", hit.Key)
			}
			d, err := algotest.Take(ctx, s, []algo.Hit{hit})
			if err != nil || !d[0].Allowed || d[0].Remaining != 0 {
				t.Errorf("take of the whole quota after Reset: %+v, %v", d, err)
			}
			one = other
			one.Cost = 1
			if d, err := algotest.Take(ctx, s, []algo.Hit{one}); err != nil || d[0].Allowed {
				t.Errorf("a key not reset was reset: %+v, %v", d, err)
			}
		})
	}
	if err := s.Reset(ctx, []algo.Hit{{Key: "never.stored", Limit: allKinds()[0]}}); err != nil {
		t.Errorf("Reset of an absent key: %v", err)
	}
}
