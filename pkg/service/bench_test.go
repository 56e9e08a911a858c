package service_test

import (
	"context"
	"strconv"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratelimitd/ratelimitd/pkg/backend/memory"
)

// BenchmarkShouldRateLimit measures one in-process decision (no gRPC) on
// the load shape of scripts/bench.sh: scripts/bench/bench.yaml (one
// fixed-window limit per user, almost every decision OK), 10,000
// descriptor values, the memory backend, default options (IETF headers),
// metrics registered. allocs/op is the figure BENCHMARKS.md reports.
func BenchmarkShouldRateLimit(b *testing.B) {
	st, err := memory.New(memory.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = st.Close() })
	svc := newInProcess(b, st, nil)
	svc.SetPolicy(loadSet(b, "../../scripts/bench/bench.yaml"))
	reqs := make([]*rlsv3.RateLimitRequest, 10000)
	for i := range reqs {
		reqs[i] = req("bench", d("user", "user-"+strconv.Itoa(i)))
	}
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		resp, err := svc.ShouldRateLimit(ctx, reqs[i%len(reqs)])
		if err != nil {
			b.Fatal(err)
		}
		if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || len(resp.GetResponseHeadersToAdd()) == 0 {
			b.Fatalf("unexpected response %v", resp)
		}
	}
}
