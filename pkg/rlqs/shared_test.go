package rlqs

import (
	"context"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/backend/memory"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
	"github.com/ratelimitd/ratelimitd/pkg/policy"
)

// TestRLQSAndShouldRateLimitShareOneLimit: ShouldRateLimit's hits and a
// simulated RLQS fleet on one rule (100 per second), through 2 replicas,
// each with its own Redis store on one redis-server. 4 Envoys with demand
// 100/s each, 2 per replica, and ShouldRateLimit hits at 100/s taken on
// both stores. The assignments are leases charged up front, so the hits
// see the Envoys' reserved budget at once: the two together admit no more
// than the limit per second, but for what a reservation made in one window
// lets the Envoys admit in the next (docs/rlqs.md): at most a tenth of the
// limit in any window after the first, and at most 2 % above the limit over
// the run.
func TestRLQSAndShouldRateLimitShareOneLimit(t *testing.T) {
	srv := redistest.Standalone(t)
	newStore := func(clock *fakeClock) *redis.Store {
		o := redis.DefaultOptions()
		o.URL = srv.URL()
		o.Timeout = 2 * time.Second
		o.Now = clock.Now
		s, err := redis.New(o)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s
	}
	shareOneLimit(t, func(clock *fakeClock) ([2]Store, [2]Demand) {
		a, b := newStore(clock), newStore(clock)
		return [2]Store{a, b}, [2]Demand{a, b}
	})
}

// TestRLQSAndShouldRateLimitShareOneLimitMemory is
// TestRLQSAndShouldRateLimitShareOneLimit on the memory store, which both
// replicas share (one process), as their demand: its leases count on the
// counter Take decides too, so the same bounds hold.
func TestRLQSAndShouldRateLimitShareOneLimitMemory(t *testing.T) {
	shareOneLimit(t, func(clock *fakeClock) ([2]Store, [2]Demand) {
		s, err := memory.New(memory.Options{Now: clock.Now})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		d := NewMemory()
		return [2]Store{s, s}, [2]Demand{d, d}
	})
}

// shareOneLimit runs the fleet of TestRLQSAndShouldRateLimitShareOneLimit
// on the stores and demands of two replicas.
func shareOneLimit(t *testing.T, newStores func(*fakeClock) ([2]Store, [2]Demand)) {
	const limit = 100
	clock := &fakeClock{t: time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)}
	set := loadFleetPolicy(t, limit)
	stores, demands := newStores(clock)
	m, ok := set.Match("edge", []policy.Entry{{Key: "api", Value: "search"}})
	if !ok {
		t.Fatal("no rule for api=search")
	}
	key, lim := set.Key(m, 0), m.Rule.Limits[0].Limit
	n := 0
	f := &fleetRun{limit: limit, demand: []float64{100, 100, 100, 100}, duration: 20 * time.Second,
		replicas: []*Server{newReplica(t, stores[0], demands[0], clock, "a", set), newReplica(t, stores[1], demands[1], clock, "b", set)},
		load: func(time.Time) int64 {
			// One ShouldRateLimit hit per tick (100/s), on each store in turn.
			n++
			d := make([]algo.Decision, 1)
			if err := stores[n%2].Take(context.Background(), []algo.Hit{{Key: key, Limit: lim, Cost: 1}}, d); err != nil {
				t.Fatal(err)
			}
			if d[0].Allowed {
				return 1
			}
			return 0
		}}
	res := f.run(t, clock)
	var total int64
	worst := int64(0)
	for s := range res.admitted {
		both := res.admitted[s] + res.loaded[s]
		total += both
		t.Logf("second %2d: RLQS %3d + ShouldRateLimit %3d = %3d (limit %d)", s, res.admitted[s], res.loaded[s], both, limit)
		if s > 0 {
			worst = max(worst, both)
			if both > limit+limit/10 {
				t.Errorf("second %d: admitted %d, more than the limit %d + 10 %%", s, both, limit)
			}
		}
	}
	runLimit := int64(limit * len(res.admitted))
	t.Logf("over the run: %d of %d (%+.2f %%); worst second after the first: %d", total, runLimit, 100*float64(total-runLimit)/float64(runLimit), worst)
	if total > runLimit+runLimit/50 {
		t.Errorf("over the run: admitted %d, more than the limit %d + 2 %%", total, runLimit)
	}
}
