package redis_test

import (
	"context"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/backend/memory"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
)

// leaser is what the lease tests need of a store.
type leaser interface {
	Lease(ctx context.Context, req algo.LeaseRequest) (algo.LeaseGrant, error)
}

var leaseLimits = []algo.Limit{
	{Kind: algo.FixedWindow, Rate: 50, Period: time.Second},
	{Kind: algo.SlidingWindow, Rate: 50, Period: time.Second},
	{Kind: algo.TokenBucket, Rate: 50, Period: time.Second, Burst: 20},
	{Kind: algo.TokenBucket, Rate: 7, Period: 3 * time.Second},
}

// leaseAgrees drives the same random lease operations (several
// subscribers, returns, demands, time passing across windows) through
// the Redis store and the memory store, whose Lease is algo.Lease under a
// lock, on one pinned clock, and fails on the first different grant.
func leaseAgrees(t *testing.T, s *redis.Store, clk *pinnedClock, key string) {
	ctx := context.Background()
	for _, l := range leaseLimits {
		t.Run(kindName(l), func(t *testing.T) {
			clk.Set(epoch0)
			ref, err := memory.New(memory.Options{Now: clk.Now, SweepInterval: -1})
			if err != nil {
				t.Fatal(err)
			}
			rng := rand.New(rand.NewPCG(uint64(l.Kind), uint64(l.Rate)))
			k := key + ":" + kindName(l) + ":" + l.Period.String()
			held := map[int64]int64{}
			for i := range 400 {
				clk.Advance(time.Duration(rng.Int64N(int64(l.Period/8))) + time.Microsecond)
				sub := 1 + rng.Int64N(3)
				ws, _ := algo.WindowBoundsUs(l, clk.Now().UnixMicro())
				req := algo.LeaseRequest{
					Key: k, Limit: l, Subscriber: sub, Demand: rng.Int64N(40),
					Want: rng.Int64N(30), Stale: l.Period.Microseconds() / 2,
				}
				if h := held[sub]; h > 0 && rng.IntN(3) == 0 {
					req.Return, req.ReturnWindow = 1+rng.Int64N(h), ws
				}
				want, err := ref.Lease(ctx, req)
				if err != nil {
					t.Fatal(err)
				}
				got, err := s.Lease(ctx, req)
				if err != nil {
					t.Fatalf("op %d: %v", i, err)
				}
				if got.Granted != want.Granted || got.Remaining != want.Remaining || got.Now != want.Now || !slices.Equal(got.Demands, want.Demands) {
					t.Fatalf("op %d %+v:\nredis  %+v\nmemory %+v", i, req, got, want)
				}
				held[sub] += got.Granted - req.Return
			}
		})
	}
}

func TestLeaseAgrees(t *testing.T) {
	redistest.Require(t)
	srv := redistest.Standalone(t)
	clk := newPinnedClock(epoch0)
	leaseAgrees(t, newTestStore(t, srv, clk.Now, 0), clk, "agree")
}

func TestLeaseAgreesCluster(t *testing.T) {
	redistest.Require(t)
	g := redistest.Cluster(t, 3)
	clk := newPinnedClock(epoch0)
	leaseAgrees(t, newClusterStore(t, g, clk.Now), clk, "agree")
}

// Many goroutines on three Stores lease from one fixed window on the
// server's clock: the units granted in each window never exceed the
// limit, and when asked for more, the whole limit is granted.
func TestLeaseConcurrentNeverAboveLimit(t *testing.T) {
	redistest.Require(t)
	srv := redistest.Standalone(t)
	stores := []*redis.Store{newTestStore(t, srv, nil, 0), newTestStore(t, srv, nil, 0), newTestStore(t, srv, nil, 0)}
	l := algo.Limit{Kind: algo.FixedWindow, Rate: 500, Period: time.Hour}
	var granted atomic.Int64
	var wg sync.WaitGroup
	for i := range 48 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := stores[i%3]
			for range 40 {
				g, err := s.Lease(context.Background(), algo.LeaseRequest{Key: "conc", Limit: l, Subscriber: int64(1 + i%3), Want: 7, Stale: 1e6})
				if err != nil {
					t.Error(err)
					return
				}
				granted.Add(g.Granted)
			}
		}()
	}
	wg.Wait()
	// 48*40*7 = 13440 units asked for: the window is exhausted (a
	// one-hour window may roll over once during the test; each window
	// is checked below).
	if n := granted.Load(); n < l.Rate {
		t.Fatalf("granted %d units of %d asked for, limit %d: want the whole limit", n, 48*40*7, l.Rate)
	}
	v, err := srv.Do(context.Background(), "KEYS", "{conc}:*")
	if err != nil {
		t.Fatal(err)
	}
	var total int64
	for _, k := range v.([]any) {
		if k.(string) == "{conc}:d" {
			continue
		}
		c, err := srv.Client().Get(context.Background(), k.(string)).Int64()
		if err != nil {
			t.Fatal(err)
		}
		if c > l.Rate {
			t.Fatalf("window key %s counts %d > limit %d", k, c, l.Rate)
		}
		total += c
	}
	if total != granted.Load() {
		t.Fatalf("window keys count %d, grants sum to %d", total, granted.Load())
	}
}
