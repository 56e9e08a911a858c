package redis_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/pkg/algo"
	"github.com/ratelimitd/ratelimitd/pkg/algo/algotest"
	"github.com/ratelimitd/ratelimitd/pkg/backend/causes"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis"
	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
)

// TestClusterDeniedGroupDecidesFailedRequest: with one Cluster master
// killed, a request with a hit on a live master over its limit and a hit
// on the dead master is denied by the live master: Take returns a
// *causes.Partial whose decisions deny the live hit and whose failed index
// is the dead hit, and nothing is consumed. A request whose live hit is
// within its limit fails as a whole (a plain error) and its live hit is
// refunded.
func TestClusterDeniedGroupDecidesFailedRequest(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node cluster: -short")
	}
	const limit = 3
	g := redistest.Cluster(t, 3, redistest.WithArgs("--cluster-require-full-coverage", "no"))
	o := redis.DefaultOptions()
	o.Mode = redis.Cluster
	o.URL = ""
	o.Addrs = g.Addrs()
	s := openStore(t, o)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := s.Warm(ctx); err != nil {
		t.Fatalf("Warm: %v", err)
	}
	keysOf := masterKeys(t, g)
	victim, live := g.Nodes[1], g.Nodes[0]
	full, fresh := keysOf[live.Addr()]("full", 1)[0], keysOf[live.Addr()]("fresh", 1)[0]
	dead := keysOf[victim.Addr()]("dead", 1)[0]
	l := algo.Limit{Kind: algo.FixedWindow, Rate: limit, Period: time.Hour}
	for range limit {
		if d, err := algotest.Take(ctx, s, []algo.Hit{{Key: full, Limit: l, Cost: 1}}); err != nil || !d[0].Allowed {
			t.Fatalf("filling %s: %v %v", full, d, err)
		}
	}
	victim.Kill()

	var p *causes.Partial
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, err := algotest.Take(ctx, s, []algo.Hit{{Key: full, Limit: l, Cost: 1}, {Key: dead, Limit: l, Cost: 1}})
		if errors.As(err, &p) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("mixed request over the live limit: %v, want a *causes.Partial", err)
		}
	}
	if len(p.Decisions) != 2 || p.Decisions[0].Allowed || !slices.Equal(p.Failed, []int{1}) {
		t.Fatalf("Partial: decisions %+v failed %v; want the live hit denied and hit 1 failed", p.Decisions, p.Failed)
	}
	if c := redis.CauseOf(p); c == "" || c == "other" {
		t.Errorf("the Partial's cause is %q, want the dead master's (refused, circuit_open, ...)", c)
	}

	// Within the live limit: the request fails as a whole, and the live hit
	// is refunded (the key still admits exactly limit).
	_, err := algotest.Take(ctx, s, []algo.Hit{{Key: fresh, Limit: l, Cost: 1}, {Key: dead, Limit: l, Cost: 1}})
	if err == nil || errors.As(err, &p) {
		t.Fatalf("mixed request within the live limit: %v, want a plain error", err)
	}
	// The refund runs in the background: wait (check-only takes, which
	// consume nothing) until the key shows its whole limit again.
	for until := time.Now().Add(20 * time.Second); ; {
		d, err := algotest.Take(ctx, s, []algo.Hit{{Key: fresh, Limit: l, Cost: 0}})
		if err == nil && d[0].Remaining == limit {
			break
		}
		if time.Now().After(until) {
			t.Fatalf("%s not refunded after a failed mixed request: %v %v", fresh, d, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	admitted := 0
	for range limit + 2 {
		d, err := algotest.Take(ctx, s, []algo.Hit{{Key: fresh, Limit: l, Cost: 1}})
		if err != nil {
			t.Fatal(err)
		}
		if d[0].Allowed {
			admitted++
		}
	}
	if admitted != limit {
		t.Errorf("%s admitted %d of %d after a failed mixed request, want %d (its take refunded)", fresh, admitted, limit+2, limit)
	}
}
