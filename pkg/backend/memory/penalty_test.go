package memory_test

import (
	"context"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/algo/algotest"
	"github.com/ratelimitd/ratelimitd/pkg/backend/memory"
)

// TestPenaltyConcurrent: 400 requests at one instant on a key admitting
// 5, with a penalty box of 3 denials: exactly 5 admitted, 2 denied by the
// limit, 1 block started and the other 392 blocked, on every kind.
func TestPenaltyConcurrent(t *testing.T) {
	at := time.Date(2026, 1, 1, 0, 0, 30, 0, time.UTC)
	for _, k := range []algo.Kind{algo.FixedWindow, algo.SlidingWindow, algo.SlidingLog, algo.TokenBucket} {
		s := newStore(t, memory.Options{Shards: 4, Now: func() time.Time { return at }})
		h := algo.Hit{Key: "k", Cost: 1,
			Limit:   algo.Limit{Kind: k, Rate: 5, Period: time.Minute},
			Penalty: algo.Penalty{After: 3, Within: time.Hour, Block: 5 * time.Minute}}
		got, err := algotest.ConcurrentOutcomes(context.Background(), []*memory.Store{s}, h, 400)
		if err != nil {
			t.Fatal(err)
		}
		if want := (algotest.Outcomes{Allowed: 5, Denied: 2, Started: 1, Blocked: 392}); got != want {
			t.Errorf("%v: %+v, want %+v", k, got, want)
		}
	}
}
