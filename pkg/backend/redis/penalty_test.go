package redis_test

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/algo/algotest"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
)

// penaltyOutcomes runs 300 concurrent requests on a key admitting 5 with
// a penalty box of 3 denials over stores, every store on one pinned
// clock: exactly 5 admitted, 2 denied by the limit, 1 block started and
// 292 blocked, on every kind.
func penaltyOutcomes(t *testing.T, stores []*redis.Store, prefix string) {
	t.Helper()
	for _, k := range []algo.Kind{algo.FixedWindow, algo.SlidingWindow, algo.SlidingLog, algo.TokenBucket} {
		h := algo.Hit{Key: prefix + ":" + algotest.KindName(k), Cost: 1,
			Limit:   algo.Limit{Kind: k, Rate: 5, Period: time.Minute},
			Penalty: algo.Penalty{After: 3, Within: time.Hour, Block: 5 * time.Minute}}
		got, err := algotest.ConcurrentOutcomes(context.Background(), stores, h, 300)
		if err != nil {
			t.Fatal(err)
		}
		if want := (algotest.Outcomes{Allowed: 5, Denied: 2, Started: 1, Blocked: 292}); got != want {
			t.Errorf("%v: %+v, want %+v", k, got, want)
		}
	}
}

// TestPenaltyConcurrent: three Stores on one Redis decide the penalty
// box atomically with the limit (one block, never more admitted).
func TestPenaltyConcurrent(t *testing.T) {
	srv := redistest.Standalone(t)
	clock := newPinnedClock(epoch0)
	stores := []*redis.Store{newTestStore(t, srv, clock.Now, 0), newTestStore(t, srv, clock.Now, 0), newTestStore(t, srv, clock.Now, 0)}
	penaltyOutcomes(t, stores, "penalty")
}

// TestPenaltyConcurrentCluster is TestPenaltyConcurrent on a 3-master
// Cluster: the box's key is in its hit's slot.
func TestPenaltyConcurrentCluster(t *testing.T) {
	g := redistest.Cluster(t, 3)
	clock := newPinnedClock(epoch0)
	stores := []*redis.Store{newClusterStore(t, g, clock.Now), newClusterStore(t, g, clock.Now), newClusterStore(t, g, clock.Now)}
	penaltyOutcomes(t, stores, "penalty")
	// keys with no hash tag and with a '}' that is not one (the box's
	// key then takes a tag of the same slot)
	penaltyOutcomes(t, stores, "pen}alty")
	penaltyOutcomes(t, stores, "{pen}alty")
}

// TestPenaltyLocalCache: with the local over-limit cache on, a hit with a
// penalty box still reaches Redis when denied, so its denials count and
// the third one starts the block.
func TestPenaltyLocalCache(t *testing.T) {
	srv := redistest.Standalone(t)
	clock := newPinnedClock(epoch0)
	s := newTestStore(t, srv, clock.Now, 1000)
	h := algo.Hit{Key: "penalty:cached", Cost: 1,
		Limit:   algo.Limit{Kind: algo.FixedWindow, Rate: 2, Period: time.Hour},
		Penalty: algo.Penalty{After: 3, Within: time.Hour, Block: 5 * time.Minute}}
	var got []algo.PenaltyOutcome
	for range 5 {
		d, err := algotest.Take(context.Background(), s, []algo.Hit{h})
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, d[0].Penalty)
		clock.Advance(time.Second)
	}
	want := []algo.PenaltyOutcome{algo.PenaltyNone, algo.PenaltyNone, algo.PenaltyNone, algo.PenaltyNone, algo.PenaltyStarted}
	if !slices.Equal(got, want) {
		t.Errorf("outcomes %v, want %v", got, want)
	}
}

// BenchmarkPenaltyTake: one-hit requests on one Store, without and with
// a penalty box (the box routes the hit from take1.lua to take.lua and
// reads one more key), 8 goroutines.
func BenchmarkPenaltyTake(b *testing.B) {
	srv := redistest.Standalone(b)
	s := newTestStore(b, srv, nil, 0)
	l := algo.Limit{Kind: algo.TokenBucket, Rate: 1 << 40, Period: time.Second}
	for _, c := range []struct {
		name string
		box  algo.Penalty
	}{
		{"plain", algo.Penalty{}},
		{"penalty", algo.Penalty{After: 3, Within: time.Hour, Block: 5 * time.Minute}},
	} {
		b.Run(c.name, func(b *testing.B) {
			var n atomic.Int64
			b.SetParallelism(8)
			b.RunParallel(func(pb *testing.PB) {
				out := make([]algo.Decision, 1)
				for pb.Next() {
					h := algo.Hit{Key: fmt.Sprintf("bench:%s:%d", c.name, n.Add(1)%1024), Limit: l, Cost: 1, Penalty: c.box}
					if err := s.Take(context.Background(), []algo.Hit{h}, out); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}
