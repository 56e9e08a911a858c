package redis_test

import (
	"context"
	"fmt"
	"maps"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
)

// TestShareDemand: two stores (two replicas) share their streams' demand on
// a counter: in a round both see per stream its value of the previous round,
// else of the one before, else of this round (a new stream); older rounds
// are not returned, and each round's hash expires.
func TestShareDemand(t *testing.T) {
	srv := redistest.Standalone(t)
	a, b := newTestStore(t, srv, nil, 0), newTestStore(t, srv, nil, 0)
	checkShareDemand(t, a, b, func(key string) time.Duration {
		ttl, err := srv.Client().PTTL(context.Background(), "{"+key+"}:rlqs:7").Result()
		if err != nil {
			t.Fatal(err)
		}
		return ttl
	})
}

// TestShareDemandCluster: the same on Redis Cluster, where a counter's hashes
// of two rounds share its hash slot.
func TestShareDemandCluster(t *testing.T) {
	g := redistest.Cluster(t, 3)
	a, b := newClusterStore(t, g, nil), newClusterStore(t, g, nil)
	checkShareDemand(t, a, b, func(key string) time.Duration {
		ttl, err := g.Client().PTTL(context.Background(), "{"+key+"}:rlqs:7").Result()
		if err != nil {
			t.Fatal(err)
		}
		return ttl
	})
}

func checkShareDemand(t *testing.T, a, b *redis.Store, pttl func(string) time.Duration) {
	t.Helper()
	ctx := context.Background()
	share := func(s *redis.Store, key string, round int64, local map[string]int64) map[string]int64 {
		t.Helper()
		got, err := s.ShareDemand(ctx, round, 3*time.Second, map[string]map[string]int64{key: local})
		if err != nil {
			t.Fatal(err)
		}
		return got[key]
	}
	want := func(got, want map[string]int64) {
		t.Helper()
		if !maps.Equal(got, want) {
			t.Errorf("shared demand %v, want %v", got, want)
		}
	}
	const k = "counter-key"
	want(share(a, k, 6, map[string]int64{"a-1.1": 100, "a-2.1": -1}), map[string]int64{"a-1.1": 100, "a-2.1": -1})
	want(share(b, k, 6, map[string]int64{"b-1.1": 50}), map[string]int64{"a-1.1": 100, "a-2.1": -1, "b-1.1": 50})
	// Round 7 divides by round 6's numbers, whoever runs first.
	want(share(a, k, 7, map[string]int64{"a-1.1": 120}), map[string]int64{"a-1.1": 100, "a-2.1": -1, "b-1.1": 50})
	if ttl := pttl(k); ttl <= 0 || ttl > 3*time.Second {
		t.Errorf("round hash TTL %s, want in (0, 3s]", ttl)
	}
	// Round 8: round 7's numbers, else round 6's (b did not share in 7).
	want(share(b, k, 8, map[string]int64{"b-1.1": 60}), map[string]int64{"a-1.1": 120, "a-2.1": -1, "b-1.1": 50})
	// Round 9 no longer sees round 6: a-2.1 left after it.
	want(share(a, k, 9, nil), map[string]int64{"a-1.1": 120, "b-1.1": 60})
	// Another counter is separate.
	want(share(b, "other", 9, nil), map[string]int64{})
	// Many counters in one call (one pipeline), each its own view.
	many := map[string]map[string]int64{}
	for i := range 50 {
		many[fmt.Sprintf("k%d", i)] = map[string]int64{"a-1.1": int64(i)}
	}
	got, err := a.ShareDemand(ctx, 20, 3*time.Second, many)
	if err != nil {
		t.Fatal(err)
	}
	for k, l := range many {
		want(got[k], l)
	}
}

// TestShareDemandCallerDeadline: ShareDemand calls cut short by their
// caller's deadline (an RLQS join allows 20 ms) fail with CauseDeadline,
// which the circuit breaker counts as neither success nor failure, as
// Take's do: the caller's budget ran out, which is no evidence of a failed
// Redis.
func TestShareDemandCallerDeadline(t *testing.T) {
	srv := redistest.Standalone(t)
	o := redis.DefaultOptions()
	o.URL = srv.URL()
	o.Timeout = 3 * time.Second
	s := openStore(t, o)
	local := map[string]map[string]int64{"k": {"a-1.1": 1000}}
	if _, err := s.ShareDemand(context.Background(), 1, time.Minute, local); err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	t.Cleanup(func() {
		if srv.Alive() {
			srv.Cont()
		}
	})
	for i := range 10 {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		_, err := s.ShareDemand(ctx, int64(2+i), time.Minute, local)
		cancel()
		if redis.CauseOf(err) != redis.CauseDeadline {
			t.Fatalf("call %d, Redis frozen, caller's deadline 20 ms: %v (cause %q), want cause %q", i, err, redis.CauseOf(err), redis.CauseDeadline)
		}
		if st := s.BreakerState(); st != "closed" {
			t.Fatalf("breaker %s after %d calls cut by their callers' deadlines, want closed", st, i+1)
		}
	}
	srv.Cont()
}
