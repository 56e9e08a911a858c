package redise2e

import (
	"context"
	"strconv"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
)

// TestDecideAllocsRedis bounds the heap allocations of one ShouldRateLimit
// decision on the Redis store, as TestDecideAllocs (pkg/service) does on
// memory: in process, default options, one existing fixed-window key, one
// caller at a time. Every goroutine's allocations count (the service,
// the Store's flush loop, go-redis). The bound is the window.lua path's
// count plus one; a change that raises it is a regression to explain.
func TestDecideAllocsRedis(t *testing.T) {
	redistest.Require(t)
	srv := redistest.Standalone(t)
	in := newInstance(t, generous(standaloneOpts(srv.URL())), loadSet(t, `domain: allocs
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 1000000000}
`))
	warm(t, []*instance{in})
	reqs := make([]*rlsv3.RateLimitRequest, 16)
	for i := range reqs {
		reqs[i] = req("allocs", []string{"user", "u" + strconv.Itoa(i)})
	}
	ctx := context.Background()
	decide := func(r *rlsv3.RateLimitRequest) {
		resp, err := in.svc.ShouldRateLimit(ctx, r)
		if err != nil || !isOK(resp) || len(resp.GetStatuses()) != 1 {
			t.Fatalf("ShouldRateLimit: %v, %v", resp, err)
		}
	}
	for _, r := range reqs { // every key exists before counting
		decide(r)
	}
	i := 0
	n := testing.AllocsPerRun(500, func() {
		decide(reqs[i%len(reqs)])
		i++
	})
	t.Logf("%v allocations per decision", n)
	const bound = 10
	if n > bound {
		t.Errorf("%v allocations per decision on the Redis store, want at most %v", n, bound)
	}
	if c := causes(t, in.reg); len(c) != 0 {
		t.Errorf("backend errors during the count: %v", c)
	}
}
