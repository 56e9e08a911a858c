package memory_test

import (
	"context"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/algo/algotest"
	"github.com/ratelimitd/ratelimitd/pkg/backend/memory"
	"github.com/ratelimitd/ratelimitd/pkg/service"
)

var _ service.Resetter = (*memory.Store)(nil)

// Reset deletes a key's state (and its slot under MaxKeys): the next
// take starts from a full quota; other keys keep theirs.
func TestReset(t *testing.T) {
	now := time.Date(2026, 3, 14, 15, 9, 26, 0, time.UTC)
	s, err := memory.New(memory.Options{MaxKeys: 2, SweepInterval: -1, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Close() }()
	ctx := context.Background()
	for _, kind := range []algo.Kind{algo.FixedWindow, algo.SlidingWindow, algo.SlidingLog, algo.TokenBucket, algo.Concurrency} {
		l := algo.Limit{Kind: kind, Rate: 3, Period: time.Minute}
		a, b := algo.Hit{Key: "a", Limit: l, Cost: 3}, algo.Hit{Key: "b", Limit: l, Cost: 3}
		if d, err := algotest.Take(ctx, s, []algo.Hit{a, b}); err != nil || !d[0].Allowed || !d[1].Allowed {
			t.Fatalf("kind %d: first take %+v, %v", kind, d, err)
		}
		if err := s.Reset(ctx, []algo.Hit{a, {Key: "absent", Limit: l}}); err != nil {
			t.Fatal(err)
		}
		if s.Len() != 1 {
			t.Errorf("kind %d: %d keys after Reset, want 1", kind, s.Len())
		}
		d, err := algotest.Take(ctx, s, []algo.Hit{a})
		if err != nil || !d[0].Allowed || d[0].Remaining != 0 {
			t.Errorf("kind %d: take of the whole quota after Reset: %+v, %v", kind, d, err)
		}
		b.Cost = 1
		if d, err := algotest.Take(ctx, s, []algo.Hit{b}); err != nil || d[0].Allowed {
			t.Errorf("kind %d: a key not reset was reset: %+v, %v", kind, d, err)
		}
		_ = s.Reset(ctx, []algo.Hit{a, b})
	}
}
