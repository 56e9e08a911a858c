package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
)

const hourFile = `domain: e2e
descriptors:
  - key: k
    rate_limit:
      name: per-k
      unit: hour
      requests_per_unit: %d
`

// TestLimitChangeMidWindow: a limit raised or lowered mid-window applies on
// the next request: the counter is not keyed by the limit (it keeps
// counting), and the Redis store's local over-limit cache is dropped on
// reload, so a denial cached under the old limit does not survive it
// (issue: config changes mid-window).
func TestLimitChangeMidWindow(t *testing.T) {
	// Hour windows: stay clear of the boundary.
	if left := time.Until(time.Now().Truncate(time.Hour).Add(time.Hour)); left < 30*time.Second {
		time.Sleep(left + time.Second)
	}
	for _, backend := range []string{"memory", "redis"} {
		t.Run(backend, func(t *testing.T) {
			dir := t.TempDir()
			writeFile(t, dir, "e2e.yaml", fmt.Sprintf(hourFile, 5))
			args := []string{"--config", dir}
			if backend == "redis" {
				redistest.Require(t)
				srv := redistest.Standalone(t)
				args = append(args, "--backend=redis", "--redis-url", srv.URL(), "--redis-timeout=1s", "--local-cache-size=100")
			}
			p := start(t, startOpts{args: args})
			cc := p.dial(t)
			p.waitServing(t, cc, "")

			take := func() *rlsv3.RateLimitResponse_DescriptorStatus {
				return call(t, cc, "e2e", desc("k", "x")).GetStatuses()[0]
			}
			for i := 0; i < 5; i++ {
				if s := take(); s.GetCode() != rlsv3.RateLimitResponse_OK {
					t.Fatalf("call %d: %v", i+1, s.GetCode())
				}
			}
			for i := 0; i < 2; i++ { // the second denial may come from the local cache
				if s := take(); s.GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
					t.Fatalf("6th/7th call: %v, want OVER_LIMIT", s.GetCode())
				}
			}

			reload(t, p, cc, dir, 10)
			s := take()
			if s.GetCode() != rlsv3.RateLimitResponse_OK || s.GetLimitRemaining() != 4 {
				t.Fatalf("after raising 5→10 with 5 used: %v remaining %d, want OK 4 (the counter kept counting; no stale denial)", s.GetCode(), s.GetLimitRemaining())
			}

			reload(t, p, cc, dir, 3)
			s = take()
			if s.GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT || s.GetLimitRemaining() != 0 {
				t.Fatalf("after lowering 10→3 with 6 used: %v remaining %d, want OVER_LIMIT 0", s.GetCode(), s.GetLimitRemaining())
			}
		})
	}
}

// reload writes a new limit and waits until a check-only call (hits_addend
// 0, consumes nothing) reports it.
func reload(t *testing.T, p *proc, cc *grpc.ClientConn, dir string, rpu uint32) {
	t.Helper()
	writeFile(t, dir, "e2e.yaml", fmt.Sprintf(hourFile, rpu))
	check := desc("k", "x")
	check.HitsAddend = wrapperspb.UInt64(0)
	eventually(t, settleWithin, func() string {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		resp, err := rlsv3.NewRateLimitServiceClient(cc).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "e2e", Descriptors: []*rlcommon.RateLimitDescriptor{check}})
		if err != nil {
			return err.Error()
		}
		if got := resp.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit(); got != rpu {
			return fmt.Sprintf("limit %d, want %d", got, rpu)
		}
		return ""
	})
}
