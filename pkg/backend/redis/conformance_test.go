package redis_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/algo/algotest"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
)

func newClusterStore(t testing.TB, g *redistest.ClusterGroup, now func() time.Time) *redis.Store {
	t.Helper()
	o := redis.DefaultOptions()
	o.Mode = redis.Cluster
	o.URL = ""
	o.Addrs = g.Addrs()
	o.Timeout = 2 * time.Second
	o.DialTimeout = 2 * time.Second
	// A call without a deadline may wait this long (its budget) on a
	// starved host, as newTestStore's: its first call also loads the
	// cluster's slots and scripts. These tests check decisions.
	o.MaxWait = stateWithin
	o.PoolSize = 8
	o.Now = now
	o.WindowKeys = false // take.lua's layout, as newTestStore
	return openStore(t, o)
}

// slotKeys returns n keys with pairwise different hash slots on different
// masters of a 3-master cluster (slots are split evenly in thirds).
func slotKeys(prefix string, n int) []string {
	var out []string
	seen := map[uint16]bool{}
	for i := 0; len(out) < n; i++ {
		k := fmt.Sprintf("%s:%d", prefix, i)
		third := redis.Slot(k) / 5462
		if !seen[third] {
			seen[third] = true
			out = append(out, k)
		}
	}
	return out
}

// TestCluster runs against a 3-master Redis Cluster: exactness under
// concurrency across three Stores, and requests whose keys span slots
// (never CROSSSLOT; all-or-nothing through the compensating refund).
func TestCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node cluster")
	}
	g := redistest.Cluster(t, 3)
	ctx := context.Background()

	t.Run("exactness", func(t *testing.T) {
		stores := []*redis.Store{newClusterStore(t, g, nil), newClusterStore(t, g, nil), newClusterStore(t, g, nil)}
		l := algo.Limit{Kind: algo.SlidingLog, Rate: 30, Period: time.Minute}
		if n := concurrentAllowed(t, stores, "cluster:shared", l, 60); n != 30 {
			t.Fatalf("allowed %d of 60, want exactly 30", n)
		}
	})

	t.Run("cross-slot all-or-nothing", func(t *testing.T) {
		for _, l := range allKinds() {
			t.Run(kindName(l), func(t *testing.T) {
				clk := newPinnedClock(epoch0)
				s := newClusterStore(t, g, clk.Now)
				ks := slotKeys("xs:"+kindName(l), 3)
				blocker := algo.Hit{Key: ks[2], Limit: algo.Limit{Kind: algo.FixedWindow, Rate: 1, Period: time.Hour}, Cost: 1}
				if _, err := algotest.Take(ctx, s, []algo.Hit{blocker}); err != nil {
					t.Fatal(err)
				}
				hits := []algo.Hit{{Key: ks[0], Limit: l, Cost: 2}, {Key: ks[1], Limit: l, Cost: 1}, blocker}
				d, err := algotest.Take(ctx, s, hits)
				if err != nil {
					t.Fatalf("cross-slot take: %v", err)
				}
				if !d[0].Allowed || !d[1].Allowed || d[2].Allowed {
					t.Fatalf("decisions %+v: want the blocker denied, the others not", d)
				}
				if d[0].Remaining != 3 || d[1].Remaining != 3 {
					t.Errorf("refunded hits report remaining %d and %d, want 3 and 3 (values before the request)", d[0].Remaining, d[1].Remaining)
				}
				for _, k := range ks[:2] {
					n, err := g.Client().Exists(ctx, k).Result()
					if err != nil {
						t.Fatal(err)
					}
					if n != 0 {
						t.Errorf("key %s exists after the refund of a denied request", k)
					}
					d, err := algotest.Take(ctx, s, []algo.Hit{{Key: k, Limit: l, Cost: 3}})
					if err != nil {
						t.Fatal(err)
					}
					if !d[0].Allowed || d[0].Remaining != 0 {
						t.Errorf("%s after the refund: %+v, want the full 3 available", k, d[0])
					}
				}
				// An allowed cross-slot request consumes in every slot.
				clk.Advance(time.Hour)
				d, err = algotest.Take(ctx, s, []algo.Hit{{Key: ks[0] + "b", Limit: l, Cost: 1}, {Key: ks[1] + "b", Limit: l, Cost: 2}, {Key: ks[2] + "b", Limit: l, Cost: 3}})
				if err != nil {
					t.Fatal(err)
				}
				for i, want := range []int64{2, 1, 0} {
					if !d[i].Allowed || d[i].Remaining != want {
						t.Errorf("allowed cross-slot hit %d: %+v, want remaining %d", i, d[i], want)
					}
				}
			})
		}
	})
}

// TestConformance runs the shared conformance tables (the same the memory
// store runs) against a real redis-server, with the script's clock pinned
// to the suite's.
func TestConformance(t *testing.T) {
	srv := redistest.Standalone(t)
	algotest.Run(t, func(t *testing.T, now func() time.Time) algotest.Store {
		return newTestStore(t, srv, now, 0)
	})
}

// TestConformanceCluster runs the same tables through a 3-master Redis
// Cluster: every table's keys are spread over slots, so multi-hit steps
// go through slot grouping and the compensating refund.
func TestConformanceCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node cluster")
	}
	g := redistest.Cluster(t, 3)
	algotest.Run(t, func(t *testing.T, now func() time.Time) algotest.Store {
		return newClusterStore(t, g, now)
	})
}
