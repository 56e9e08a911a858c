package redise2e

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratelimitd/ratelimitd/pkg/backend/redis/redistest"
)

// burstRules is the fresh user's rule: 10 per minute, failure_mode left
// at its default (open).
const burstRules = `
domain: burst
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 10}
`

// TestFreshBurstDefaultOptions is a fresh user's first measurement: a new
// service instance with the default Redis options (10 ms timeout, default
// breaker; no warm-up call, so the first calls dial and load the script),
// then 50 goroutines × 20 sequential calls, each with a 5 s deadline, on
// one 10-per-minute key with failure_mode open. Exactly 10 are allowed
// and 990 denied: an OK beyond the 10 that Redis counted is an
// over-admission, failed open or not. MaxWait (1 s by default) is raised
// to the calls' 5 s so that each call's budget is its deadline, however
// slowly the machine schedules the burst.
func TestFreshBurstDefaultOptions(t *testing.T) {
	redistest.Require(t)
	srv := redistest.Standalone(t)
	// The 10/minute window must not turn over during the burst.
	if now := time.Now(); now.Truncate(time.Minute).Add(time.Minute).Sub(now) < 15*time.Second {
		time.Sleep(now.Truncate(time.Minute).Add(time.Minute).Sub(now) + 100*time.Millisecond)
	}
	o := standaloneOpts(srv.URL())
	o.MaxWait = 5 * time.Second
	in := newInstance(t, o, loadSet(t, burstRules))
	value := "u" + strconv.FormatInt(time.Now().UnixNano(), 36)
	r := req("burst", []string{"user", value})
	var ok, over atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range 50 {
		wg.Go(func() {
			<-start
			for range 20 {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				resp, err := in.svc.ShouldRateLimit(ctx, r)
				cancel()
				if err != nil {
					t.Errorf("ShouldRateLimit: %v", err)
					return
				}
				switch resp.GetOverallCode() {
				case rlsv3.RateLimitResponse_OK:
					ok.Add(1)
				case rlsv3.RateLimitResponse_OVER_LIMIT:
					over.Add(1)
				}
			}
		})
	}
	close(start)
	wg.Wait()
	failedOpen := counter(t, in.reg, "ratelimitd_decisions_total", map[string]string{"domain": "burst", "result": "failed_open"})
	t.Logf("50 goroutines × 20 calls on a 10/minute key, default options: %d OK (%v failed open), %d OVER_LIMIT; backend errors %v",
		ok.Load(), failedOpen, over.Load(), causes(t, in.reg))
	if ok.Load() != 10 || over.Load() != 990 {
		t.Errorf("%d OK (%v failed open), %d OVER_LIMIT; want exactly 10 OK and 990 OVER_LIMIT", ok.Load(), failedOpen, over.Load())
	}
}
