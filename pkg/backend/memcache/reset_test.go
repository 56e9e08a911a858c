package memcache_test

import (
	"context"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/backend/memcache"
	"github.com/ratelimitd/ratelimitd/pkg/backend/memcache/memcachetest"
	"github.com/ratelimitd/ratelimitd/pkg/service"
)

var _ service.Resetter = (*memcache.Store)(nil)

// Reset deletes the counter of the window in progress: the next take
// starts from a full quota; other keys keep their counts.
func TestReset(t *testing.T) {
	srv := memcachetest.Start(t)
	clk := newPinned(time.Date(2026, 3, 14, 15, 9, 26, 0, time.UTC))
	s := newStore(t, []string{srv.Addr()}, clk.Now)
	l := algo.Limit{Kind: algo.FixedWindow, Rate: 3, Period: time.Minute}
	k, keep := uniq(t), uniq(t)+".keep"
	take(t, s, algo.Hit{Key: k, Limit: l, Cost: 3}, algo.Hit{Key: keep, Limit: l, Cost: 3})
	if d := take(t, s, algo.Hit{Key: k, Limit: l, Cost: 1}); d[0].Allowed {
		t.Fatalf("exhausted counter allowed: %+v", d)
	}
	if err := s.Reset(context.Background(), []algo.Hit{{Key: k, Limit: l}}); err != nil {
		t.Fatal(err)
	}
	if d := take(t, s, algo.Hit{Key: k, Limit: l, Cost: 3}); !d[0].Allowed || d[0].Remaining != 0 {
		t.Errorf("take of the whole quota after Reset: %+v", d)
	}
	if d := take(t, s, algo.Hit{Key: keep, Limit: l, Cost: 1}); d[0].Allowed {
		t.Errorf("a key not reset was reset: %+v", d)
	}
	if err := s.Reset(context.Background(), []algo.Hit{{Key: uniq(t) + ".absent", Limit: l}}); err != nil {
		t.Errorf("Reset of an absent counter: %v", err)
	}
}
