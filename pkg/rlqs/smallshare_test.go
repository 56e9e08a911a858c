package rlqs

import (
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
)

// TestSmallSharesKeepTwoTokens: 4 Envoys with demand 13 per second each
// on a limit of 50 per second, on Redis with leases. Each share is about
// 10 per second; a bucket of one token loses the refill while it is full
// between two requests, so the buckets keep minTokens (the lease scales
// the rates, not the buckets, when the store grants less than asked):
// from the fourth second on the fleet admits at least 80 % of the limit
// each second, on average at least 95 % of the limit less the buckets'
// tokens, and never more than the limit.
func TestSmallSharesKeepTwoTokens(t *testing.T) {
	const limit = 50
	srv := redistest.Standalone(t)
	clock := &fakeClock{t: time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)}
	o := redis.DefaultOptions()
	o.URL = srv.URL()
	o.Timeout = 2 * time.Second
	o.Now = clock.Now
	s, err := redis.New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	set := loadFleetPolicy(t, limit)
	f := &fleetRun{limit: limit, demand: []float64{13, 13, 13, 13}, duration: 20 * time.Second,
		replicas: []*Server{newReplica(t, s, s, clock, "a", set)}}
	res := f.run(t, clock)
	t.Logf("admitted per second: %v", res.admitted)
	var total int64
	for sec, a := range res.admitted {
		if a > limit {
			t.Errorf("second %d: admitted %d, over the limit of %d", sec, a, limit)
		}
		if sec >= 3 {
			total += a
			if a < limit*8/10 {
				t.Errorf("second %d: admitted %d, want >= %d (80 %% of the limit)", sec, a, limit*8/10)
			}
		}
	}
	// The rates share the limit less the buckets' tokens (full buckets
	// plus one window of the rates stay within the limit).
	avg := float64(total) / float64(len(res.admitted)-3)
	t.Logf("admitted %.1f per second from the fourth second on", avg)
	if want := 0.95 * float64(limit-4*minTokens); avg < want {
		t.Errorf("admitted %.1f per second on average, want >= %.1f (95 %% of the limit less 4 buckets of %d tokens)", avg, want, minTokens)
	}
	for _, e := range res.envoys {
		if tb := e.b.strategy.GetTokenBucket(); tb == nil || tb.GetMaxTokens() < minTokens {
			t.Errorf("last assignment %v, want a token bucket of at least %d tokens", e.b.strategy, minTokens)
		}
	}
}
